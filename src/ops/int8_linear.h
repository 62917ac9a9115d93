// Int8 Linear: y = x · Wᵀ with W quantized to 8 bits at load and x quantized per row block at
// run time, multiplied as integers and rescaled in f32.
//
// Quantization (weights and activations alike): K is cut into blocks of kInt8Block values (the
// whole K when shorter; the last block may be shorter than the others). Each (row, block) gets
// the scale s = absmax / 127 and values q = round-to-nearest-even(v / s), clamped to [-127, 127]
// (an all-zero block has s = 0 and q = 0).
//
// The product is, for every output,
//   y[m][n] = sum over blocks b, in order from 0, of (sx[m][b] * sw[n][b]) * float(dot_b)
// accumulated in f32 from 0.0f, each step a multiply then an add (no fused multiply-add),
// where dot_b is the exact int32 dot product of the block's values. The fast kernels and the
// scalar reference perform exactly these float operations, so they agree bit for bit, and the
// result does not depend on the thread count or the tiling.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "core/exec_context.h"
#include "core/mat.h"

namespace flowkv::ops {

inline constexpr int64_t kInt8Block = 256;  // values of K per quantization block

// Weights quantized and packed for the kernels. Layout (kernel-private; read through value()):
// columns of W (output rows) in panels of kPanel, each panel block by block, each block as
// groups of 4 consecutive K values for the panel's kPanel outputs ([quad][output][4] int8),
// zero padded to whole panels and whole quads.
struct Int8Weights {
  static constexpr int64_t kPanel = 16;

  int64_t n = 0;             // output features (rows of W)
  int64_t k = 0;             // input features
  int64_t block = 0;         // K values per block (kInt8Block, or k when shorter)
  int64_t blocks = 0;        // ceil(k / block)
  int64_t block_stride = 0;  // block rounded up to a multiple of 4 (packed bytes per block)
  int64_t panels = 0;        // ceil(n / kPanel)

  // [panels][blocks][block_stride / 4][kPanel][4]
  std::shared_ptr<std::vector<int8_t>> values;
  // [panels][blocks][kPanel]: sw, and the sum of the block's values (for offset arithmetic).
  std::shared_ptr<std::vector<float>> scales;
  std::shared_ptr<std::vector<int32_t>> sums;

  bool empty() const { return n == 0; }
  int64_t packed_bytes() const;
  // The quantized value of W[row][col], and the scale of (row, block b).
  int8_t value(int64_t row, int64_t col) const;
  float scale(int64_t row, int64_t b) const;
};

// w: [n, k] row-major f32.
Int8Weights quantize_weights_int8(const float* w, int64_t n, int64_t k);

// Quantizes one block of `len` values into q (symmetric, as above); returns its scale.
float quantize_block_int8(const float* x, int64_t len, int8_t* q);

// Instruction sets of the integer kernels, chosen at run time (one binary).
enum class Int8Isa { kScalar, kAvx2, kAvx512Vnni };
Int8Isa int8_best_isa();  // the fastest this CPU runs
bool int8_isa_supported(Int8Isa isa);
const char* int8_isa_name(Int8Isa isa);

// y[M, N] = x[M, K] · Wᵀ. x and y may be strided views; they must not overlap. Scratch comes
// from ctx.arena when it has one. ctx.kernels == kReference runs int8_linear_reference.
void int8_linear(const ExecContext& ctx, Mat x, const Int8Weights& w, Mat y);
// The same on a given instruction set (tests; fails with an error if this CPU lacks it).
void int8_linear_on(Int8Isa isa, const ExecContext& ctx, Mat x, const Int8Weights& w, Mat y);
// Scalar loops doing the same float operations in the same order.
void int8_linear_reference(Mat x, const Int8Weights& w, Mat y);

}  // namespace flowkv::ops
