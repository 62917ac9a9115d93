// Between the int8 Linear driver (int8_linear.cc) and its per-instruction-set kernels, each in
// its own file compiled for that instruction set (int8_linear_avx2.cc, int8_linear_vnni.cc).
#pragma once

#include <cstdint>
#include <cstring>

#include "core/mat.h"
#include "ops/int8_linear.h"

namespace flowkv::ops::int8 {

// Activations of one call, quantized and packed for one kernel: rows in tiles of `mr` (the
// kernel's row tile; rows past the input are zero with scale 0), each tile block by block, each
// block quad by quad (4 consecutive K values), each quad holding the tile's rows one after the
// other, 4 bytes per row: q (AVX2) or q + 128 as unsigned bytes (VNNI, `offset`). A micro-kernel
// then reads one stream, in order.
struct Act {
  uint8_t* data = nullptr;  // [rows / mr][blocks][quads][mr][quad_bytes]
  float* scale = nullptr;   // [rows][blocks]
  int64_t mr = 0, quad_bytes = 4, quads = 0, blocks = 0;
  bool offset = false;

  // Start of block b of the tile holding row m (a multiple of mr).
  uint8_t* at(int64_t m, int64_t b) const {
    return data + ((m / mr) * blocks + b) * quads * mr * quad_bytes;
  }
};

// Accumulates the rows [m0, m0 + rows) (rows: a multiple of the kernel's row tile) times the
// weight panels [p0, p1) into c: c[r][(p - p0) * kPanel + j] for row m0 + r and output
// p * kPanel + j, ldc floats from one row to the next. c is overwritten (starts from 0.0f).
using GemmFn = void (*)(const Act& a, const Int8Weights& w, int64_t m0, int64_t rows, int64_t p0,
                        int64_t p1, float* c, int64_t ldc);

// Quantizes rows [r0, r0 + rows) of x into a (rows at or past x.rows as zeros), as
// quantize_block_int8 does, bit for bit.
void pack_rows_avx2(Mat x, int64_t r0, int64_t rows, const Int8Weights& w, const Act& a);

// Four packed int8 values as one int32 (an unaligned load).
inline int32_t load32(const void* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

inline constexpr int64_t kRowsAvx2 = 5;  // row tile of the AVX2 kernel
inline constexpr int64_t kRowsVnni = 8;  // row tile of the AVX-512 VNNI kernel

void gemm_avx2(const Act& a, const Int8Weights& w, int64_t m0, int64_t rows, int64_t p0, int64_t p1,
               float* c, int64_t ldc);
void gemm_vnni(const Act& a, const Int8Weights& w, int64_t m0, int64_t rows, int64_t p0, int64_t p1,
               float* c, int64_t ldc);

}  // namespace flowkv::ops::int8
