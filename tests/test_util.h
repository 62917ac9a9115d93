// Helpers shared by the tests: seeded random data and error measures.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "core/mat.h"
#include "flowkv/tensor.h"

namespace flowkv::test {

inline std::vector<float> randn(int64_t n, uint64_t seed, float scale = 1.0f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = dist(rng);
  return v;
}

struct ErrorStats {
  double max_abs = 0;
  double max_ref = 0;
  double sq_err = 0, sq_ref = 0;  // sums of squares of the error and of the reference
  double rel() const { return max_ref > 0 ? max_abs / max_ref : max_abs; }
  // Normalised mean squared error: sum (got - ref)^2 / sum ref^2.
  double nmse() const { return sq_ref > 0 ? sq_err / sq_ref : sq_err; }
};

inline ErrorStats compare(const float* got, const float* ref, int64_t n) {
  ErrorStats e;
  for (int64_t i = 0; i < n; ++i) {
    const double d = double(got[i]) - double(ref[i]);
    e.max_abs = std::max(e.max_abs, std::abs(d));
    e.max_ref = std::max(e.max_ref, std::abs(double(ref[i])));
    e.sq_err += d * d;
    e.sq_ref += double(ref[i]) * double(ref[i]);
    if (std::isnan(got[i]) != std::isnan(ref[i])) e.max_abs = INFINITY;
  }
  return e;
}

inline bool bit_equal(const float* a, const float* b, int64_t n) {
  return std::equal(a, a + n, b, [](float x, float y) {
    uint32_t u, w;
    std::memcpy(&u, &x, 4);
    std::memcpy(&w, &y, 4);
    return u == w;
  });
}

}  // namespace flowkv::test
