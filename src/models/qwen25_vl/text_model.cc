// The Qwen2.5-VL language model: loading (the text part of the checkpoint, either layout), the
// 3-D positions (get_rope_index), the MRoPE tables and the forward (transformers 5.24
// modeling_qwen2_5_vl.py Qwen2_5_VLModel.forward and Qwen2_5_VLTextModel.forward).
#include "models/qwen25_vl/text_model.h"

#include <algorithm>
#include <cstring>

#include "core/checked.h"
#include "core/memory.h"
#include "flowkv/error.h"
#include "flowkv/limits.h"
#include "io/mapped_file.h"
#include "models/common/blocks.h"
#include "models/common/vit.h"
#include "models/qwen25_vl/source.h"
#include "models/qwen3/decoder.h"
#include "models/qwen3/weights.h"
#include "ops/linear.h"
#include "ops/ops.h"

namespace flowkv::qwen25_vl {

struct TextModel::Weights {
  Config cfg;
  Layout layout = Layout::kModel;
  DType compute = DType::kF32;
  Tensor embed;  // [vocab, H] as stored (a view of the mapped file)
  std::vector<qwen3::LayerWeights> layers;
  std::vector<float> norm;
};

namespace {

// The axis (0: t, 1: h, 2: w) that drives rotary frequency i: recomposition_frequencies splits
// the head_dim/2 frequencies into chunks of mrope_section sizes, chunk k taking axis k.
int axis_of(const Config& c, int64_t i) {
  if (i < c.mrope_section[0]) return 0;
  if (i < c.mrope_section[0] + c.mrope_section[1]) return 1;
  return 2;
}

// [L, head_dim] tables: frequency i of token p turns with the position of p on axis_of(i).
void mrope_tables(const Config& c, std::span<const int64_t> pos, int64_t L, float* cos,
                  float* sin) {
  const std::vector<float> inv = qwen3::rope_inv_freq(c.text);
  std::vector<int64_t> axis(inv.size());
  for (size_t i = 0; i < inv.size(); ++i) axis[i] = axis_of(c, static_cast<int64_t>(i)) * L;
  const int64_t hd = c.text.head_dim;
  for (int64_t p = 0; p < L; ++p) {
    qwen3::rope_row(
        inv, [&](size_t i) { return pos[axis[i] + p]; }, cos + p * hd, sin + p * hd);
  }
}

// Checks the vision embeddings against the ids' image rows (shapes only: nothing allocated).
void check_vision(const Config& c, const TextInputs& in, int64_t n_image) {
  if (!in.vision) return;
  const int64_t H = c.text.hidden_size;
  const Tensor& e = in.vision->embeds;
  FLOWKV_CHECK(n_image > 0,
               "qwen25_vl encode: vision embeddings given, but the ids hold no "
               "<|image_pad|> token (id ",
               c.image_token_id, ")");
  FLOWKV_CHECK(e.defined() && e.shape() == (Shape{n_image, H}),
               "qwen25_vl encode: the vision embeddings have shape ",
               e.defined() ? shape_str(e.shape()) : std::string("(none)"), ", expected [", n_image,
               ", ", H, "] (one row per <|image_pad|> token)");
}

}  // namespace

std::vector<int64_t> rope_positions(const Config& c, std::span<const int32_t> ids,
                                    std::span<const Grid> grids) {
  return vit::mrope_positions(ids, grids, c.image_token_id, c.video_token_id, c.spatial_merge_size,
                              "qwen25_vl");
}

TextModel TextModel::load(const std::string& path, const LoadOptions& opts) {
  const TextEncoderSource s = open_text_encoder(path);
  return from_scan(s.scan, s.cfg, opts);
}

TextModel TextModel::from_scan(const CheckpointScan& scan, const Config& cfg,
                               const LoadOptions& opts) {
  const Layout layout = detect_layout(scan.tensors);
  const std::string prefix = text_prefix(layout);
  const auto tensors = text_tensors(scan.tensors, layout);
  const std::vector<ExpectedTensor> table = text_weight_table(cfg, layout);
  const std::vector<std::string> problems = check_against_table(tensors, table);
  if (!problems.empty()) {
    fail(format_problems(
        scan.path + " does not hold the language model (" + prefix + "*) of its Qwen2.5-VL config",
        problems));
  }
  const DType compute = qwen3::choose_compute(tensors, table, opts.auto_dtype, opts.compute);
  const std::string embed_name = qwen3::weight_name(qwen3::GlobalW::kEmbedTokens, prefix);
  check_weights_fit(
      table,
      [&](const ExpectedTensor& e) {
        const TensorInfo& t = tensors.at(e.name);
        if (e.name == embed_name) return dtype_bytes(t.dtype, shape_numel(e.shape));
        return ops::held_weight_bytes(t.dtype, e.shape, compute);
      },
      "Qwen2.5-VL text model");

  CheckpointReader reader(scan);
  auto w = std::make_shared<Weights>();
  w->cfg = cfg;
  w->layout = layout;
  w->compute = compute;
  const ops::Compute dt{compute, opts.int8};
  w->embed = reader.get(embed_name);
  for (int64_t l = 0; l < cfg.text.num_hidden_layers; ++l) {
    w->layers.push_back(qwen3::load_layer(reader, cfg.text, prefix, l, dt, opts.keep_plain));
  }
  w->norm = qwen3::load_vector(reader, qwen3::weight_name(qwen3::GlobalW::kNorm, prefix));
  TextModel m;
  m.w_ = std::move(w);
  return m;
}

const Config& TextModel::config() const {
  return w_->cfg;
}
DType TextModel::compute_dtype() const {
  return w_->compute;
}
Layout TextModel::layout() const {
  return w_->layout;
}
int64_t TextModel::weight_bytes() const {
  int64_t b = w_->embed.nbytes() + static_cast<int64_t>(w_->norm.size()) * 4;
  for (const qwen3::LayerWeights& l : w_->layers) b += l.bytes();
  return b;
}

Tensor TextModel::forward(const ExecContext& ctx, const TextInputs& in, TextTrace* trace) const {
  const Weights& w = *w_;
  const Config& c = w.cfg;
  const qwen3::Config& tc = c.text;
  FLOWKV_CHECK(ctx.arena, "qwen25_vl encode: the execution context has no workspace arena");
  const int64_t L = static_cast<int64_t>(in.ids.size());
  FLOWKV_CHECK(L >= 1, "qwen25_vl encode: no token ids");
  FLOWKV_CHECK(L <= limits::kMaxTokens, "qwen25_vl encode: ", L, " tokens exceed the limit of ",
               limits::kMaxTokens);
  int64_t n_image = 0;
  for (int64_t i = 0; i < L; ++i) {
    FLOWKV_CHECK(in.ids[i] >= 0 && in.ids[i] < tc.vocab_size, "qwen25_vl encode: token id ",
                 in.ids[i], " at position ", i, " is outside the vocabulary [0, ", tc.vocab_size,
                 ")");
    n_image += in.ids[i] == c.image_token_id;
  }
  check_vision(c, in, n_image);
  // One layer's activations, the RoPE tables, the positions, the f32 copy of the vision
  // embeddings and a trace, checked before any is allocated.
  qwen3::check_encoder_memory(c.text, L, in.vision != nullptr ? 1 : 0, trace != nullptr,
                              "qwen25_vl encode activations");
  std::vector<int64_t> pos;
  if (in.positions == Positions::kMrope) {
    pos = rope_positions(c, in.ids, in.grids);
  } else {
    pos.resize(static_cast<size_t>(3 * L));
    for (int64_t a = 0; a < 3; ++a) {
      for (int64_t k = 0; k < L; ++k) pos[a * L + k] = k;
    }
  }
  Tensor vis;  // f32 copy (bf16 rounding may change it)
  if (in.vision) vis = in.vision->embeds.to_f32();

  Arena& ws = *ctx.arena;
  ArenaScope scope(ws);
  const int64_t H = tc.hidden_size, hd = tc.head_dim;
  qwen3::DecoderRun r{
      .ec = ctx, .cfg = tc, .ws = ws, .B = 1, .L = L, .M = L, .bf16 = w.compute == DType::kBF16};
  float* cos = ws.floats(L * hd);
  float* sin = ws.floats(L * hd);
  mrope_tables(c, pos, L, cos, sin);
  if (r.bf16) {  // transformers casts the tables to the activations' dtype
    ops::round_bf16(ctx, make_mat(cos, L, hd));
    ops::round_bf16(ctx, make_mat(sin, L, hd));
  }
  r.cos = cos, r.sin = sin;
  if (r.bf16 && in.vision) ops::round_bf16(ctx, make_mat(vis.f32(), n_image, H));
  auto* valid = static_cast<uint8_t*>(ws.bytes(L));
  std::fill(valid, valid + L, uint8_t{1});
  r.valid = valid;

  // Embeddings; with vision embeddings the image rows take them in order (masked_scatter).
  Mat x = alloc_mat(ws, L, H);
  int64_t k = 0;
  for (int64_t i = 0; i < L; ++i) {
    if (in.vision && in.ids[i] == c.image_token_id) {
      std::memcpy(x.row(i), vis.f32() + k * H, static_cast<size_t>(H) * sizeof(float));
      ++k;
    } else {
      qwen3::embed_row(w.embed, in.ids[i], x.row(i));
    }
  }
  qwen3::round_if_bf16(r, x);
  if (trace) {
    trace->inputs_embeds = qwen3::copy_out(x);
    trace->layers.clear();
  }
  qwen3::trace_rows(ctx, "inputs_embeds", x);
  for (int64_t l = 0; l < tc.num_hidden_layers; ++l) {
    qwen3::decoder_layer(r, w.layers[static_cast<size_t>(l)], x);
    if (trace) trace->layers.push_back(qwen3::copy_out(x));
    qwen3::trace_rows(ctx, "layers." + std::to_string(l), x);
  }
  Mat n = alloc_mat(ws, L, H);
  qwen3::rms_norm(r, x, w.norm, n);
  qwen3::round_if_bf16(r, n);
  qwen3::trace_rows(ctx, "norm", n);
  return qwen3::copy_out(n);
}

}  // namespace flowkv::qwen25_vl
