// Measures this machine's f32 FMA peak: independent multiply-add chains that keep every FMA
// unit busy, on the instruction set the other kernels use. The benchmark reports its figures
// as fractions of this peak, measured in the same run.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/cpu/peak_hwy.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace flowkv::ops::cpu {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Runs `iters` rounds of 12 independent FMA chains; returns FLOPs done (2 per lane per FMA).
double FmaChains(int64_t iters, float* sink) {
  const hn::ScalableTag<float> d;
  constexpr int kChains = 12;
  hn::Vec<decltype(d)> acc[kChains];
  for (int i = 0; i < kChains; ++i) acc[i] = hn::Set(d, 1.0f + 0.001f * i);
  const auto a = hn::Set(d, 0.999999f), b = hn::Set(d, 1e-7f);
  for (int64_t it = 0; it < iters; ++it) {
    for (int i = 0; i < kChains; ++i) acc[i] = hn::MulAdd(acc[i], a, b);
  }
  auto s = acc[0];
  for (int i = 1; i < kChains; ++i) s = hn::Add(s, acc[i]);
  *sink = hn::GetLane(s);
  return 2.0 * kChains * static_cast<double>(hn::Lanes(d)) * static_cast<double>(iters);
}

}  // namespace HWY_NAMESPACE
}  // namespace flowkv::ops::cpu
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include <chrono>
#include <vector>

#include "core/parallel.h"
#include "ops/peak.h"

namespace flowkv::ops {
namespace cpu {
HWY_EXPORT(FmaChains);
}

double measure_f32_peak_gflops(int threads, double seconds) {
  const int n = threads > 0 ? threads : num_threads();
  std::vector<float> sink(static_cast<size_t>(n) * 16);
  double best = 0;
  // Best of a few short rounds: the machine is shared and clocks ramp.
  for (int round = 0; round < 5; ++round) {
    const int64_t iters = static_cast<int64_t>(2e7 * seconds);
    const auto t0 = std::chrono::steady_clock::now();
    double flops = 0;
#pragma omp parallel for num_threads(n) reduction(+ : flops)
    for (int t = 0; t < n; ++t) {
      flops += HWY_DYNAMIC_DISPATCH(cpu::FmaChains)(iters, &sink[static_cast<size_t>(t) * 16]);
    }
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, flops / dt / 1e9);
  }
  return best;
}

}  // namespace flowkv::ops
#endif
