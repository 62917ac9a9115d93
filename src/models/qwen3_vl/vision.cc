// The Qwen3-VL vision tower: loading (tensors under the prefix checked against the name table,
// then the linear layers built) and the forward (transformers modeling_qwen3_vl.py,
// Qwen3VLVisionModel.forward). Activations are [N, C] matrices, N = patches of all images.
#include "models/qwen3_vl/vision.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>

#include "core/checked.h"
#include "core/memory.h"
#include "core/parallel.h"
#include "flowkv/error.h"
#include "flowkv/limits.h"
#include "io/mapped_file.h"
#include "models/common/blocks.h"
#include "models/qwen3_vl/vision_weights.h"
#include "ops/attention.h"
#include "ops/linear.h"
#include "ops/ops.h"

namespace flowkv::qwen3_vl {

namespace {

constexpr float kNormEps = 1e-6f;  // every LayerNorm of the tower (nn.LayerNorm(..., eps=1e-6))

struct Norm {
  std::vector<float> w, b;
};

struct BlockWeights {
  Norm norm1, norm2;
  ops::Linear qkv, proj, fc1, fc2;  // with biases
};

struct MergerWeights {
  bool postshuffle = false;
  Norm norm;
  ops::Linear fc1, fc2;
};

}  // namespace

struct VisionTower::Weights {
  VisionConfig cfg;
  DType compute = DType::kF32;
  ops::Linear patch_embed;  // Conv3d as [hidden, C*T*P*P], with bias
  std::vector<float> pos;   // [num_position_embeddings, hidden] f32
  std::vector<BlockWeights> blocks;
  MergerWeights merger;
  std::vector<MergerWeights> deepstack;
  std::vector<float> inv_freq;  // head_dim / 4 frequencies of the axial RoPE
};

namespace {

namespace fs = std::filesystem;

std::vector<float> vec(const Tensor& t) {
  const Tensor f = t.to_f32();
  return std::vector<float>(f.f32(), f.f32() + f.numel());
}

// Only the tensors under the prefix: the checkpoint also holds the language model.
std::map<std::string, TensorInfo> under_prefix(const std::map<std::string, TensorInfo>& t,
                                               const std::string& prefix) {
  std::map<std::string, TensorInfo> out;
  for (const auto& [name, info] : t) {
    if (name.rfind(prefix, 0) == 0) out.emplace(name, info);
  }
  return out;
}

bool is_linear_weight(const ExpectedTensor& e) {
  return e.shape.size() >= 2 && e.name.find("pos_embed") == std::string::npos;
}

DType choose_compute(const std::map<std::string, TensorInfo>& tensors,
                     const std::vector<ExpectedTensor>& table, const VisionLoadOptions& opts) {
  if (!opts.auto_dtype) return opts.compute;
  for (const ExpectedTensor& e : table) {
    if (!is_linear_weight(e)) continue;
    const TensorInfo& t = tensors.at(e.name);
    if (!t.dtype_known || t.dtype != DType::kBF16) return DType::kF32;
  }
  return DType::kBF16;
}

// transformers' axial inv_freq: 1 / theta^(arange(0, hd/2, 2) / (hd/2)), in f32.
std::vector<float> axial_inv_freq(const VisionConfig& c) {
  const int64_t spatial = c.head_dim() / 2;
  std::vector<float> inv;
  for (int64_t i = 0; i < spatial; i += 2) {
    const float e = static_cast<float>(i) / static_cast<float>(spatial);
    const auto p = static_cast<float>(std::pow(c.rope_theta, double{e}));
    inv.push_back(1.0f / p);
  }
  return inv;
}

// Row `r`, column `c` of token k of an image's frame, in merge-block order (the inverse of the
// processor's patch order, as transformers' vision_utils decodes it).
struct Pos {
  int64_t row, col;
};
Pos token_pos(int64_t k, int64_t w, int64_t m) {
  const int64_t blocks_w = w / m;
  const int64_t in_col = k % m, in_row = (k / m) % m;
  const int64_t block_col = (k / (m * m)) % blocks_w, block_row = k / (m * m * blocks_w);
  return {block_row * m + in_row, block_col * m + in_col};
}

// One axis of the align_corners bilinear resampling of the side x side table to `size`
// positions (transformers' _interpolation_axis_taps_weights, bilinear, border), in f32.
void axis_taps(int64_t index, int64_t size, int64_t side, int64_t taps[2], float weights[2]) {
  const float src = static_cast<float>(index) * static_cast<float>(side - 1) /
                    static_cast<float>(std::max<int64_t>(size - 1, 1));
  const float fl = std::floor(src);
  for (int o = 0; o < 2; ++o) {
    const auto raw = static_cast<int64_t>(fl) + o;
    taps[o] = std::clamp<int64_t>(raw, 0, side - 1);
    const float dist = std::abs(src - fl - static_cast<float>(o));
    weights[o] = std::max(1.0f - dist, 0.0f);
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

// Everything one forward shares.
struct Run {
  const ExecContext& ec;
  const VisionTower::Weights& w;
  Arena& ws;
  int64_t N, H, heads, hd, F;
  bool bf16;
  const float* cos = nullptr;  // [N, hd]
  const float* sin = nullptr;
  std::vector<int64_t> seg;  // attention segments: row offsets, N at the end
};

void round_if_bf16(const Run& r, Mat m) {
  if (r.bf16) ops::round_bf16(r.ec, m);
}

// fn(r) for every row, in tasks of rows fixed by the shape (results never depend on threads).
template <class Fn>
void for_rows(int64_t rows, Fn&& fn) {
  constexpr int64_t kRowsPerTask = 64;
  parallel_for((rows + kRowsPerTask - 1) / kRowsPerTask, [&](int64_t t) {
    for (int64_t r = t * kRowsPerTask; r < std::min(rows, (t + 1) * kRowsPerTask); ++r) fn(r);
  });
}

// y = LayerNorm(x) * weight + bias.
void layer_norm(const Run& r, Mat x, const Norm& n, Mat y) {
  ops::layer_norm_modulate(r.ec, x, y, {}, {}, kNormEps);
  for_rows(y.rows, [&](int64_t i) {
    float* v = y.row(i);
    for (int64_t c = 0; c < y.cols; ++c) v[c] = v[c] * n.w[c] + n.b[c];
  });
}

// apply_rotary_pos_emb_vision on one [N, heads * hd] slice: x*cos + rotate_half(x)*sin, per head.
void apply_rope(const Run& r, Mat x) {
  const int64_t hd = r.hd, half = hd / 2;
  for_rows(x.rows, [&](int64_t i) {
    const float* cs = r.cos + i * hd;
    const float* sn = r.sin + i * hd;
    for (int64_t h = 0; h < r.heads; ++h) {
      float* v = x.row(i) + h * hd;
      for (int64_t j = 0; j < half; ++j) {
        const float a = v[j], b = v[j + half];
        v[j] = a * cs[j] - b * sn[j];
        v[j + half] = b * cs[j + half] + a * sn[j + half];
      }
    }
  });
}

void activation(const Run& r, Mat x) {
  if (r.w.cfg.hidden_act == "gelu") {
    ops::gelu_erf(r.ec, x);
  } else {
    ops::gelu_tanh(r.ec, x);
  }
}

// Qwen3VLVisionBlock: x += proj(attn(rope(qkv(norm1 x)))); x += fc2(act(fc1(norm2 x))).
void block(const Run& r, const BlockWeights& b, Mat x) {
  ArenaScope scope(r.ws);
  Mat n = alloc_mat(r.ws, r.N, r.H), qkv = alloc_mat(r.ws, r.N, 3 * r.H);
  Mat attn = alloc_mat(r.ws, r.N, r.H), y = alloc_mat(r.ws, r.N, r.H);
  layer_norm(r, x, b.norm1, n);
  round_if_bf16(r, n);
  b.qkv.forward(r.ec, n, qkv);
  round_if_bf16(r, qkv);
  apply_rope(r, qkv.cols_slice(0, r.H));
  apply_rope(r, qkv.cols_slice(r.H, r.H));
  round_if_bf16(r, qkv);
  // Attention within each segment (cu_seqlens: one per image frame).
  for (size_t s = 0; s + 1 < r.seg.size(); ++s) {
    const int64_t r0 = r.seg[s], len = r.seg[s + 1] - r0;
    Mat rows = qkv.rows_slice(r0, len);
    const ops::KVSource kv =
        ops::KVSource::f32(rows.cols_slice(r.H, r.H), rows.cols_slice(2 * r.H, r.H), len);
    const ops::AttnShape shape{.batch = 1, .heads = r.heads, .head_dim = r.hd, .seq_q = len};
    ops::attention(r.ec, shape, rows.cols_slice(0, r.H), {&kv, 1}, attn.rows_slice(r0, len));
  }
  round_if_bf16(r, attn);
  b.proj.forward(r.ec, attn, y);
  round_if_bf16(r, y);
  ops::gated_add(r.ec, x, y, {});
  round_if_bf16(r, x);

  ArenaScope mlp(r.ws);
  Mat f = alloc_mat(r.ws, r.N, r.F);
  layer_norm(r, x, b.norm2, n);
  round_if_bf16(r, n);
  b.fc1.forward(r.ec, n, f);
  round_if_bf16(r, f);
  activation(r, f);
  round_if_bf16(r, f);
  b.fc2.forward(r.ec, f, y);
  round_if_bf16(r, y);
  ops::gated_add(r.ec, x, y, {});
  round_if_bf16(r, x);
}

// Qwen3VLVisionPatchMerger: LayerNorm before (final merger) or after (deepstack) the
// merge_size^2 -> 1 shuffle, then fc2(GELU(fc1)), GELU with erf. Returns [N/m^2, out].
Tensor merge(const Run& r, const MergerWeights& m, Mat x) {
  ArenaScope scope(r.ws);
  const int64_t u = r.w.cfg.merge_unit(), rows = r.N / u, width = r.H * u;
  Mat n = alloc_mat(r.ws, r.N, r.H);
  Mat shuffled = make_mat(n.data, rows, width);  // consecutive m^2 tokens form one row
  if (m.postshuffle) {
    layer_norm(r, make_mat(x.data, rows, width), m.norm, shuffled);
  } else {
    layer_norm(r, x, m.norm, n);
  }
  round_if_bf16(r, shuffled);
  Mat h = alloc_mat(r.ws, rows, width);
  m.fc1.forward(r.ec, shuffled, h);
  round_if_bf16(r, h);
  ops::gelu_erf(r.ec, h);
  round_if_bf16(r, h);
  Tensor out = Tensor::empty({rows, r.w.cfg.out_hidden_size});
  Mat o = make_mat(out.f32(), rows, r.w.cfg.out_hidden_size);
  m.fc2.forward(r.ec, h, o);
  round_if_bf16(r, o);
  return out;
}

void check_inputs(const VisionConfig& c, const Tensor& pv,
                  const std::vector<std::array<int64_t, 3>>& grid) {
  FLOWKV_CHECK(pv.defined() && pv.dtype() == DType::kF32 && pv.ndim() == 2,
               "qwen3-vl vision: pixel_values must be a 2-D f32 tensor [patches, ", c.patch_dim(),
               "]");
  FLOWKV_CHECK(pv.dim(1) == c.patch_dim(), "qwen3-vl vision: pixel_values rows are ", pv.dim(1),
               " wide; this tower's patches hold ", c.patch_dim(), " values (", c.in_channels,
               " channels x ", c.temporal_patch_size, " frames x ", c.patch_size, "^2 pixels)");
  FLOWKV_CHECK(!grid.empty(), "qwen3-vl vision: no image grid given");
  const int64_t m = c.spatial_merge_size;
  int64_t n = 0;
  for (size_t i = 0; i < grid.size(); ++i) {
    const auto& g = grid[i];
    FLOWKV_CHECK(g[0] >= 1 && g[1] >= 1 && g[2] >= 1 && g[0] <= limits::kMaxTokens &&
                     g[1] <= limits::kMaxTokens && g[2] <= limits::kMaxTokens,
                 "qwen3-vl vision: grid_thw[", i, "] = {", g[0], ", ", g[1], ", ", g[2],
                 "} is not a positive grid");
    FLOWKV_CHECK(g[1] % m == 0 && g[2] % m == 0, "qwen3-vl vision: grid_thw[", i, "] = {", g[0],
                 ", ", g[1], ", ", g[2], "}: height and width must be multiples of ",
                 "spatial_merge_size ", m);
    n = checked_add(n, checked_mul(checked_mul(g[0], g[1], "grid"), g[2], "grid"), "grid");
    FLOWKV_CHECK(n <= limits::kMaxTokens, "qwen3-vl vision: more than ", limits::kMaxTokens,
                 " patches");
  }
  FLOWKV_CHECK(n == pv.dim(0), "qwen3-vl vision: the grids hold ", n,
               " patches but pixel_values has ", pv.dim(0), " rows");
  // Workspace of one block (x, norm, qkv, attention, projection, MLP hidden), the RoPE tables,
  // the merger's and the outputs, before any of it is allocated.
  const std::string what = "qwen3-vl vision activations";
  const int64_t per_row =
      c.hidden_size * 8 + c.intermediate_size + c.head_dim() * 2 +
      c.out_hidden_size * static_cast<int64_t>(c.deepstack_visual_indexes.size() + 1);
  const int64_t floats = checked_mul(n, per_row, what);
  check_memory(checked_mul(floats, 4, what), what, "encode fewer or smaller images");
}

}  // namespace

VisionTower VisionTower::load(const CheckpointScan& scan, const VisionConfig& cfg,
                              const std::string& prefix, const VisionLoadOptions& opts) {
  const auto tensors = under_prefix(scan.tensors, prefix);
  const std::vector<ExpectedTensor> table = vision_weight_table(cfg, prefix);
  const std::vector<std::string> problems = check_against_table(tensors, table);
  if (!problems.empty()) {
    fail(format_problems(
        scan.path + " does not hold a Qwen3-VL vision tower of its config under \"" + prefix + "\"",
        problems));
  }
  const DType compute = choose_compute(tensors, table, opts);
  check_weights_fit(
      table,
      [&](const ExpectedTensor& e) {
        const TensorInfo& t = tensors.at(e.name);
        if (!is_linear_weight(e)) return int64_t{4} * shape_numel(e.shape);
        return ops::held_weight_bytes(t.dtype, {e.shape[0], shape_numel(e.shape) / e.shape[0]},
                                      compute);
      },
      "Qwen3-VL vision tower");

  CheckpointReader reader(scan);
  auto w = std::make_shared<Weights>();
  w->cfg = cfg;
  w->compute = compute;
  const ops::Compute dt{compute};
  auto linear = [&](const std::string& wn, const std::string& bn) {
    Tensor t = reader.get(wn);
    if (t.ndim() != 2) t = t.reshape({t.dim(0), t.numel() / t.dim(0)});
    ops::Linear l(t, dt, opts.keep_plain);
    l.set_bias(reader.get(bn));
    return l;
  };
  auto norm = [&](const std::string& wn, const std::string& bn) {
    return Norm{vec(reader.get(wn)), vec(reader.get(bn))};
  };
  w->patch_embed = linear(weight_name(prefix, GlobalW::kPatchEmbedW),
                          weight_name(prefix, GlobalW::kPatchEmbedB));
  w->pos = vec(reader.get(weight_name(prefix, GlobalW::kPosEmbed)));
  for (int64_t b = 0; b < cfg.depth; ++b) {
    auto n = [&](BlockW k) { return weight_name(prefix, b, k); };
    BlockWeights bw;
    bw.norm1 = norm(n(BlockW::kNorm1W), n(BlockW::kNorm1B));
    bw.qkv = linear(n(BlockW::kQkvW), n(BlockW::kQkvB));
    bw.proj = linear(n(BlockW::kProjW), n(BlockW::kProjB));
    bw.norm2 = norm(n(BlockW::kNorm2W), n(BlockW::kNorm2B));
    bw.fc1 = linear(n(BlockW::kFc1W), n(BlockW::kFc1B));
    bw.fc2 = linear(n(BlockW::kFc2W), n(BlockW::kFc2B));
    w->blocks.push_back(std::move(bw));
  }
  auto merger = [&](int64_t m) {
    auto n = [&](MergerW k) { return weight_name(prefix, m, k); };
    MergerWeights mw;
    mw.postshuffle = m >= 0;
    mw.norm = norm(n(MergerW::kNormW), n(MergerW::kNormB));
    mw.fc1 = linear(n(MergerW::kFc1W), n(MergerW::kFc1B));
    mw.fc2 = linear(n(MergerW::kFc2W), n(MergerW::kFc2B));
    return mw;
  };
  w->merger = merger(-1);
  for (size_t j = 0; j < cfg.deepstack_visual_indexes.size(); ++j) {
    w->deepstack.push_back(merger(static_cast<int64_t>(j)));
  }
  w->inv_freq = axial_inv_freq(cfg);
  VisionTower t;
  t.w_ = std::move(w);
  return t;
}

VisionTower VisionTower::load(const std::string& path, const VisionLoadOptions& opts) {
  const std::string sub = (fs::path(path) / "text_encoder").string();
  const bool pipeline = !path_exists((fs::path(path) / "config.json").string()) &&
                        path_exists((fs::path(sub) / "config.json").string());
  const std::string dir = pipeline ? sub : path;
  const CheckpointScan scan = scan_checkpoint(dir);
  FLOWKV_CHECK(scan.config.has_value(), scan.path,
               ": a Qwen3-VL text encoder needs its config.json (Qwen3VLConfig)");
  const VisionConfig cfg =
      VisionConfig::from_model_config(*scan.config, scan.path + "/config.json");
  return load(scan, cfg, kVisionPrefix, opts);
}

const VisionConfig& VisionTower::config() const {
  return w_->cfg;
}
DType VisionTower::compute_dtype() const {
  return w_->compute;
}

int64_t VisionTower::weight_bytes() const {
  const Weights& w = *w_;
  int64_t b = w.patch_embed.packed_bytes() + static_cast<int64_t>(w.pos.size()) * 4;
  auto norm = [](const Norm& n) { return static_cast<int64_t>(n.w.size() + n.b.size()) * 4; };
  auto lin = [](const ops::Linear& l) { return l.packed_bytes() + l.out_features() * 4; };
  for (const BlockWeights& x : w.blocks) {
    b += norm(x.norm1) + norm(x.norm2) + lin(x.qkv) + lin(x.proj) + lin(x.fc1) + lin(x.fc2);
  }
  for (const MergerWeights* m : {&w.merger}) b += norm(m->norm) + lin(m->fc1) + lin(m->fc2);
  for (const MergerWeights& m : w.deepstack) b += norm(m.norm) + lin(m.fc1) + lin(m.fc2);
  return b;
}

VisionOutput VisionTower::forward(const ExecContext& ctx, const Tensor& pixel_values,
                                  const std::vector<std::array<int64_t, 3>>& grid_thw) const {
  const Weights& w = *w_;
  const VisionConfig& c = w.cfg;
  FLOWKV_CHECK(ctx.arena, "qwen3-vl vision: the execution context has no workspace arena");
  check_inputs(c, pixel_values, grid_thw);
  Arena& ws = *ctx.arena;
  ArenaScope scope(ws);
  const int64_t N = pixel_values.dim(0), H = c.hidden_size, hd = c.head_dim();
  const int64_t m = c.spatial_merge_size, side = c.grid_side();
  Run r{.ec = ctx,
        .w = w,
        .ws = ws,
        .N = N,
        .H = H,
        .heads = c.num_heads,
        .hd = hd,
        .F = c.intermediate_size,
        .bf16 = w.compute == DType::kBF16};

  // Patch embedding: the Conv3d with stride = kernel is a linear map of each flattened patch.
  Mat x = alloc_mat(ws, N, H);
  {
    Mat pv = make_mat(const_cast<float*>(pixel_values.f32()), N, c.patch_dim());
    if (r.bf16) {
      ArenaScope s(ws);
      Mat p16 = alloc_mat(ws, N, c.patch_dim());
      copy_rows(pv, p16);
      ops::round_bf16(ctx, p16);  // get_image_features casts pixel_values to the tower's dtype
      w.patch_embed.forward(ctx, p16, x);
    } else {
      w.patch_embed.forward(ctx, pv, x);
    }
    round_if_bf16(r, x);
  }
  trace(ctx, "patch_embed", x);

  // Learned position embedding resampled to each grid, and the RoPE tables, per token.
  float* cos = ws.floats(N * hd);
  float* sin = ws.floats(N * hd);
  const int64_t quarter = hd / 4;
  std::vector<float> pe(static_cast<size_t>(H));
  int64_t row = 0;
  r.seg.push_back(0);
  for (const auto& g : grid_thw) {
    const int64_t gh = g[1], gw = g[2];
    for (int64_t t = 0; t < g[0]; ++t) {
      for (int64_t k = 0; k < gh * gw; ++k, ++row) {
        const Pos p = token_pos(k, gw, m);
        int64_t th[2], tw[2];
        float wh[2], ww[2];
        axis_taps(p.row, gh, side, th, wh);
        axis_taps(p.col, gw, side, tw, ww);
        std::fill(pe.begin(), pe.end(), 0.0f);
        for (int a = 0; a < 2; ++a) {
          for (int b = 0; b < 2; ++b) {
            const float wt = wh[a] * ww[b];
            const float* e = w.pos.data() + (th[a] * side + tw[b]) * H;
            for (int64_t i = 0; i < H; ++i) pe[i] += e[i] * wt;
          }
        }
        float* xr = x.row(row);
        // A bf16 tower casts the (f32) resampled embedding to bf16 before adding it.
        if (r.bf16) {
          for (int64_t i = 0; i < H; ++i) pe[i] = round_bf16(pe[i]);
        }
        for (int64_t i = 0; i < H; ++i) xr[i] += pe[i];
        // cos/sin row: [h freqs, w freqs] then the same again (the two rotate_half halves).
        float* cr = cos + row * hd;
        float* sr = sin + row * hd;
        for (int64_t i = 0; i < quarter; ++i) {
          const float fh = static_cast<float>(p.row) * w.inv_freq[i];
          const float fw = static_cast<float>(p.col) * w.inv_freq[i];
          cr[i] = cr[2 * quarter + i] = std::cos(fh);
          sr[i] = sr[2 * quarter + i] = std::sin(fh);
          cr[quarter + i] = cr[3 * quarter + i] = std::cos(fw);
          sr[quarter + i] = sr[3 * quarter + i] = std::sin(fw);
        }
      }
      r.seg.push_back(row);  // each frame attends within itself
    }
  }
  round_if_bf16(r, x);
  trace(ctx, "pos_embed", x);
  r.cos = cos, r.sin = sin;

  VisionOutput out;
  for (int64_t b = 0; b < c.depth; ++b) {
    block(r, w.blocks[static_cast<size_t>(b)], x);
    trace(ctx, "blocks." + std::to_string(b), x);
    for (size_t j = 0; j < c.deepstack_visual_indexes.size(); ++j) {
      if (c.deepstack_visual_indexes[j] != b) continue;
      if (out.deepstack.size() < c.deepstack_visual_indexes.size()) {
        out.deepstack.resize(c.deepstack_visual_indexes.size());
      }
      out.deepstack[j] = merge(r, w.deepstack[j], x);
      trace(ctx, "deepstack." + std::to_string(j),
            make_mat(out.deepstack[j].f32(), out.deepstack[j].dim(0), out.deepstack[j].dim(1)));
    }
  }
  out.embeds = merge(r, w.merger, x);
  trace(ctx, "embeds", make_mat(out.embeds.f32(), out.embeds.dim(0), out.embeds.dim(1)));
  return out;
}

}  // namespace flowkv::qwen3_vl
