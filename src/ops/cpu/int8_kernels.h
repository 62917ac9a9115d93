// Between the int8 Linear driver (int8_linear.cc) and its per-instruction-set kernels, each in
// its own file compiled for that instruction set (int8_linear_avx2.cc, int8_linear_vnni.cc).
#pragma once

#include <cstdint>

#include "ops/int8_linear.h"

namespace flowkv::ops::int8 {

// Activations of one call, quantized: rows padded with zero rows (scale 0) to a multiple of the
// kernel's row tile, each row `blocks` blocks of `block_stride` values (zero padded).
struct Act {
  const int8_t* s = nullptr;     // [rows][row_stride] the values q
  const uint8_t* u = nullptr;    // [rows][row_stride] |q| (AVX2) or q + 128 (VNNI)
  const float* scale = nullptr;  // [rows][blocks]
  int64_t row_stride = 0;        // blocks * block_stride
};

// Accumulates the rows [m0, m0 + rows) (rows: a multiple of the kernel's row tile) times the
// weight panels [p0, p1) into c: c[r][(p - p0) * kPanel + j] for row m0 + r and output
// p * kPanel + j, ldc floats from one row to the next. c is overwritten (starts from 0.0f).
using GemmFn = void (*)(const Act& a, const Int8Weights& w, int64_t m0, int64_t rows, int64_t p0,
                        int64_t p1, float* c, int64_t ldc);

// Quantizes rows [0, rows) of x (row i at x + i * x_stride, k values) into s/u/scale as laid out
// in Act; `offset`: u = q + 128 instead of |q|. Bit-identical to quantize_block_int8.
using QuantizeFn = void (*)(const float* x, int64_t x_stride, int64_t rows, const Int8Weights& w,
                            bool offset, int8_t* s, uint8_t* u, float* scale);

inline constexpr int64_t kRowsAvx2 = 4;  // row tile of the AVX2 kernel
inline constexpr int64_t kRowsVnni = 8;  // row tile of the AVX-512 VNNI kernel

void gemm_avx2(const Act& a, const Int8Weights& w, int64_t m0, int64_t rows, int64_t p0, int64_t p1,
               float* c, int64_t ldc);
void quantize_avx2(const float* x, int64_t x_stride, int64_t rows, const Int8Weights& w,
                   bool offset, int8_t* s, uint8_t* u, float* scale);
void gemm_vnni(const Act& a, const Int8Weights& w, int64_t m0, int64_t rows, int64_t p0, int64_t p1,
               float* c, int64_t ldc);

}  // namespace flowkv::ops::int8
