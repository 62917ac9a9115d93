// time_gemm: one Linear, timed as the models run it (the GEMM benchmark's measurement).
#include <algorithm>
#include <chrono>
#include <random>
#include <vector>

#include "core/arena.h"
#include "core/exec_context.h"
#include "flowkv/error.h"
#include "flowkv/limits.h"
#include "flowkv/runtime.h"
#include "ops/linear.h"

namespace flowkv {

namespace {

double nmse(const std::vector<float>& y, const std::vector<float>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < y.size(); ++i) {
    const double d = double(y[i]) - ref[i];
    num += d * d;
    den += double(ref[i]) * ref[i];
  }
  return den > 0 ? num / den : 0;
}

}  // namespace

std::vector<GemmTiming> time_gemm(int64_t m, int64_t k, int64_t n,
                                  const std::vector<GemmVariant>& variants, int runs) {
  FLOWKV_CHECK(m >= 1 && k >= 1 && n >= 1 && m <= limits::kMaxTokens && k <= 65536 && n <= 65536,
               "time_gemm: shape ", m, "x", k, "x", n, " out of range");
  FLOWKV_CHECK(runs >= 1 && runs <= 1000, "time_gemm: runs must be in [1, 1000]");
  for (const GemmVariant& v : variants) {
    FLOWKV_CHECK(v.compute == "f32" || v.compute == "int8", "time_gemm: compute '", v.compute,
                 "' is not f32 or int8");
    FLOWKV_CHECK(k % dtype_block(v.weights) == 0, "time_gemm: k = ", k,
                 " is not a whole number of ", dtype_name(v.weights), " blocks (",
                 dtype_block(v.weights), ")");
  }
  std::mt19937 gen(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  Tensor w = Tensor::empty({n, k});
  for (int64_t i = 0; i < n * k; ++i) w.f32()[i] = normal(gen) * 0.02f;
  std::vector<float> x(static_cast<size_t>(m * k)), y(static_cast<size_t>(m * n)), ref(y.size());
  for (float& v : x) v = normal(gen);
  Arena arena;
  ExecContext ctx{&arena, KernelPath::kFast, nullptr};
  {
    const ops::Linear exact(w, DType::kF32);
    exact.forward(ctx, make_mat(x.data(), m, k), make_mat(ref.data(), m, n));
  }
  std::vector<ops::Linear> layers;
  std::vector<GemmTiming> out(variants.size());
  for (size_t i = 0; i < variants.size(); ++i) {
    const GemmVariant& v = variants[i];
    layers.emplace_back(w.to(v.weights), ops::Compute{DType::kF32, v.compute == "int8"});
    layers[i].forward(ctx, make_mat(x.data(), m, k), make_mat(y.data(), m, n));  // warm-up
    out[i].nmse = nmse(y, ref);
    out[i].weight_bytes = layers[i].packed_bytes();
  }
  std::vector<std::vector<double>> times(variants.size());
  for (int r = 0; r < runs; ++r) {
    for (size_t i = 0; i < variants.size(); ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      layers[i].forward(ctx, make_mat(x.data(), m, k), make_mat(y.data(), m, n));
      times[i].push_back(
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
  }
  for (size_t i = 0; i < variants.size(); ++i) {
    std::sort(times[i].begin(), times[i].end());
    out[i].median_seconds = times[i][times[i].size() / 2];
    out[i].gflops = 2.0 * double(m) * double(n) * double(k) / out[i].median_seconds / 1e9;
  }
  return out;
}

}  // namespace flowkv
