// The Qwen3 decoder layer, shared by the Qwen3 text encoder (FLUX.2 Klein, model.h), the
// Qwen3-VL language model (Qwen-Image 2.1, models/qwen3_vl/text_model.h) and, in its Qwen2 form
// (Config::attention_bias, no qk_norm), the Qwen2.5-VL one (Qwen-Image, models/qwen25_vl): they
// run the same layer (transformers' Qwen3DecoderLayer and Qwen3VLTextDecoderLayer are the same
// computation; Qwen2_5_VLDecoderLayer is it with biased q/k/v and no q/k norm) and differ in their
// weight-name prefix, their RoPE tables and what they do between layers. Internal to src/models: no
// public API.
#pragma once

#include <cmath>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/arena.h"
#include "core/exec_context.h"
#include "core/mat.h"
#include "flowkv/tensor.h"
#include "io/checkpoint.h"
#include "models/qwen3/config.h"
#include "ops/linear.h"

namespace flowkv::qwen3 {

struct LayerWeights {
  ops::Linear qkv;      // q_proj|k_proj|v_proj stacked: [Wq + 2 Wkv, H]
  ops::Linear o;        // [H, Wq]
  ops::Linear gate_up;  // gate_proj|up_proj stacked: [2F, H]
  ops::Linear down;     // [H, F]
  std::vector<float> input_norm, post_norm, q_norm, k_norm;

  int64_t bytes() const;  // as held (linears packed, norms f32)
};

// Layer `layer` of a checkpoint whose decoder keys start with `prefix` ("model." for Qwen3,
// "model.language_model." for Qwen3-VL). `c` says which tensors a layer has (has_weight).
LayerWeights load_layer(const CheckpointReader& reader, const Config& c, const std::string& prefix,
                        int64_t layer, ops::Compute dt, bool keep_plain);

// f32 RMSNorm weights (any stored dtype widened).
std::vector<float> load_vector(const CheckpointReader& reader, const std::string& name);

// The compute type of the linear layers: BF16 when `auto_dtype` and every needed weight is stored
// as BF16, else `compute`.
DType choose_compute(const std::map<std::string, TensorInfo>& tensors,
                     const std::vector<ExpectedTensor>& needed, bool auto_dtype, DType compute);

// transformers' default RoPE inverse frequencies in f32: inv_freq[i] = 1 / theta^(2i/head_dim),
// i < head_dim / 2.
std::vector<float> rope_inv_freq(const Config& c);

// One row of the RoPE tables, both halves equal (cat((freqs, freqs))): cos/sin of
// angle[i] = float(position[i]) * inv_freq[i], the position read per frequency (the same for
// every i in plain RoPE, per axis in Qwen3-VL's MRoPE).
template <class PositionOf>
void rope_row(const std::vector<float>& inv, PositionOf position_of, float* cos, float* sin) {
  const size_t half = inv.size();
  for (size_t i = 0; i < half; ++i) {
    const float a = static_cast<float>(position_of(i)) * inv[i];
    const float cs = static_cast<float>(std::cos(double{a}));
    const float sn = static_cast<float>(std::sin(double{a}));
    cos[i] = cos[half + i] = cs;
    sin[i] = sin[half + i] = sn;
  }
}

// Row `id` of an embedding table (any stored dtype), widened to f32.
void embed_row(const Tensor& table, int64_t id, float* out);

// Everything one forward shares. Activations are [B*L, C] matrices (core/mat.h).
struct DecoderRun {
  const ExecContext& ec;
  const Config& cfg;
  Arena& ws;
  int64_t B, L, M;             // batch, tokens per element, M = B*L rows
  bool bf16;                   // round activations to bf16 where torch holds a bf16 model's in bf16
  const float* cos = nullptr;  // RoPE tables [L, head_dim] (both halves filled)
  const float* sin = nullptr;
  const uint8_t* valid = nullptr;  // [B, L] key mask (1: attend)
};

// x = RMSNorm(x) * weight, into y (Qwen3RMSNorm over each row).
void rms_norm(const DecoderRun& r, Mat x, const std::vector<float>& weight, Mat y);

// Rounds m to bf16 values when the run computes in bf16.
void round_if_bf16(const DecoderRun& r, Mat m);

// One decoder layer, in place on x [M, H]: x += o_proj(attn(q_norm/k_norm + RoPE)) (Qwen2:
// biased q/k/v, no q/k norm);
// x += down(SiLU(gate) * up). Causal attention over each batch element, keys masked by `valid`.
void decoder_layer(const DecoderRun& r, const LayerWeights& lw, Mat x);

// A vision-language encoder's activations checked against the memory budget before any is
// allocated: one decoder layer's over L rows, the RoPE tables, the positions, `vision_copies`
// [L, hidden] copies of image features, and with `trace` every layer's output. `what` names it.
void check_encoder_memory(const Config& t, int64_t L, int64_t vision_copies, bool trace,
                          const std::string& what);
// x as an owned f32 [rows, cols] tensor.
Tensor copy_out(Mat x);
// The tracer's copy of x under `name` (only when one is attached and wants it).
void trace_rows(const ExecContext& ec, const std::string& name, Mat x);

}  // namespace flowkv::qwen3
