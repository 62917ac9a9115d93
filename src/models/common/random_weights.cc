#include "models/common/random_weights.h"

#include <cmath>

namespace flowkv {

namespace {

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

// Box-Muller on two counter-based uniforms: value i of stream `key`.
float normal_at(uint64_t key, int64_t i) {
  const uint64_t a = splitmix64(key ^ splitmix64(static_cast<uint64_t>(2 * i)));
  const uint64_t b = splitmix64(key ^ splitmix64(static_cast<uint64_t>(2 * i + 1)));
  const double u1 = (static_cast<double>(a >> 11) + 1.0) * 0x1.0p-53;
  const double u2 = static_cast<double>(b >> 11) * 0x1.0p-53;
  return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
}

}  // namespace

void fill_normal(float* out, int64_t n, uint64_t seed, float scale) {
  const uint64_t key = splitmix64(seed);
  for (int64_t i = 0; i < n; ++i) out[i] = scale * normal_at(key, i);
}

std::map<std::string, Tensor> random_weights(
    const std::vector<ExpectedTensor>& table, uint64_t seed, DType dtype,
    const std::function<float(const std::string&)>& center) {
  std::map<std::string, Tensor> out;
  for (const ExpectedTensor& e : table) {
    Tensor f = Tensor::empty(e.shape);
    const uint64_t key = splitmix64(seed ^ fnv1a(e.name));
    const int64_t n = f.numel();
    if (e.shape.size() == 1) {
      const float c = center(e.name);
      for (int64_t i = 0; i < n; ++i) f.f32()[i] = c + 0.1f * normal_at(key, i);
    } else {
      const float scale = 1.0f / std::sqrt(static_cast<float>(e.shape[1]));
      for (int64_t i = 0; i < n; ++i) f.f32()[i] = scale * normal_at(key, i);
    }
    if (dtype == DType::kBF16) {
      Tensor b = Tensor::empty(e.shape, DType::kBF16);
      for (int64_t i = 0; i < n; ++i) b.u16()[i] = f32_to_bf16(f.f32()[i]);
      out[e.name] = b;
    } else {
      out[e.name] = f;
    }
  }
  return out;
}

}  // namespace flowkv
