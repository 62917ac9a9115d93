#include "models/common/vit.h"

#include <cmath>
#include <cstring>

#include "core/checked.h"
#include "flowkv/error.h"
#include "flowkv/limits.h"
#include "models/common/blocks.h"
#include "ops/attention.h"
#include "ops/ops.h"

namespace flowkv::vit {

PatchPos merge_block_pos(int64_t k, int64_t w, int64_t m) {
  const int64_t blocks_w = w / m;
  const int64_t in_col = k % m, in_row = (k / m) % m;
  const int64_t block_col = (k / (m * m)) % blocks_w, block_row = k / (m * m * blocks_w);
  return {block_row * m + in_row, block_col * m + in_col};
}

std::vector<float> axial_inv_freq(int64_t head_dim, double theta) {
  const int64_t spatial = head_dim / 2;
  std::vector<float> inv;
  for (int64_t i = 0; i < spatial; i += 2) {
    const float e = static_cast<float>(i) / static_cast<float>(spatial);
    const auto p = static_cast<float>(std::pow(theta, double{e}));
    inv.push_back(1.0f / p);
  }
  return inv;
}

void axial_rope_row(const std::vector<float>& inv_freq, PatchPos p, float* cos, float* sin) {
  const auto quarter = static_cast<int64_t>(inv_freq.size());
  for (int64_t i = 0; i < quarter; ++i) {
    const float fh = static_cast<float>(p.row) * inv_freq[i];
    const float fw = static_cast<float>(p.col) * inv_freq[i];
    cos[i] = cos[2 * quarter + i] = std::cos(fh);
    sin[i] = sin[2 * quarter + i] = std::sin(fh);
    cos[quarter + i] = cos[3 * quarter + i] = std::cos(fw);
    sin[quarter + i] = sin[3 * quarter + i] = std::sin(fw);
  }
}

void apply_rope(Mat x, int64_t heads, int64_t hd, const float* cos, const float* sin) {
  const int64_t half = hd / 2;
  for_rows(x.rows, [&](int64_t i) {
    const float* cs = cos + i * hd;
    const float* sn = sin + i * hd;
    for (int64_t h = 0; h < heads; ++h) {
      float* v = x.row(i) + h * hd;
      for (int64_t j = 0; j < half; ++j) {
        const float a = v[j], b = v[j + half];
        v[j] = a * cs[j] - b * sn[j];
        v[j + half] = b * cs[j + half] + a * sn[j + half];
      }
    }
  });
}

void segment_attention(const ExecContext& ctx, Mat qkv, Mat out, int64_t heads, int64_t hd,
                       std::span<const int64_t> seg) {
  const int64_t H = heads * hd;
  for (size_t s = 0; s + 1 < seg.size(); ++s) {
    const int64_t r0 = seg[s], len = seg[s + 1] - r0;
    if (len == 0) continue;
    Mat rows = qkv.rows_slice(r0, len);
    const ops::KVSource kv =
        ops::KVSource::f32(rows.cols_slice(H, H), rows.cols_slice(2 * H, H), len);
    const ops::AttnShape shape{.batch = 1, .heads = heads, .head_dim = hd, .seq_q = len};
    ops::attention(ctx, shape, rows.cols_slice(0, H), {&kv, 1}, out.rows_slice(r0, len));
  }
}

int64_t check_pixels_and_grids(const std::string& what, const Tensor& pv, int64_t patch_dim,
                               const std::string& patch_desc, std::span<const Grid> grid,
                               int64_t m) {
  FLOWKV_CHECK(pv.defined() && pv.dtype() == DType::kF32 && pv.ndim() == 2, what,
               ": pixel_values must be a 2-D f32 tensor [patches, ", patch_dim, "]");
  FLOWKV_CHECK(pv.dim(1) == patch_dim, what, ": pixel_values rows are ", pv.dim(1),
               " wide; this tower's patches hold ", patch_dim, " values (", patch_desc, ")");
  FLOWKV_CHECK(!grid.empty(), what, ": no image grid given");
  int64_t n = 0;
  for (size_t i = 0; i < grid.size(); ++i) {
    const auto& g = grid[i];
    FLOWKV_CHECK(g[0] >= 1 && g[1] >= 1 && g[2] >= 1 && g[0] <= limits::kMaxTokens &&
                     g[1] <= limits::kMaxTokens && g[2] <= limits::kMaxTokens,
                 what, ": grid_thw[", i, "] = {", g[0], ", ", g[1], ", ", g[2],
                 "} is not a positive grid");
    FLOWKV_CHECK(g[1] % m == 0 && g[2] % m == 0, what, ": grid_thw[", i, "] = {", g[0], ", ", g[1],
                 ", ", g[2], "}: height and width must be multiples of ", "spatial_merge_size ", m);
    n = checked_add(n, checked_mul(checked_mul(g[0], g[1], "grid"), g[2], "grid"), "grid");
    FLOWKV_CHECK(n <= limits::kMaxTokens, what, ": more than ", limits::kMaxTokens, " patches");
  }
  FLOWKV_CHECK(n == pv.dim(0), what, ": the grids hold ", n, " patches but pixel_values has ",
               pv.dim(0), " rows");
  return n;
}

void embed_patches(const ExecContext& ctx, const ops::Linear& proj, const Tensor& pixel_values,
                   bool bf16, Mat x) {
  Mat pv = make_mat(const_cast<float*>(pixel_values.f32()), x.rows, pixel_values.dim(1));
  if (bf16) {
    ArenaScope s(*ctx.arena);
    Mat p16 = alloc_mat(*ctx.arena, pv.rows, pv.cols);
    copy_rows(pv, p16);
    ops::round_bf16(ctx, p16);
    proj.forward(ctx, p16, x);
    ops::round_bf16(ctx, x);
  } else {
    proj.forward(ctx, pv, x);
  }
}

void trace(const ExecContext& ctx, const std::string& name, Mat m) {
  if (!ctx.tracer || !ctx.tracer->wants(name)) return;
  Tensor t = Tensor::empty({m.rows, m.cols});
  for (int64_t r = 0; r < m.rows; ++r) {
    std::memcpy(t.f32() + r * m.cols, m.row(r), static_cast<size_t>(m.cols) * sizeof(float));
  }
  ctx.tracer->record(name, t);
}

std::map<std::string, TensorInfo> under_prefix(const std::map<std::string, TensorInfo>& t,
                                               const std::string& prefix) {
  std::map<std::string, TensorInfo> out;
  for (const auto& [name, info] : t) {
    if (name.rfind(prefix, 0) == 0) out.emplace(name, info);
  }
  return out;
}

std::vector<int64_t> mrope_positions(std::span<const int32_t> ids, std::span<const Grid> grids,
                                     int64_t image_token_id, int64_t video_token_id, int64_t merge,
                                     const std::string& what) {
  const int64_t L = static_cast<int64_t>(ids.size());
  FLOWKV_CHECK(L <= limits::kMaxTokens, what, " positions: ", L, " tokens exceed the limit of ",
               limits::kMaxTokens);
  const int64_t m = merge;
  std::vector<int64_t> pos(static_cast<size_t>(3 * L));
  int64_t cur = 0, i = 0;
  size_t g = 0;
  while (i < L) {
    const bool image = ids[i] == image_token_id;
    int64_t j = i;
    while (j < L && (ids[j] == image_token_id) == image) {
      FLOWKV_CHECK(ids[j] != video_token_id, what, " positions: token ", j,
                   " is <|video_pad|> (id ", video_token_id, "): videos are not supported");
      ++j;
    }
    if (!image) {
      for (int64_t k = i; k < j; ++k) {
        for (int a = 0; a < 3; ++a) pos[a * L + k] = cur + (k - i);
      }
      cur += j - i;
      i = j;
      continue;
    }
    FLOWKV_CHECK(g < grids.size(), what, " positions: image placeholder run ", g + 1, " (tokens ",
                 i, "..", j - 1, ") has no image grid: ", grids.size(), " grid(s) given");
    const Grid& grid = grids[g];
    for (int a = 0; a < 3; ++a) {
      FLOWKV_CHECK(grid[a] >= 1 && grid[a] <= limits::kMaxTokens, what, " positions: image ", g + 1,
                   " grid (", grid[0], ", ", grid[1], ", ", grid[2], ") has a size outside [1, ",
                   limits::kMaxTokens, "]");
    }
    FLOWKV_CHECK(grid[1] % m == 0 && grid[2] % m == 0, what, " positions: image ", g + 1, " grid (",
                 grid[0], ", ", grid[1], ", ", grid[2],
                 ") is not a multiple of the spatial merge size ", m, " in h and w");
    const int64_t gt = grid[0], gh = grid[1] / m, gw = grid[2] / m;
    const int64_t n = checked_mul(checked_mul(gt, gh, "image grid"), gw, "image grid");
    FLOWKV_CHECK(j - i == n, what, " positions: image ", g + 1, " has ", j - i,
                 " <|image_pad|> tokens, its grid (", grid[0], ", ", grid[1], ", ", grid[2],
                 ") makes ", n);
    for (int64_t ti = 0; ti < gt; ++ti) {
      for (int64_t hi = 0; hi < gh; ++hi) {
        for (int64_t wi = 0; wi < gw; ++wi) {
          const int64_t k = i + (ti * gh + hi) * gw + wi;
          pos[k] = cur + ti;
          pos[L + k] = cur + hi;
          pos[2 * L + k] = cur + wi;
        }
      }
    }
    cur += std::max(grid[1], grid[2]) / m;
    ++g;
    i = j;
  }
  FLOWKV_CHECK(g == grids.size(), what, " positions: ", grids.size(),
               " image grid(s) given, but the ids hold ", g, " run(s) of <|image_pad|> tokens");
  return pos;
}

}  // namespace flowkv::vit
