// The Qwen3-VL language model: loading (the model.language_model.* part of the checkpoint), the
// 3-D positions (get_rope_index), interleaved MRoPE tables and the forward
// (transformers modeling_qwen3_vl.py Qwen3VLModel.forward and Qwen3VLTextModel.forward).
#include "models/qwen3_vl/text_model.h"

#include <algorithm>
#include <cstring>
#include <filesystem>

#include "core/checked.h"
#include "core/memory.h"
#include "flowkv/error.h"
#include "flowkv/limits.h"
#include "io/mapped_file.h"
#include "models/common/blocks.h"
#include "models/common/vit.h"
#include "models/qwen3/decoder.h"
#include "models/qwen3/weights.h"
#include "ops/linear.h"
#include "ops/ops.h"

namespace flowkv::qwen3_vl {

namespace fs = std::filesystem;
using qwen3::GlobalW;

// The decoder's key prefix in a Qwen3VLForConditionalGeneration checkpoint.
static const std::string kPrefix = "model.language_model.";

struct TextModel::Weights {
  Config cfg;
  DType compute = DType::kF32;
  Tensor embed;  // [vocab, H] as stored (a view of the mapped file)
  std::vector<qwen3::LayerWeights> layers;
  std::vector<float> norm;  // the final norm (hidden_states[N] only)
};

namespace {

// The language model's table: embeddings, layers and the final norm (read only for
// hidden_state(N): Qwen-Image 2.1 takes the norm's input). lm_head is left out like the vision
// tower.
std::vector<ExpectedTensor> text_table(const Config& c) {
  return qwen3::needed_table(c.text, c.text.num_hidden_layers, kPrefix);
}

std::map<std::string, TensorInfo> text_tensors(const std::map<std::string, TensorInfo>& all) {
  std::map<std::string, TensorInfo> out;
  for (const auto& [name, info] : all) {
    if (name.starts_with(kPrefix)) out.emplace(name, info);
  }
  return out;
}

// The axis (0: t, 1: h, 2: w) that drives rotary frequency i: Qwen3VLTextRotaryEmbedding.
// recomposition_frequencies keeps t's frequencies and overwrites slice(1, 3*s[1], 3) with h's
// and slice(2, 3*s[2], 3) with w's.
int axis_of(const Config& c, int64_t i) {
  if (i % 3 == 1 && i < 3 * c.mrope_section[1]) return 1;
  if (i % 3 == 2 && i < 3 * c.mrope_section[2]) return 2;
  return 0;
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

// Checks the vision outputs against the ids' image rows (shapes only: nothing is allocated).
void check_vision(const Config& c, const TextInputs& in, int64_t n_image) {
  const int64_t H = c.text.hidden_size;
  if (n_image == 0) {
    FLOWKV_CHECK(!in.vision || !in.vision->embeds.defined() || in.vision->embeds.numel() == 0,
                 "qwen3_vl encode: vision outputs given, but the ids hold no <|image_pad|> token "
                 "(id ",
                 c.image_token_id, ")");
    return;
  }
  FLOWKV_CHECK(in.vision && in.vision->embeds.defined(), "qwen3_vl encode: the ids hold ", n_image,
               " <|image_pad|> tokens but no vision outputs were given");
  auto check = [&](const Tensor& t, const std::string& what) {
    FLOWKV_CHECK(t.defined() && t.shape() == (Shape{n_image, H}), "qwen3_vl encode: ", what,
                 " has shape ", t.defined() ? shape_str(t.shape()) : std::string("(none)"),
                 ", expected [", n_image, ", ", H, "] (one row per <|image_pad|> token)");
  };
  check(in.vision->embeds, "the vision embeddings");
  for (size_t k = 0; k < in.vision->deepstack.size(); ++k) {
    check(in.vision->deepstack[k], "deepstack feature " + std::to_string(k));
  }
}

// The vision outputs widened to f32 (copies: bf16 rounding may change them).
struct Vision {
  Tensor embeds;
  std::vector<Tensor> deepstack;
};
Vision widen_vision(const TextInputs& in, int64_t n_image) {
  Vision v;
  if (n_image == 0) return v;
  v.embeds = in.vision->embeds.to_f32();
  for (const Tensor& t : in.vision->deepstack) v.deepstack.push_back(t.to_f32());
  return v;
}

}  // namespace

std::vector<int64_t> rope_positions(const Config& c, std::span<const int32_t> ids,
                                    std::span<const Grid> grids) {
  return vit::mrope_positions(ids, grids, c.image_token_id, c.video_token_id, c.spatial_merge_size,
                              "qwen3_vl");
}

TextModel TextModel::load(const std::string& path, const LoadOptions& opts) {
  const std::string sub = (fs::path(path) / "text_encoder").string();
  const bool pipeline = !path_exists((fs::path(path) / "config.json").string()) &&
                        path_exists((fs::path(sub) / "config.json").string());
  const std::string dir = pipeline ? sub : path;
  const CheckpointScan scan = scan_checkpoint(dir);
  FLOWKV_CHECK(scan.config.has_value(), scan.path,
               ": a Qwen3-VL text encoder needs its config.json (transformers' Qwen3VLConfig)");
  const Config cfg = Config::from_json(*scan.config, scan.path + "/config.json");
  return from_scan(scan, cfg, opts);
}

TextModel TextModel::from_scan(const CheckpointScan& scan, const Config& cfg,
                               const LoadOptions& opts) {
  const auto tensors = text_tensors(scan.tensors);
  const std::vector<ExpectedTensor> table = text_table(cfg);
  const std::vector<std::string> problems = check_against_table(tensors, table);
  if (!problems.empty()) {
    fail(format_problems(
        scan.path + " does not hold the language model (" + kPrefix + "*) of its Qwen3-VL config",
        problems));
  }
  std::vector<ExpectedTensor> needed = table;
  const std::string norm_name = qwen3::weight_name(GlobalW::kNorm, kPrefix);
  std::erase_if(needed, [&](const ExpectedTensor& e) { return e.name == norm_name; });
  const DType compute = qwen3::choose_compute(tensors, needed, opts.auto_dtype, opts.compute);
  const std::string embed_name = qwen3::weight_name(GlobalW::kEmbedTokens, kPrefix);
  check_weights_fit(
      needed,
      [&](const ExpectedTensor& e) {
        const TensorInfo& t = tensors.at(e.name);
        if (e.name == embed_name) return dtype_bytes(t.dtype, shape_numel(e.shape));
        return ops::held_weight_bytes(t.dtype, e.shape, compute);
      },
      "Qwen3-VL text model");

  CheckpointReader reader(scan);
  auto w = std::make_shared<Weights>();
  w->cfg = cfg;
  w->compute = compute;
  const ops::Compute dt{compute, opts.int8};
  w->embed = reader.get(embed_name);
  for (int64_t l = 0; l < cfg.text.num_hidden_layers; ++l) {
    w->layers.push_back(qwen3::load_layer(reader, cfg.text, kPrefix, l, dt, opts.keep_plain));
  }
  w->norm = qwen3::load_vector(reader, norm_name);
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
int64_t TextModel::weight_bytes() const {
  int64_t b = w_->embed.nbytes();
  for (const qwen3::LayerWeights& l : w_->layers) b += l.bytes();
  return b;
}

Tensor TextModel::forward(const ExecContext& ctx, const TextInputs& in, TextTrace* trace) const {
  return run(ctx, in, w_->cfg.text.num_hidden_layers, false, trace);
}

Tensor TextModel::hidden_state(const ExecContext& ctx, const TextInputs& in, int64_t index) const {
  const int64_t n = w_->cfg.text.num_hidden_layers;
  FLOWKV_CHECK(index >= -(n + 1) && index <= n, "qwen3_vl encode: hidden state index ", index,
               " is outside [", -(n + 1), ", ", n, "] (", n + 1, " hidden states for ", n,
               " layers)");
  const int64_t k = index < 0 ? n + 1 + index : index;
  return run(ctx, in, k, k == n, nullptr);
}

Tensor TextModel::run(const ExecContext& ctx, const TextInputs& in, int64_t layers, bool final_norm,
                      TextTrace* trace) const {
  const Weights& w = *w_;
  const Config& c = w.cfg;
  const qwen3::Config& tc = c.text;
  FLOWKV_CHECK(ctx.arena, "qwen3_vl encode: the execution context has no workspace arena");
  const int64_t L = static_cast<int64_t>(in.ids.size());
  FLOWKV_CHECK(L >= 1, "qwen3_vl encode: no token ids");
  FLOWKV_CHECK(L <= limits::kMaxTokens, "qwen3_vl encode: ", L, " tokens exceed the limit of ",
               limits::kMaxTokens);
  int64_t n_image = 0;
  for (int64_t i = 0; i < L; ++i) {
    FLOWKV_CHECK(in.ids[i] >= 0 && in.ids[i] < tc.vocab_size, "qwen3_vl encode: token id ",
                 in.ids[i], " at position ", i, " is outside the vocabulary [0, ", tc.vocab_size,
                 ")");
    n_image += in.ids[i] == c.image_token_id;
  }
  check_vision(c, in, n_image);
  if (!in.attention_mask.empty()) {
    FLOWKV_CHECK(static_cast<int64_t>(in.attention_mask.size()) == L,
                 "qwen3_vl encode: ", in.attention_mask.size(), " attention-mask values for ", L,
                 " tokens");
    FLOWKV_CHECK(n_image == 0,
                 "qwen3_vl encode: an attention mask with image tokens is not supported (the "
                 "positions would skip the padding: get_rope_index)");
    for (uint8_t m : in.attention_mask) {
      FLOWKV_CHECK(m <= 1, "qwen3_vl encode: attention-mask values must be 0 or 1, got ", int{m});
    }
  }
  const int64_t n_vision = n_image > 0 ? 1 + static_cast<int64_t>(in.vision->deepstack.size()) : 0;
  // One layer's activations, the RoPE tables, the positions, the f32 copies of the vision
  // outputs (n_vision tensors of at most L rows) and a trace, checked before any is allocated.
  qwen3::check_encoder_memory(c.text, L, n_vision, trace != nullptr, "qwen3_vl encode activations");
  const std::vector<int64_t> pos = rope_positions(c, in.ids, in.grids);
  Vision vis = widen_vision(in, n_image);

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
  if (r.bf16 && n_image > 0) {  // transformers casts the vision outputs to the text model's dtype
    ops::round_bf16(ctx, make_mat(vis.embeds.f32(), n_image, H));
    for (Tensor& t : vis.deepstack) ops::round_bf16(ctx, make_mat(t.f32(), n_image, H));
  }
  auto* valid = static_cast<uint8_t*>(ws.bytes(L));
  if (in.attention_mask.empty()) {
    std::fill(valid, valid + L, uint8_t{1});
  } else {
    std::copy(in.attention_mask.begin(), in.attention_mask.end(), valid);
  }
  r.valid = valid;

  // Embeddings; the image rows take the vision embeddings in order (masked_scatter).
  std::vector<int64_t> image_rows;
  image_rows.reserve(static_cast<size_t>(n_image));
  Mat x = alloc_mat(ws, L, H);
  for (int64_t i = 0; i < L; ++i) {
    if (in.ids[i] == c.image_token_id) {
      const int64_t k = static_cast<int64_t>(image_rows.size());
      std::memcpy(x.row(i), vis.embeds.f32() + k * H, static_cast<size_t>(H) * sizeof(float));
      image_rows.push_back(i);
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
  for (int64_t l = 0; l < layers; ++l) {
    qwen3::decoder_layer(r, w.layers[static_cast<size_t>(l)], x);
    if (trace) trace->layers.push_back(qwen3::copy_out(x));
    const std::string name = "layers." + std::to_string(l);
    qwen3::trace_rows(ctx, name, x);
    if (l + 1 == layers && layers < tc.num_hidden_layers) break;  // hidden_states[l + 1]
    // Deepstack: feature l is added to the image rows after layer l (extra features, past the
    // last layer, are ignored as transformers ignores them).
    if (l < static_cast<int64_t>(vis.deepstack.size())) {
      const float* ds = vis.deepstack[static_cast<size_t>(l)].f32();
      for (size_t k = 0; k < image_rows.size(); ++k) {
        float* row = x.row(image_rows[k]);
        const float* add = ds + static_cast<int64_t>(k) * H;
        for (int64_t h = 0; h < H; ++h) row[h] += add[h];
      }
      qwen3::round_if_bf16(r, x);
      qwen3::trace_rows(ctx, name + ".deepstack", x);
    }
  }
  if (final_norm) {
    Mat y = alloc_mat(ws, L, H);
    qwen3::rms_norm(r, x, w.norm, y);
    qwen3::round_if_bf16(r, y);
    return qwen3::copy_out(y);
  }
  return qwen3::copy_out(x);
}

}  // namespace flowkv::qwen3_vl
