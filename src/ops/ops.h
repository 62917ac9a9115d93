// Elementwise and normalisation ops on [rows, cols] activations. One declaration per op; each
// dispatches on ctx.kernels to the plain scalar reference (ops/ref) or the vectorised, threaded
// kernel (ops/cpu). Rows are independent, so results never depend on the thread count.
//
// "Groups": modulation vectors are per batch element; rows [g*rows_per_group, (g+1)*rows_per_group)
// use row g of a [groups, C] vector table whose rows are `mod_stride` floats apart.
#pragma once

#include <cstdint>

#include "core/exec_context.h"
#include "core/mat.h"

namespace flowkv::ops {

struct ModRows {
  const float* data = nullptr;  // nullptr: the term is absent
  int64_t stride = 0;           // floats between groups (0: one vector for every row)
  int64_t rows_per_group = 1;
  const float* at(int64_t row) const {
    return data ? data + (stride == 0 ? 0 : (row / rows_per_group) * stride) : nullptr;
  }
};

// y = LayerNorm(x) * (1 + scale) + shift; LayerNorm without affine parameters.
// scale and/or shift may be absent (plain LayerNorm, or Qwen-Image-2.1's shift-free form).
void layer_norm_modulate(const ExecContext& ctx, Mat x, Mat y, ModRows scale, ModRows shift,
                         float eps);

// x += gate * y  (gate absent: x += y)
void gated_add(const ExecContext& ctx, Mat x, Mat y, ModRows gate);

// Per head of width hd: x = RMSNorm(x) * weight, then (if cos/sin are given) the rotary
// embedding with row (r % seq) of the [seq, hd] cos and sin tables. Pairs are interleaved
// (2i, 2i+1) (FLUX.2, Qwen-Image), or with `half` the two halves (i, i + hd/2), as transformers'
// rotate_half (LLaMA, Qwen3): x[i]*cos[i] - x[i+hd/2]*sin[i] and x[i+hd/2]*cos[i+hd/2] +
// x[i]*sin[i+hd/2].
struct RopeRows {
  const float* cos = nullptr;
  const float* sin = nullptr;
  int64_t seq = 1;  // rows per batch element; table row = r % seq
  bool half = false;
};
void rms_norm_rope(const ExecContext& ctx, Mat x, int64_t head_dim, const float* weight, float eps,
                   RopeRows rope);

// out = SiLU(in[:, :F]) * in[:, F:2F], F = out.cols (FLUX.2's gate-first SwiGLU).
void swiglu(const ExecContext& ctx, Mat in, Mat out);

// y = SiLU(x), elementwise over n values.
void silu(const ExecContext& ctx, const float* x, float* y, int64_t n);

// x = GELU(x) with the tanh approximation (PyTorch approximate="tanh"), in place.
void gelu_tanh(const ExecContext& ctx, Mat x);

// x = GELU(x) with erf, exact (PyTorch nn.GELU(), approximate="none"), in place.
void gelu_erf(const ExecContext& ctx, Mat x);

// Round-to-nearest-even to bf16: into a packed [rows, cols] bf16 buffer, or in place (f32 values
// that bf16 can hold exactly).
void to_bf16(const ExecContext& ctx, Mat x, uint16_t* out);
void round_bf16(const ExecContext& ctx, Mat x);

// Scalar references (single-threaded), exposed for the op tests.
namespace ref {
void layer_norm_modulate(Mat x, Mat y, ModRows scale, ModRows shift, float eps);
void gated_add(Mat x, Mat y, ModRows gate);
void rms_norm_rope(Mat x, int64_t head_dim, const float* weight, float eps, RopeRows rope);
void swiglu(Mat in, Mat out);
void silu(const float* x, float* y, int64_t n);
void gelu_tanh(Mat x);
void gelu_erf(Mat x);
void to_bf16(Mat x, uint16_t* out);
void round_bf16(Mat x);
}  // namespace ref

}  // namespace flowkv::ops
