// The Qwen3 decoder layer (transformers modeling_qwen3.py Qwen3DecoderLayer, identical to
// modeling_qwen3_vl.py Qwen3VLTextDecoderLayer). Shapes in PyTorch order.
#include "models/qwen3/decoder.h"

#include <cstring>

#include "core/checked.h"
#include "core/memory.h"
#include "models/common/blocks.h"
#include "models/qwen3/weights.h"
#include "ops/attention.h"
#include "ops/ops.h"
#include "quant/quant.h"

namespace flowkv::qwen3 {

int64_t LayerWeights::bytes() const {
  return qkv.packed_bytes() + o.packed_bytes() + gate_up.packed_bytes() + down.packed_bytes() +
         static_cast<int64_t>(input_norm.size() + post_norm.size() + q_norm.size() +
                              k_norm.size()) *
             4;
}

std::vector<float> load_vector(const CheckpointReader& reader, const std::string& name) {
  const Tensor f = reader.get(name).to_f32();
  return std::vector<float>(f.f32(), f.f32() + f.numel());
}

LayerWeights load_layer(const CheckpointReader& reader, const Config& c, const std::string& prefix,
                        int64_t layer, ops::Compute dt, bool keep_plain) {
  auto n = [&](LayerW k) { return weight_name(layer, k, prefix); };
  auto stack = [&](std::initializer_list<LayerW> names) {
    std::vector<Tensor> ts;
    for (LayerW k : names) ts.push_back(reader.get(n(k)));
    return ops::Linear::stacked(ts, dt, keep_plain);
  };
  LayerWeights lw;
  lw.input_norm = load_vector(reader, n(LayerW::kInputNorm));
  lw.qkv = stack({LayerW::kQProj, LayerW::kKProj, LayerW::kVProj});
  if (c.attention_bias) {
    std::vector<float> bias;
    for (LayerW k : {LayerW::kQBias, LayerW::kKBias, LayerW::kVBias}) {
      const std::vector<float> b = load_vector(reader, n(k));
      bias.insert(bias.end(), b.begin(), b.end());
    }
    lw.qkv.set_bias(Tensor::from_vector(bias, {static_cast<int64_t>(bias.size())}));
  }
  if (c.qk_norm) {
    lw.q_norm = load_vector(reader, n(LayerW::kQNorm));
    lw.k_norm = load_vector(reader, n(LayerW::kKNorm));
  }
  lw.o = ops::Linear(reader.get(n(LayerW::kOProj)), dt, keep_plain);
  lw.post_norm = load_vector(reader, n(LayerW::kPostAttnNorm));
  lw.gate_up = stack({LayerW::kGateProj, LayerW::kUpProj});
  lw.down = ops::Linear(reader.get(n(LayerW::kDownProj)), dt, keep_plain);
  return lw;
}

DType choose_compute(const std::map<std::string, TensorInfo>& tensors,
                     const std::vector<ExpectedTensor>& needed, bool auto_dtype, DType compute) {
  if (!auto_dtype) return compute;
  for (const ExpectedTensor& e : needed) {
    auto it = tensors.find(e.name);
    if (it == tensors.end() || !it->second.dtype_known || it->second.dtype != DType::kBF16) {
      return DType::kF32;
    }
  }
  return DType::kBF16;
}

std::vector<float> rope_inv_freq(const Config& c) {
  const int64_t hd = c.head_dim, half = hd / 2;
  const float theta = static_cast<float>(c.rope_theta);
  std::vector<float> inv(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i) {
    const float e = static_cast<float>(2 * i) / static_cast<float>(hd);
    inv[i] = 1.0f / static_cast<float>(std::pow(static_cast<double>(theta), double{e}));
  }
  return inv;
}

void embed_row(const Tensor& table, int64_t id, float* out) {
  const int64_t h = table.dim(1), row_bytes = dtype_bytes(table.dtype(), h);
  quant::dequantize_row(table.dtype(), static_cast<const std::byte*>(table.raw()) + id * row_bytes,
                        out, h);
}

void rms_norm(const DecoderRun& r, Mat x, const std::vector<float>& weight, Mat y) {
  copy_rows(x, y);
  ops::rms_norm_rope(r.ec, y, y.cols, weight.data(), static_cast<float>(r.cfg.rms_norm_eps), {});
}

// Torch holds a bf16 model's activations in bf16: with bf16 compute the residual stream and
// q/k/v are rounded where the reference rounds them.
void round_if_bf16(const DecoderRun& r, Mat m) {
  if (r.bf16) ops::round_bf16(r.ec, m);
}

namespace {

// transformers' apply_rotary_pos_emb alone (Qwen2: no q/k norm): per head,
// x[i] * cos[i] - x[i + hd/2] * sin[i] and x[i + hd/2] * cos[i + hd/2] + x[i] * sin[i + hd/2].
void rope_half(Mat x, int64_t hd, const ops::RopeRows& rope) {
  const int64_t n = hd / 2;
  for (int64_t r = 0; r < x.rows; ++r) {
    float* xr = x.row(r);
    const float* c = rope.cos + (r % rope.seq) * hd;
    const float* s = rope.sin + (r % rope.seq) * hd;
    for (int64_t h = 0; h < x.cols / hd; ++h) {
      float* v = xr + h * hd;
      for (int64_t i = 0; i < n; ++i) {
        const float a = v[i], b = v[i + n];
        v[i] = a * c[i] - b * s[i];
        v[i + n] = b * c[i + n] + a * s[i + n];
      }
    }
  }
}

}  // namespace

void decoder_layer(const DecoderRun& r, const LayerWeights& lw, Mat x) {
  const Config& c = r.cfg;
  const int64_t H = c.hidden_size, Wq = c.q_width(), Wkv = c.kv_width(), hd = c.head_dim;
  const int64_t F = c.intermediate_size;
  const float eps = static_cast<float>(c.rms_norm_eps);
  ArenaScope scope(r.ws);
  const int64_t qkv_w = Wq + 2 * Wkv;
  Mat n = alloc_mat(r.ws, r.M, H), qkv = alloc_mat(r.ws, r.M, qkv_w);
  Mat attn = alloc_mat(r.ws, r.M, Wq), y = alloc_mat(r.ws, r.M, H);
  rms_norm(r, x, lw.input_norm, n);
  lw.qkv.forward(r.ec, n, qkv);
  const ops::RopeRows rope{r.cos, r.sin, r.L, true};
  if (c.qk_norm) {
    ops::rms_norm_rope(r.ec, qkv.cols_slice(0, Wq), hd, lw.q_norm.data(), eps, rope);
    ops::rms_norm_rope(r.ec, qkv.cols_slice(Wq, Wkv), hd, lw.k_norm.data(), eps, rope);
  } else {
    rope_half(qkv.cols_slice(0, Wq), hd, rope);
    rope_half(qkv.cols_slice(Wq, Wkv), hd, rope);
  }
  round_if_bf16(r, qkv);
  ops::KVSource kv =
      ops::KVSource::f32(qkv.cols_slice(Wq, Wkv), qkv.cols_slice(Wq + Wkv, Wkv), r.L);
  kv.causal = true;
  kv.valid = r.valid;
  ops::AttnShape shape{r.B, c.num_attention_heads, hd, r.L};
  shape.kv_heads = c.num_key_value_heads;
  ops::attention(r.ec, shape, qkv.cols_slice(0, Wq), {&kv, 1}, attn);
  round_if_bf16(r, attn);
  lw.o.forward(r.ec, attn, y);
  round_if_bf16(r, y);
  ops::gated_add(r.ec, x, y, {});
  round_if_bf16(r, x);

  ArenaScope mlp(r.ws);
  Mat gu = alloc_mat(r.ws, r.M, 2 * F), u = alloc_mat(r.ws, r.M, F);
  rms_norm(r, x, lw.post_norm, n);
  lw.gate_up.forward(r.ec, n, gu);
  round_if_bf16(r, gu);
  ops::swiglu(r.ec, gu, u);
  lw.down.forward(r.ec, u, y);
  round_if_bf16(r, y);
  ops::gated_add(r.ec, x, y, {});
  round_if_bf16(r, x);
}

void check_encoder_memory(const Config& t, int64_t L, int64_t vision_copies, bool trace,
                          const std::string& what) {
  const int64_t per_row =
      t.hidden_size * 4 + t.q_width() * 2 + t.kv_width() * 2 + t.intermediate_size * 3;
  int64_t floats = checked_mul(L, per_row, what);
  floats = checked_add(floats, checked_mul(2 * L, t.head_dim, what), what);
  floats = checked_add(floats,
                       checked_mul(checked_mul(L, t.hidden_size, what), vision_copies, what), what);
  if (trace) {
    floats = checked_add(
        floats, checked_mul(checked_mul(L, t.hidden_size, what), t.num_hidden_layers + 1, what),
        what);
  }
  check_memory(checked_add(checked_mul(floats, 4, what), checked_mul(L, 8 * 3 + 1, what), what),
               what, "encode a shorter prompt or fewer or smaller condition images");
}

Tensor copy_out(Mat x) {
  Tensor t = Tensor::empty({x.rows, x.cols});
  for (int64_t r = 0; r < x.rows; ++r) {
    std::memcpy(t.f32() + r * x.cols, x.row(r), static_cast<size_t>(x.cols) * sizeof(float));
  }
  return t;
}

void trace_rows(const ExecContext& ec, const std::string& name, Mat x) {
  if (ec.tracer && ec.tracer->wants(name)) ec.tracer->record(name, copy_out(x));
}

}  // namespace flowkv::qwen3
