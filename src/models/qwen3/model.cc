// The Qwen3 encoder: loading (validate against the name table, then build the linear layers
// of the layers needed) and the forward (transformers modeling_qwen3.py, Qwen3Model.forward).
// Shapes in PyTorch order; activations are [B*L, C] matrices (core/mat.h).
#include "models/qwen3/model.h"

#include <algorithm>
#include <cstring>
#include <filesystem>

#include "core/checked.h"
#include "core/memory.h"
#include "flowkv/error.h"
#include "flowkv/limits.h"
#include "io/mapped_file.h"
#include "models/common/blocks.h"
#include "models/qwen3/decoder.h"
#include "models/qwen3/weights.h"
#include "ops/linear.h"
#include "ops/ops.h"

namespace flowkv::qwen3 {

struct Encoder::Weights {
  Config cfg;
  DType compute = DType::kF32;
  int64_t last = 0;         // highest hidden-state index computable
  Tensor embed;             // [vocab, H] as stored (a view of the mapped file)
  std::vector<float> norm;  // final norm, only when last == num_hidden_layers
  std::vector<LayerWeights> layers;
};

namespace {

namespace fs = std::filesystem;

// lm_head is never read: present or not (tied embeddings), it is left out of the checks.
std::map<std::string, TensorInfo> without_lm_head(const std::map<std::string, TensorInfo>& t) {
  auto out = t;
  out.erase(weight_name(GlobalW::kLmHead));
  return out;
}

std::vector<ExpectedTensor> table_without_lm_head(const Config& c) {
  auto t = weight_table(c);
  std::erase_if(t, [](const ExpectedTensor& e) { return e.name == weight_name(GlobalW::kLmHead); });
  return t;
}

// Plain RoPE: position p on every frequency, tables [L, hd].
void rope_tables(const Config& c, int64_t seq, float* cos, float* sin) {
  const std::vector<float> inv = rope_inv_freq(c);
  for (int64_t p = 0; p < seq; ++p) {
    rope_row(
        inv, [p](size_t) { return p; }, cos + p * c.head_dim, sin + p * c.head_dim);
  }
}

void check_args(const Config& c, const EncodeArgs& a, size_t outputs) {
  const int64_t n = static_cast<int64_t>(a.ids.size());
  FLOWKV_CHECK(a.batch >= 1, "qwen3 encode: batch ", a.batch, " must be at least 1");
  FLOWKV_CHECK(n > 0 && n % a.batch == 0, "qwen3 encode: ", n, " token ids do not make ", a.batch,
               " equal rows");
  FLOWKV_CHECK(n <= limits::kMaxTokens, "qwen3 encode: ", n,
               " tokens (all rows together) exceed the limit of ", limits::kMaxTokens);
  FLOWKV_CHECK(a.mask.empty() || a.mask.size() == a.ids.size(), "qwen3 encode: the mask has ",
               a.mask.size(), " entries for ", n, " token ids");
  const int64_t L = n / a.batch;
  for (int64_t i = 0; i < n; ++i) {
    FLOWKV_CHECK(a.ids[i] >= 0 && a.ids[i] < c.vocab_size, "qwen3 encode: token id ", a.ids[i],
                 " at row ", i / L, ", position ", i % L, " is outside the vocabulary [0, ",
                 c.vocab_size, ")");
    FLOWKV_CHECK(a.mask.empty() || a.mask[i] == 0 || a.mask[i] == 1,
                 "qwen3 encode: attention mask value ", a.mask[i], " at row ", i / L, ", position ",
                 i % L, " is not 0 or 1");
  }
  // Activations of one layer (x, the norm, q|k|v, attention, projection, gate|up, SwiGLU), the
  // RoPE tables and the hidden states returned, checked before any of them is allocated.
  const std::string what = "qwen3 encode activations";
  const int64_t per_row =
      c.hidden_size * 3 + c.q_width() * 2 + c.kv_width() * 2 + c.intermediate_size * 3;
  int64_t floats = checked_mul(n, per_row, what);
  floats = checked_add(floats, checked_mul(2 * L, c.head_dim, what), what);
  const int64_t states = checked_mul(n, c.hidden_size, what);
  floats = checked_add(floats, checked_mul(states, static_cast<int64_t>(outputs), what), what);
  check_memory(checked_mul(floats, 4, what), what, "encode fewer or shorter prompts");
}

}  // namespace

Encoder Encoder::load(const std::string& path, const LoadOptions& opts) {
  // A pipeline folder holds its encoder in text_encoder/ (stat-based checks: nothing throws).
  const std::string sub = (fs::path(path) / "text_encoder").string();
  const bool pipeline = !path_exists((fs::path(path) / "config.json").string()) &&
                        path_exists((fs::path(sub) / "config.json").string());
  const std::string dir = pipeline ? sub : path;
  const CheckpointScan scan = scan_checkpoint(dir);
  FLOWKV_CHECK(scan.config.has_value(), scan.path,
               ": a Qwen3 text encoder needs its config.json (transformers' Qwen3Config)");
  const Config cfg = Config::from_json(*scan.config, scan.path + "/config.json");
  return from_scan(scan, cfg, opts);
}

Encoder Encoder::from_scan(const CheckpointScan& scan, const Config& cfg, const LoadOptions& opts) {
  const int64_t last = opts.last_hidden_state < 0 ? cfg.num_hidden_layers : opts.last_hidden_state;
  FLOWKV_CHECK(last <= cfg.num_hidden_layers, scan.path, ": hidden state ", last,
               " asked for, but the model has only ", cfg.num_hidden_layers, " layers (indices 0..",
               cfg.num_hidden_layers, ")");
  const auto tensors = without_lm_head(scan.tensors);
  const std::vector<std::string> problems =
      check_against_table(tensors, table_without_lm_head(cfg));
  if (!problems.empty()) {
    fail(
        format_problems(scan.path + " does not hold a Qwen3 text encoder of its config", problems));
  }
  const std::vector<ExpectedTensor> needed = needed_table(cfg, last);
  const DType compute = choose_compute(tensors, needed, opts.auto_dtype, opts.compute);
  const std::string embed_name = weight_name(GlobalW::kEmbedTokens);
  check_weights_fit(
      needed,
      [&](const ExpectedTensor& e) {
        const TensorInfo& t = tensors.at(e.name);
        // The embedding table stays as stored (rows are widened when looked up).
        if (e.name == embed_name) return dtype_bytes(t.dtype, shape_numel(e.shape));
        return ops::held_weight_bytes(t.dtype, e.shape, compute);
      },
      variant_name(cfg));

  CheckpointReader reader(scan);
  auto w = std::make_shared<Weights>();
  w->cfg = cfg;
  w->compute = compute;
  w->last = last;
  const ops::Compute dt{compute, opts.int8};
  w->embed = reader.get(embed_name);
  for (int64_t l = 0; l < std::min(last, cfg.num_hidden_layers); ++l) {
    w->layers.push_back(load_layer(reader, cfg, kPrefix, l, dt, opts.keep_plain));
  }
  if (last == cfg.num_hidden_layers) w->norm = load_vector(reader, weight_name(GlobalW::kNorm));
  Encoder e;
  e.w_ = std::move(w);
  return e;
}

const Config& Encoder::config() const {
  return w_->cfg;
}
DType Encoder::compute_dtype() const {
  return w_->compute;
}
int64_t Encoder::last_hidden_state() const {
  return w_->last;
}

int64_t Encoder::weight_bytes() const {
  int64_t b = w_->embed.nbytes() + static_cast<int64_t>(w_->norm.size()) * 4;
  for (const LayerWeights& l : w_->layers) b += l.bytes();
  return b;
}

std::vector<Tensor> Encoder::hidden_states(const ExecContext& ctx, const EncodeArgs& args,
                                           std::span<const int64_t> indices) const {
  const Weights& w = *w_;
  const Config& c = w.cfg;
  FLOWKV_CHECK(ctx.arena, "qwen3 encode: the execution context has no workspace arena");
  FLOWKV_CHECK(!indices.empty(), "qwen3 encode: no hidden state asked for");
  for (int64_t k : indices) {
    FLOWKV_CHECK(k >= 0 && k <= w.last, "qwen3 encode: hidden state ", k,
                 " asked for; this encoder computes indices 0..", w.last,
                 w.last < c.num_hidden_layers ? " (loaded up to that layer)" : "");
  }
  check_args(c, args, indices.size());
  Arena& ws = *ctx.arena;
  ArenaScope scope(ws);
  const int64_t B = args.batch, L = static_cast<int64_t>(args.ids.size()) / B;
  const int64_t hd = c.head_dim;
  DecoderRun r{
      .ec = ctx, .cfg = c, .ws = ws, .B = B, .L = L, .M = B * L, .bf16 = w.compute == DType::kBF16};
  const int64_t H = c.hidden_size;
  float* cos = ws.floats(L * hd);
  float* sin = ws.floats(L * hd);
  rope_tables(c, L, cos, sin);
  if (r.bf16) {  // transformers casts the tables to the activations' dtype
    ops::round_bf16(ctx, make_mat(cos, L, hd));
    ops::round_bf16(ctx, make_mat(sin, L, hd));
  }
  r.cos = cos, r.sin = sin;
  auto* valid = static_cast<uint8_t*>(ws.bytes(B * L));
  for (int64_t i = 0; i < B * L; ++i) valid[i] = args.mask.empty() ? 1 : args.mask[i] != 0;
  r.valid = valid;

  Mat x = alloc_mat(ws, r.M, H);
  for (int64_t i = 0; i < r.M; ++i) embed_row(w.embed, args.ids[i], x.row(i));
  std::vector<Tensor> out(indices.size());
  auto capture = [&](int64_t k, Mat m) {
    for (size_t i = 0; i < indices.size(); ++i) {
      if (indices[i] != k) continue;
      out[i] = Tensor::empty({B, L, H});
      std::memcpy(out[i].f32(), m.data, static_cast<size_t>(r.M * H) * sizeof(float));
    }
  };
  const int64_t stop = *std::max_element(indices.begin(), indices.end());
  capture(0, x);
  for (int64_t l = 0; l < std::min(stop, c.num_hidden_layers); ++l) {
    decoder_layer(r, w.layers[static_cast<size_t>(l)], x);
    if (l + 1 < c.num_hidden_layers) capture(l + 1, x);
  }
  if (stop == c.num_hidden_layers) {
    // The last hidden state is the final norm's output (transformers ties it to
    // last_hidden_state).
    ArenaScope s(ws);
    Mat n = alloc_mat(ws, r.M, H);
    rms_norm(r, x, w.norm, n);
    round_if_bf16(r, n);
    capture(c.num_hidden_layers, n);
  }
  return out;
}

Tensor klein_prompt_embeds(const ExecContext& ctx, const Encoder& enc, const EncodeArgs& args,
                           std::span<const int64_t> layers) {
  const std::vector<Tensor> hs = enc.hidden_states(ctx, args, layers);
  const int64_t B = hs[0].dim(0), L = hs[0].dim(1), H = hs[0].dim(2);
  const int64_t n = static_cast<int64_t>(hs.size());
  Tensor out = Tensor::empty({B, L, n * H});
  for (int64_t t = 0; t < B * L; ++t) {
    for (int64_t i = 0; i < n; ++i) {
      std::memcpy(out.f32() + (t * n + i) * H, hs[static_cast<size_t>(i)].f32() + t * H,
                  static_cast<size_t>(H) * sizeof(float));
    }
  }
  if (enc.compute_dtype() == DType::kBF16) {
    ops::round_bf16(ctx, make_mat(out.f32(), B * L, n * H));
  }
  return out;
}

}  // namespace flowkv::qwen3
