// Vectorised row kernels (Highway, dispatched once at run time to the best instruction set the
// CPU has). Each handles one row; ops/cpu/elementwise.cc spreads rows over threads.
#pragma once

#include <cstdint>

namespace flowkv::ops::cpu {

struct RowKernels {
  void (*layer_norm_modulate)(const float* x, float* y, int64_t n, const float* scale,
                              const float* shift, float eps);
  void (*gated_add)(float* x, const float* y, const float* gate, int64_t n);
  // half: rotate_half pairs (i, i + hd/2) instead of interleaved (2i, 2i+1).
  void (*rms_norm_rope)(float* x, int64_t heads, int64_t hd, const float* w, float eps,
                        const float* cos, const float* sin, bool half);
  void (*swiglu)(const float* in, float* out, int64_t f);
  void (*silu)(const float* x, float* y, int64_t n);
  void (*gelu_tanh)(float* x, int64_t n);
  void (*to_bf16)(const float* x, uint16_t* out, int64_t n);
  void (*round_bf16)(float* x, int64_t n);
};

// The kernels for this CPU (chosen on first use).
const RowKernels& row_kernels();
// Name of the instruction set chosen, e.g. "AVX3" (AVX-512), for reports.
const char* simd_target_name();

}  // namespace flowkv::ops::cpu
