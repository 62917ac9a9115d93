// A CPU normal generator that reproduces PyTorch's, so that `--seed N` gives the initial latents
// diffusers gives with torch.Generator("cpu").manual_seed(N) and
// torch.randn(shape, generator=g, dtype=torch.float32) (diffusers' randn_tensor on a CPU
// generator; the Klein pipelines draw all [B, 128, H/16, W/16] latents in one call).
//
// What torch does (ATen DistributionTemplates.h, DistributionsHelper.h, TransformationHelper.h,
// CPUGeneratorImpl; checked against torch 2.15.0 by tests/random_test.cc):
// - the engine is the standard 32-bit Mersenne Twister seeded with the seed's low 32 bits;
// - a float uniform is the low 24 bits of one draw times 2^-24, a double uniform the low 53
//   bits of (first draw << 32 | second draw) times 2^-53;
// - numel >= 16 (float32, contiguous): every element is first filled with a float uniform, then
//   each chunk of 16 becomes 8 Box-Muller pairs (u1 = 1 - x[j], u2 = x[j + 8]); when numel is
//   not a multiple of 16 the last 16 elements are refilled with fresh uniforms and transformed
//   again. The transform's float maths depends on torch's CPU capability: AVX2 and above (every
//   x86-64 machine since 2013) use Cephes-style polynomials (log256_ps / sincos256_ps), the
//   DEFAULT capability uses libm's logf / cosf / sinf;
// - numel < 16: one double Box-Muller pair per two elements (log1p, sin, cos in double), the
//   second of each pair cached in the generator for the next element, even across calls;
// - bfloat16 (torch 2.15 measured, not read: its source was not at hand): numel >= 16 is the
//   float32 transform rounded to bfloat16, except that the last, partial chunk keeps the
//   n % 16 uniforms left over and draws only 16 - n % 16 new ones; numel < 16 is the double
//   path rounded (double -> float -> bfloat16).
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "flowkv/tensor.h"

namespace flowkv {

// Which of torch's float normal transforms to reproduce (torch.backends.cpu.get_cpu_capability()).
enum class TorchCpuCapability { kAvx2, kDefault };

class TorchGenerator {
 public:
  explicit TorchGenerator(uint64_t seed, TorchCpuCapability capability = TorchCpuCapability::kAvx2);

  uint32_t random();    // one engine draw
  uint64_t random64();  // two draws: (first << 32) | second
  float uniform_float();
  double uniform_double();
  double normal_double();  // torch's at::normal_distribution<double>(0, 1), with its cache

  // torch.randn(n, generator=this, dtype=torch.float32): the next n values.
  void randn(float* out, int64_t n);
  std::vector<float> randn(int64_t n);
  // torch.randn(n, generator=this, dtype=torch.bfloat16), each value as the float it equals
  // (diffusers draws in the pipeline's dtype: a pipeline loaded in bf16 gets these).
  void randn_bf16(float* out, int64_t n);

 private:
  std::mt19937 engine_;
  TorchCpuCapability capability_;
  bool has_next_normal_ = false;
  double next_normal_ = 0;
};

// diffusers' randn_tensor(shape, generator=g, dtype=dtype) with a CPU generator: one draw of the
// whole shape (the Klein pipelines' prepare_latents asks for [B, 128, H / 16, W / 16] in
// prompt_embeds.dtype). dtype kF32 or kBF16 (a bf16 tensor holding torch's bf16 values).
Tensor randn_tensor(TorchGenerator& g, const Shape& shape, DType dtype = DType::kF32);

}  // namespace flowkv
