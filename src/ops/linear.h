// Linear layer y = x · Wᵀ (no bias; FLUX.2 and Qwen-Image-2.1 have none), through oneDNN matmul.
//
// Weights are reordered once at load into the layout oneDNN asks for, in column chunks. The
// output is computed in tiles (rows x chunks) chosen from the shape alone, each by a
// single-threaded oneDNN call, spread over the threads: every output element is reduced in the
// same order whatever the thread count.
//
// Compute types: F32 weights (f32 x f32 -> f32), or BF16 weights (activations rounded to bf16,
// bf16 x bf16 -> f32 accumulate), as diffusers computes with bf16 checkpoints.
//
// Storage: F32 weights are packed at load (4 bytes each). Narrow weights (BF16, F16 and the
// block-quantized types) stay as stored, 2 bytes or less each, viewing the checkpoint's mapped
// pages when they come from a file (no copy), unless the CPU multiplies bf16 natively (then
// oneDNN packs them as bf16). Inside forward, each thread widens its weights panel by panel
// (a few hundred KB, cache-resident) into f32, exact values, and multiplies the panel: the
// conversion is paid once per panel per call and amortised over the M rows.
#pragma once

#include <memory>
#include <vector>

#include "core/exec_context.h"
#include "core/mat.h"
#include "flowkv/tensor.h"
#include "ops/int8_linear.h"

namespace flowkv::ops {

// How a Linear multiplies: in f32 (F32), with bf16-rounded activations (BF16), or with 8-bit
// integer arithmetic (int8: weights quantized at load, activations per block at run time).
struct Compute {
  DType type = DType::kF32;
  bool int8 = false;
  Compute(DType t, bool i8 = false) : type(t), int8(i8) {}  // NOLINT: a DType is a Compute
};

class Linear {
 public:
  Linear() = default;
  // w: [out_features, in_features], any dtype. `keep_plain` keeps an unpacked copy so the
  // scalar reference path can run (tests); real models leave it off to save memory.
  Linear(const Tensor& w, Compute compute, bool keep_plain = false);
  // Rows [r0, r0 + n) of w only (a slice of a fused projection).
  static Linear rows_of(const Tensor& w, int64_t r0, int64_t n, Compute compute, bool keep_plain);
  // Several weights stacked along the output dimension, as one layer (e.g. to_q|to_k|to_v).
  static Linear stacked(const std::vector<Tensor>& ws, Compute compute, bool keep_plain);

  int64_t in_features() const { return k_; }
  int64_t out_features() const { return n_; }
  DType compute_dtype() const { return compute_; }
  // Bytes the weights occupy (packed, or as stored: a view of mapped pages counts too).
  int64_t packed_bytes() const;
  bool empty() const { return n_ == 0; }

  // Adds a bias [out_features] to every output row (Qwen-Image's layers have biases).
  void set_bias(const Tensor& bias);

  // y[M, N] = x[M, K] · Wᵀ (+ bias). x and y may be strided views; they must not overlap.
  void forward(const ExecContext& ctx, Mat x, Mat y) const;

 private:
  struct Packed;   // one column chunk of the weights in oneDNN's layout
  struct Compact;  // narrow weights as stored, row ranges of one or more tensors
  void init(const std::vector<Tensor>& ws, int64_t r0, int64_t n, Compute compute, bool keep_plain);
  void build(const float* w, int64_t n, int64_t k, DType compute, bool keep_plain);
  bool try_compact(const std::vector<Tensor>& ws, int64_t r0, int64_t n, DType compute,
                   bool keep_plain);
  void forward_reference(Mat x, Mat y) const;
  void forward_compact(const void* src, int64_t lda, Mat y) const;
  void forward_packed(const ExecContext& ctx, const void* src, int64_t lda, Mat y) const;

  int64_t n_ = 0, k_ = 0;
  DType compute_ = DType::kF32;
  std::vector<std::shared_ptr<Packed>> chunks_;
  std::shared_ptr<const Compact> compact_;
  std::shared_ptr<const Int8Weights> int8_;    // int8 compute
  std::shared_ptr<std::vector<float>> plain_;  // [N, K] f32 values, for the reference path
  std::vector<float> bias_;
};

// Whether oneDNN multiplies bf16 natively on this CPU.
bool native_bf16_gemm();

// Whether a Linear keeps weights of this stored type as stored (else packs them as f32).
bool keeps_as_stored(DType stored, DType compute);
// Bytes a loaded weight of this stored type and shape occupies: a matrix (or a 3-D stack of
// them, one Linear each: NucleusMoE-Image's experts) as a Linear holds it, anything else (norm
// scales, biases) as an f32 copy.
int64_t held_weight_bytes(DType stored, const Shape& shape, DType compute);

// Whether Linears built from now on keep narrow weights as stored (default on). Off packs every
// weight as f32 (4 bytes each): the path the tests and benchmarks compare against.
// Process-wide; read when a Linear is built.
void set_compact_weights(bool on);

// The GEMM tile a Linear of this shape uses (exposed for the benchmark and tests).
struct GemmTiles {
  int64_t rows;
  int64_t cols;
};
GemmTiles gemm_tiles(int64_t m, int64_t n, int64_t k);

}  // namespace flowkv::ops
