// The Qwen2.5-VL vision tower: loading (tensors under the prefix checked against the name table,
// then the linear layers built) and the forward (transformers modeling_qwen2_5_vl.py,
// Qwen2_5_VisionTransformerPretrainedModel.forward). Activations are [N, C] matrices, N =
// patches of all images.
#include "models/qwen25_vl/vision.h"

#include <cstring>

#include "core/checked.h"
#include "core/memory.h"
#include "flowkv/error.h"
#include "io/mapped_file.h"
#include "models/common/blocks.h"
#include "models/qwen25_vl/source.h"
#include "models/qwen25_vl/vision_weights.h"
#include "ops/linear.h"
#include "ops/ops.h"

namespace flowkv::qwen25_vl {

namespace {

constexpr float kNormEps = 1e-6f;  // every RMSNorm of the tower (Qwen2_5_VLRMSNorm(eps=1e-6))

struct BlockWeights {
  std::vector<float> norm1, norm2;
  ops::Linear qkv, proj;  // with biases
  ops::Linear gate_up;    // gate_proj | up_proj stacked, with both biases
  ops::Linear down;
};

}  // namespace

struct VisionTower::Weights {
  VisionConfig cfg;
  DType compute = DType::kF32;
  ops::Linear patch_embed;  // Conv3d as [hidden, C*T*P*P], no bias
  std::vector<BlockWeights> blocks;
  std::vector<float> ln_q;
  ops::Linear fc1, fc2;         // the merger's MLP, with biases
  std::vector<float> inv_freq;  // head_dim / 4 frequencies of the axial RoPE
};

namespace {

std::vector<float> vec(const Tensor& t) {
  const Tensor f = t.to_f32();
  return std::vector<float>(f.f32(), f.f32() + f.numel());
}

bool is_linear_weight(const ExpectedTensor& e) {
  return e.shape.size() >= 2;
}

// Everything one forward shares.
struct Run {
  const ExecContext& ec;
  const VisionTower::Weights& w;
  Arena& ws;
  int64_t N, H, heads, hd, F;
  bool bf16;
  const float* cos = nullptr;  // [N, hd], window order
  const float* sin = nullptr;
};

void round_if_bf16(const Run& r, Mat m) {
  if (r.bf16) ops::round_bf16(r.ec, m);
}

// y = RMSNorm(x) * weight.
void rms_norm(const Run& r, Mat x, const std::vector<float>& weight, Mat y) {
  copy_rows(x, y);
  ops::rms_norm_rope(r.ec, y, y.cols, weight.data(), kNormEps, {});
}

// Qwen2_5_VLVisionBlock: x += proj(attn(rope(qkv(norm1 x)))); x += down(silu(gate) * up).
// `seg`: the attention segments (windows or frames) as row offsets, N at the end.
void block(const Run& r, const BlockWeights& b, std::span<const int64_t> seg, Mat x) {
  ArenaScope scope(r.ws);
  Mat n = alloc_mat(r.ws, r.N, r.H), qkv = alloc_mat(r.ws, r.N, 3 * r.H);
  Mat attn = alloc_mat(r.ws, r.N, r.H), y = alloc_mat(r.ws, r.N, r.H);
  rms_norm(r, x, b.norm1, n);
  round_if_bf16(r, n);
  b.qkv.forward(r.ec, n, qkv);
  round_if_bf16(r, qkv);
  vit::apply_rope(qkv.cols_slice(0, r.H), r.heads, r.hd, r.cos, r.sin);
  vit::apply_rope(qkv.cols_slice(r.H, r.H), r.heads, r.hd, r.cos, r.sin);
  round_if_bf16(r, qkv);
  vit::segment_attention(r.ec, qkv, attn, r.heads, r.hd, seg);
  round_if_bf16(r, attn);
  b.proj.forward(r.ec, attn, y);
  round_if_bf16(r, y);
  ops::gated_add(r.ec, x, y, {});
  round_if_bf16(r, x);

  ArenaScope mlp(r.ws);
  Mat gu = alloc_mat(r.ws, r.N, 2 * r.F), u = alloc_mat(r.ws, r.N, r.F);
  rms_norm(r, x, b.norm2, n);
  round_if_bf16(r, n);
  b.gate_up.forward(r.ec, n, gu);
  round_if_bf16(r, gu);
  ops::swiglu(r.ec, gu, u);
  round_if_bf16(r, u);
  b.down.forward(r.ec, u, y);
  round_if_bf16(r, y);
  ops::gated_add(r.ec, x, y, {});
  round_if_bf16(r, x);
}

// Qwen2_5_VLPatchMerger on x (window order): RMSNorm ln_q per token, the merge^2 -> 1 shuffle,
// fc2(GELU(fc1)) with the erf GELU; rows written to `out` at their image-order positions.
void merge(const Run& r, std::span<const int64_t> index, Mat x, Tensor& out) {
  ArenaScope scope(r.ws);
  const VisionConfig& c = r.w.cfg;
  const int64_t u = c.merge_unit(), rows = r.N / u, width = r.H * u, O = c.out_hidden_size;
  Mat n = alloc_mat(r.ws, r.N, r.H);
  rms_norm(r, x, r.w.ln_q, n);
  round_if_bf16(r, n);
  Mat shuffled = make_mat(n.data, rows, width);  // consecutive m^2 tokens form one row
  Mat h = alloc_mat(r.ws, rows, width), o = alloc_mat(r.ws, rows, O);
  r.w.fc1.forward(r.ec, shuffled, h);
  round_if_bf16(r, h);
  ops::gelu_erf(r.ec, h);
  round_if_bf16(r, h);
  r.w.fc2.forward(r.ec, h, o);
  round_if_bf16(r, o);
  // merged_hidden_states[argsort(window_index)]: row j of the window order is token index[j].
  for (int64_t j = 0; j < rows; ++j) {
    std::memcpy(out.f32() + index[j] * O, o.row(j), static_cast<size_t>(O) * sizeof(float));
  }
}

// Rows of `src` regrouped into window order: merged token index[j] (u rows) becomes rows
// [j*u, (j+1)*u) of dst (permute_input_for_window_attn).
void permute_rows(std::span<const int64_t> index, int64_t u, Mat src, Mat dst) {
  vit::for_rows(static_cast<int64_t>(index.size()), [&](int64_t j) {
    for (int64_t k = 0; k < u; ++k) {
      std::memcpy(dst.row(j * u + k), src.row(index[j] * u + k),
                  static_cast<size_t>(src.cols) * sizeof(float));
    }
  });
}

int64_t check_inputs(const VisionConfig& c, const Tensor& pv, std::span<const Grid> grids) {
  const std::string desc = std::to_string(c.in_channels) + " channels x " +
                           std::to_string(c.temporal_patch_size) + " frames x " +
                           std::to_string(c.patch_size) + "^2 pixels";
  const int64_t n = vit::check_pixels_and_grids("qwen2.5-vl vision", pv, c.patch_dim(), desc, grids,
                                                c.spatial_merge_size);
  // Workspace of one block (x twice for the regrouping, norm, qkv, attention, projection, the
  // MLP's gate|up and product), the RoPE tables, the merger's and the output, before any of it
  // is allocated.
  const std::string what = "qwen2.5-vl vision activations";
  const int64_t per_row = c.hidden_size * 9 + c.intermediate_size * 3 + c.head_dim() * 4 +
                          c.hidden_size * 2 + c.out_hidden_size * 2;
  const int64_t floats = checked_mul(n, per_row, what);
  check_memory(checked_mul(floats, 4, what), what, "encode fewer or smaller images");
  return n;
}

Tensor concat(const Tensor& a, const Tensor& b) {
  const Tensor fa = a.to_f32(), fb = b.to_f32();
  Tensor t = Tensor::empty({fa.numel() + fb.numel()});
  std::memcpy(t.f32(), fa.f32(), static_cast<size_t>(fa.numel()) * sizeof(float));
  std::memcpy(t.f32() + fa.numel(), fb.f32(), static_cast<size_t>(fb.numel()) * sizeof(float));
  return t;
}

}  // namespace

VisionTower VisionTower::load(const CheckpointScan& scan, const VisionConfig& cfg,
                              const std::string& prefix, const VisionLoadOptions& opts) {
  const auto tensors = vit::under_prefix(scan.tensors, prefix);
  const std::vector<ExpectedTensor> table = vision_weight_table(cfg, prefix);
  const DType compute = vit::check_tower(scan.path, prefix, tensors, table, opts, is_linear_weight,
                                         "Qwen2.5-VL vision tower");

  CheckpointReader reader(scan);
  auto w = std::make_shared<Weights>();
  w->cfg = cfg;
  w->compute = compute;
  const ops::Compute dt{compute};
  auto linear = [&](const std::string& wn, const std::string& bn) {
    Tensor t = reader.get(wn);
    if (t.ndim() != 2) t = t.reshape({t.dim(0), t.numel() / t.dim(0)});
    ops::Linear l(t, dt, opts.keep_plain);
    if (!bn.empty()) l.set_bias(reader.get(bn));
    return l;
  };
  w->patch_embed = linear(weight_name(prefix, GlobalW::kPatchEmbedW), "");
  for (int64_t b = 0; b < cfg.depth; ++b) {
    auto n = [&](BlockW k) { return weight_name(prefix, b, k); };
    BlockWeights bw;
    bw.norm1 = vec(reader.get(n(BlockW::kNorm1W)));
    bw.norm2 = vec(reader.get(n(BlockW::kNorm2W)));
    bw.qkv = linear(n(BlockW::kQkvW), n(BlockW::kQkvB));
    bw.proj = linear(n(BlockW::kProjW), n(BlockW::kProjB));
    bw.gate_up = ops::Linear::stacked({reader.get(n(BlockW::kGateW)), reader.get(n(BlockW::kUpW))},
                                      dt, opts.keep_plain);
    bw.gate_up.set_bias(concat(reader.get(n(BlockW::kGateB)), reader.get(n(BlockW::kUpB))));
    bw.down = linear(n(BlockW::kDownW), n(BlockW::kDownB));
    w->blocks.push_back(std::move(bw));
  }
  w->ln_q = vec(reader.get(weight_name(prefix, MergerW::kLnQW)));
  w->fc1 = linear(weight_name(prefix, MergerW::kFc1W), weight_name(prefix, MergerW::kFc1B));
  w->fc2 = linear(weight_name(prefix, MergerW::kFc2W), weight_name(prefix, MergerW::kFc2B));
  w->inv_freq = vit::axial_inv_freq(cfg.head_dim(), cfg.rope_theta);
  VisionTower t;
  t.w_ = std::move(w);
  return t;
}

VisionTower VisionTower::load(const std::string& path, const VisionLoadOptions& opts) {
  const TextEncoderSource s = open_text_encoder(path);
  FLOWKV_CHECK(!s.llama_cpp, s.scan.path,
               ": the text encoder GGUF holds no vision tower; llama.cpp keeps Qwen2.5-VL's in a "
               "separate mmproj file, which flowkv does not read. Text-to-image prompts work with "
               "it; prompts with pictures (Edit-Plus) need the diffusers text_encoder/ folder or "
               "a GGUF written from it by `flowkv quantize`");
  const VisionConfig cfg = VisionConfig::from_model_config(*s.model_config, s.config_path);
  return load(s.scan, cfg, detect_vision_prefix(s.scan), opts);
}

const VisionConfig& VisionTower::config() const {
  return w_->cfg;
}
DType VisionTower::compute_dtype() const {
  return w_->compute;
}

int64_t VisionTower::weight_bytes() const {
  const Weights& w = *w_;
  auto lin = [](const ops::Linear& l) { return l.packed_bytes() + l.out_features() * 4; };
  int64_t b = w.patch_embed.packed_bytes() + static_cast<int64_t>(w.ln_q.size()) * 4;
  for (const BlockWeights& x : w.blocks) {
    b += static_cast<int64_t>(x.norm1.size() + x.norm2.size()) * 4 + lin(x.qkv) + lin(x.proj) +
         lin(x.gate_up) + lin(x.down);
  }
  return b + lin(w.fc1) + lin(w.fc2);
}

Tensor VisionTower::forward(const ExecContext& ctx, const Tensor& pixel_values,
                            std::span<const Grid> grids) const {
  const Weights& w = *w_;
  const VisionConfig& c = w.cfg;
  FLOWKV_CHECK(ctx.arena, "qwen2.5-vl vision: the execution context has no workspace arena");
  const int64_t N = check_inputs(c, pixel_values, grids);
  Arena& ws = *ctx.arena;
  ArenaScope scope(ws);
  const int64_t H = c.hidden_size, hd = c.head_dim(), m = c.spatial_merge_size;
  const int64_t u = c.merge_unit();
  Run r{.ec = ctx,
        .w = w,
        .ws = ws,
        .N = N,
        .H = H,
        .heads = c.num_heads,
        .hd = hd,
        .F = c.intermediate_size,
        .bf16 = w.compute == DType::kBF16};

  // Patch embedding: the Conv3d as a linear map of each flattened patch.
  Mat x0 = alloc_mat(ws, N, H);
  vit::embed_patches(ctx, w.patch_embed, pixel_values, r.bf16, x0);
  vit::trace(ctx, "patch_embed", x0);

  // The RoPE tables per token, in processor order (the rotary embedding runs on the position
  // ids before the regrouping; its f32 cos / sin are then permuted like the rows).
  Mat cos0 = alloc_mat(ws, N, hd), sin0 = alloc_mat(ws, N, hd);
  int64_t row = 0;
  for (const Grid& g : grids) {
    for (int64_t t = 0; t < g[0]; ++t) {
      for (int64_t k = 0; k < g[1] * g[2]; ++k, ++row) {
        vit::axial_rope_row(w.inv_freq, vit::merge_block_pos(k, g[2], m), cos0.row(row),
                            sin0.row(row));
      }
    }
  }
  vit::trace(ctx, "rope.cos", cos0);
  vit::trace(ctx, "rope.sin", sin0);

  const WindowLayout layout = window_layout(c, grids);
  Mat x = alloc_mat(ws, N, H), cos = alloc_mat(ws, N, hd), sin = alloc_mat(ws, N, hd);
  permute_rows(layout.index, u, x0, x);
  permute_rows(layout.index, u, cos0, cos);
  permute_rows(layout.index, u, sin0, sin);
  r.cos = cos.data, r.sin = sin.data;

  for (int64_t b = 0; b < c.depth; ++b) {
    const std::vector<int64_t>& seg =
        c.full_attention(b) ? layout.cu_seqlens : layout.cu_window_seqlens;
    block(r, w.blocks[static_cast<size_t>(b)], seg, x);
    vit::trace(ctx, "blocks." + std::to_string(b), x);
  }
  Tensor out = Tensor::empty({N / u, c.out_hidden_size});
  merge(r, layout.index, x, out);
  vit::trace(ctx, "embeds", make_mat(out.f32(), out.dim(0), out.dim(1)));
  return out;
}

}  // namespace flowkv::qwen25_vl
