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
#include "models/common/vit.h"
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

bool is_linear_weight(const ExpectedTensor& e) {
  return e.shape.size() >= 2 && e.name.find("pos_embed") == std::string::npos;
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

// y = LayerNorm(x) * weight + bias.
void layer_norm(const Run& r, Mat x, const Norm& n, Mat y) {
  ops::layer_norm_modulate(r.ec, x, y, {}, {}, kNormEps);
  vit::for_rows(y.rows, [&](int64_t i) {
    float* v = y.row(i);
    for (int64_t c = 0; c < y.cols; ++c) v[c] = v[c] * n.w[c] + n.b[c];
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
  vit::apply_rope(qkv.cols_slice(0, r.H), r.heads, r.hd, r.cos, r.sin);
  vit::apply_rope(qkv.cols_slice(r.H, r.H), r.heads, r.hd, r.cos, r.sin);
  round_if_bf16(r, qkv);
  // Attention within each segment (cu_seqlens: one per image frame).
  vit::segment_attention(r.ec, qkv, attn, r.heads, r.hd, r.seg);
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
  const std::string desc = std::to_string(c.in_channels) + " channels x " +
                           std::to_string(c.temporal_patch_size) + " frames x " +
                           std::to_string(c.patch_size) + "^2 pixels";
  const int64_t n = vit::check_pixels_and_grids("qwen3-vl vision", pv, c.patch_dim(), desc, grid,
                                                c.spatial_merge_size);
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
  const auto tensors = vit::under_prefix(scan.tensors, prefix);
  const std::vector<ExpectedTensor> table = vision_weight_table(cfg, prefix);
  const DType compute = vit::check_tower(scan.path, prefix, tensors, table, opts, is_linear_weight,
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
  w->inv_freq = vit::axial_inv_freq(cfg.head_dim(), cfg.rope_theta);
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
        .bf16 = w.compute == DType::kBF16,
        .seg = {}};

  // Patch embedding: the Conv3d as a linear map of each flattened patch.
  Mat x = alloc_mat(ws, N, H);
  vit::embed_patches(ctx, w.patch_embed, pixel_values, r.bf16, x);
  vit::trace(ctx, "patch_embed", x);

  // Learned position embedding resampled to each grid, and the RoPE tables, per token.
  float* cos = ws.floats(N * hd);
  float* sin = ws.floats(N * hd);
  std::vector<float> pe(static_cast<size_t>(H));
  int64_t row = 0;
  r.seg.push_back(0);
  for (const auto& g : grid_thw) {
    const int64_t gh = g[1], gw = g[2];
    for (int64_t t = 0; t < g[0]; ++t) {
      for (int64_t k = 0; k < gh * gw; ++k, ++row) {
        const vit::PatchPos p = vit::merge_block_pos(k, gw, m);
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
        vit::axial_rope_row(w.inv_freq, p, cos + row * hd, sin + row * hd);
      }
      r.seg.push_back(row);  // each frame attends within itself
    }
  }
  round_if_bf16(r, x);
  vit::trace(ctx, "pos_embed", x);
  r.cos = cos, r.sin = sin;

  VisionOutput out;
  for (int64_t b = 0; b < c.depth; ++b) {
    block(r, w.blocks[static_cast<size_t>(b)], x);
    vit::trace(ctx, "blocks." + std::to_string(b), x);
    for (size_t j = 0; j < c.deepstack_visual_indexes.size(); ++j) {
      if (c.deepstack_visual_indexes[j] != b) continue;
      if (out.deepstack.size() < c.deepstack_visual_indexes.size()) {
        out.deepstack.resize(c.deepstack_visual_indexes.size());
      }
      out.deepstack[j] = merge(r, w.deepstack[j], x);
      vit::trace(
          ctx, "deepstack." + std::to_string(j),
          make_mat(out.deepstack[j].f32(), out.deepstack[j].dim(0), out.deepstack[j].dim(1)));
    }
  }
  out.embeds = merge(r, w.merger, x);
  vit::trace(ctx, "embeds", make_mat(out.embeds.f32(), out.embeds.dim(0), out.embeds.dim(1)));
  return out;
}

}  // namespace flowkv::qwen3_vl
