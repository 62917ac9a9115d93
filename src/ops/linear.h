// Linear layer y = x · Wᵀ (no bias; FLUX.2 and Qwen-Image-2.1 have none), through oneDNN matmul.
//
// Weights are reordered once at load into the layout oneDNN asks for, in column chunks. The
// output is computed in tiles (rows x chunks) chosen from the shape alone, each by a
// single-threaded oneDNN call, spread over the threads: every output element is reduced in the
// same order whatever the thread count.
//
// Compute types: F32 weights (f32 x f32 -> f32), or BF16 weights (activations rounded to bf16,
// bf16 x bf16 -> f32 accumulate), as diffusers computes with bf16 checkpoints.
#pragma once

#include <memory>
#include <vector>

#include "core/exec_context.h"
#include "core/mat.h"
#include "flowkv/tensor.h"

namespace flowkv::ops {

class Linear {
 public:
  Linear() = default;
  // w: [out_features, in_features], any dtype. `keep_plain` keeps an unpacked copy so the
  // scalar reference path can run (tests); real models leave it off to save memory.
  Linear(const Tensor& w, DType compute, bool keep_plain = false);
  // Rows [r0, r0 + n) of w only (a slice of a fused projection).
  static Linear rows_of(const Tensor& w, int64_t r0, int64_t n, DType compute, bool keep_plain);
  // Several weights stacked along the output dimension, as one layer (e.g. to_q|to_k|to_v).
  static Linear stacked(const std::vector<Tensor>& ws, DType compute, bool keep_plain);

  int64_t in_features() const { return k_; }
  int64_t out_features() const { return n_; }
  DType compute_dtype() const { return compute_; }
  int64_t packed_bytes() const;
  bool empty() const { return n_ == 0; }

  // Adds a bias [out_features] to every output row (Qwen-Image's layers have biases).
  void set_bias(const Tensor& bias);
  bool has_bias() const { return !bias_.empty(); }

  // y[M, N] = x[M, K] · Wᵀ (+ bias). x and y may be strided views; they must not overlap.
  void forward(const ExecContext& ctx, Mat x, Mat y) const;

 private:
  struct Packed;  // one column chunk of the weights in oneDNN's layout
  void build(const float* w, int64_t n, int64_t k, DType compute, bool keep_plain);
  void forward_reference(Mat x, Mat y) const;

  int64_t n_ = 0, k_ = 0;
  DType compute_ = DType::kF32;
  std::vector<std::shared_ptr<Packed>> chunks_;
  std::shared_ptr<std::vector<float>> plain_;  // [N, K] f32 values, for the reference path
  std::vector<float> bias_;
};

// Whether oneDNN multiplies bf16 natively on this CPU.
bool native_bf16_gemm();

// The GEMM tile a Linear of this shape uses (exposed for the benchmark and tests).
struct GemmTiles {
  int64_t rows;
  int64_t cols;
};
GemmTiles gemm_tiles(int64_t m, int64_t n, int64_t k);

}  // namespace flowkv::ops
