// Spatial ops of convolutional models (the VAE): 2-D convolution, GroupNorm (+ SiLU) and nearest
// 2x upsampling, on channels-last images. An image is [H, W, C] row-major: PyTorch's [C, H, W]
// permuted, so that a pixel's channels are contiguous and a whole image is a [H*W, C] matrix
// (what a GEMM, a row kernel or attention reads). Batches are looped by the caller.
//
// Every op has a scalar reference (ops/ref/conv_ref.cc) and a fast, threaded path
// (ops/cpu/conv.cc), chosen by ctx.kernels. The fast paths split work into tasks fixed by the
// shape alone, and each output element is reduced in an order fixed by the shape, so results do
// not depend on the thread count.
#pragma once

#include <cstdint>
#include <vector>

#include "core/exec_context.h"
#include "flowkv/tensor.h"

namespace flowkv::ops {

// A square-kernel convolution's geometry. Padding may be asymmetric (diffusers' Downsample2D
// with padding=0 pads (left 0, right 1, top 0, bottom 1) before a stride-2 3x3 convolution).
struct Conv2dShape {
  int64_t in_channels = 0;
  int64_t out_channels = 0;
  int64_t kernel = 3;
  int64_t stride = 1;
  int64_t pad_top = 1, pad_left = 1, pad_bottom = 1, pad_right = 1;

  int64_t out_h(int64_t h) const { return (h + pad_top + pad_bottom - kernel) / stride + 1; }
  int64_t out_w(int64_t w) const { return (w + pad_left + pad_right - kernel) / stride + 1; }
  int64_t taps() const { return kernel * kernel; }
  static Conv2dShape same3x3(int64_t cin, int64_t cout) { return {cin, cout, 3, 1, 1, 1, 1, 1}; }
  static Conv2dShape pointwise(int64_t cin, int64_t cout) { return {cin, cout, 1, 1, 0, 0, 0, 0}; }
  static Conv2dShape down3x3(int64_t cin, int64_t cout) { return {cin, cout, 3, 2, 0, 0, 1, 1}; }
};

// A convolution with its weights. The weights are widened to f32 at load (the VAE's 84M
// parameters take 336 MB so) and reordered to [Cout, kh, kw, Cin]: one row per output channel
// whose K = kh*kw*Cin values match the channels-last im2col row of an output pixel. The same
// copy serves the fast path (the project's blocked GEMM reading it as f32 rows) and the
// reference.
class Conv2d {
 public:
  Conv2d() = default;
  // weight [Cout, Cin, k, k] (PyTorch layout; F32, BF16 or F16); bias [Cout] or undefined.
  Conv2d(const Tensor& weight, const Tensor& bias, const Conv2dShape& shape);
  // A pointwise convolution from a linear layer's weight [Cout, Cin] (attention projections).
  static Conv2d from_linear(const Tensor& weight, const Tensor& bias);

  const Conv2dShape& shape() const { return s_; }
  bool empty() const { return s_.out_channels == 0; }
  int64_t held_bytes() const;

  // x [h, w, Cin] -> y [out_h, out_w, Cout]. x and y must not overlap. With `upsample2x` the
  // input is x upsampled 2x by nearest neighbour ([2h, 2w, Cin], diffusers' Upsample2D before
  // its conv), read in place: the 4x larger upsampled image is never stored.
  void forward(const ExecContext& ctx, const float* x, int64_t h, int64_t w, float* y,
               bool upsample2x = false) const;

  // [Cout, K] rows, K = kernel*kernel*Cin (taps outer, channels inner), and the bias (or empty).
  const std::vector<float>& weight_rows() const { return w_; }
  const std::vector<float>& bias() const { return b_; }

 private:
  Conv2dShape s_;
  std::vector<float> w_;
  std::vector<float> b_;
};

// y = GroupNorm(x) * gamma + beta, then SiLU when `silu`; x, y [hw, C] (may be the same).
// Statistics per group of C/groups channels over all hw pixels, biased variance, in double.
struct GroupNormArgs {
  int64_t groups = 32;
  float eps = 1e-6f;
  bool silu = false;
};
void group_norm(const ExecContext& ctx, const float* x, float* y, int64_t hw, int64_t c,
                const float* gamma, const float* beta, const GroupNormArgs& args);

// Wan's RMS_norm over channels (diffusers WanRMS_norm / QwenImage21RMS_norm, no bias):
// y = x / max(||x||_2, 1e-12) * sqrt(C) * gamma per pixel (F.normalize over the channel axis),
// then SiLU when `silu`; x, y [hw, C] (may be the same). Norms summed in double.
void rms_norm_channels(const ExecContext& ctx, const float* x, float* y, int64_t hw, int64_t c,
                       const float* gamma, bool silu);

// Nearest-neighbour 2x upsampling: x [h, w, C] -> y [2h, 2w, C].
void upsample_nearest2x(const ExecContext& ctx, const float* x, int64_t h, int64_t w, int64_t c,
                        float* y);

// Channels-first [C, h*w] <-> channels-last [h*w, C] (one image).
void to_channels_last(const float* x, int64_t c, int64_t hw, float* y);
void to_channels_first(const float* x, int64_t hw, int64_t c, float* y);

namespace ref {
void conv2d(const Conv2d& conv, const float* x, int64_t h, int64_t w, float* y);
void group_norm(const float* x, float* y, int64_t hw, int64_t c, const float* gamma,
                const float* beta, const GroupNormArgs& args);
void rms_norm_channels(const float* x, float* y, int64_t hw, int64_t c, const float* gamma,
                       bool silu);
void upsample_nearest2x(const float* x, int64_t h, int64_t w, int64_t c, float* y);
}  // namespace ref

}  // namespace flowkv::ops
