// Torch's CPU normal generator, operation by operation (see random.h). The float transforms
// must round exactly as torch's do: this file is compiled without floating-point contraction
// (src/CMakeLists.txt), and every product and sum below is one rounding, as in torch's
// AVX2 kernel; std::fma appears only where torch itself uses a fused multiply-add.
#include "core/random.h"

#include <bit>
#include <cmath>
#include <numbers>

#include "core/checked.h"

namespace flowkv {

namespace {

float select(bool mask, float v) {
  return mask ? v : 0.0f;
}

// Natural log as torch's AVX2 normal kernel computes it (a Cephes polynomial in float, one
// lane of log256_ps): exponent and mantissa split at sqrt(1/2), a degree-8 polynomial, and ln 2
// added back in two parts. NaN for x <= 0.
float cephes_logf(float x) {
  const bool invalid = x <= 0.0f;
  x = std::fmax(x, std::bit_cast<float>(0x00800000));  // flush subnormals to the least normal
  int32_t e_int = static_cast<int32_t>(std::bit_cast<uint32_t>(x) >> 23);
  x = std::bit_cast<float>((std::bit_cast<uint32_t>(x) & ~0x7f800000u) |
                           std::bit_cast<uint32_t>(0.5f));
  e_int -= 0x7f;
  float e = static_cast<float>(e_int);
  e = e + 1.0f;
  const bool below = x < static_cast<float>(0.707106781186547524);
  const float tmp = select(below, x);
  x = x - 1.0f;
  e = e - select(below, 1.0f);
  x = x + tmp;
  const float z = x * x;
  static constexpr double kP[] = {7.0376836292E-2,  -1.1514610310E-1, 1.1676998740E-1,
                                  -1.2420140846E-1, 1.4249322787E-1,  -1.6668057665E-1,
                                  2.0000714765E-1,  -2.4999993993E-1, 3.3333331174E-1};
  float y = static_cast<float>(kP[0]);
  for (int i = 1; i < 9; ++i) y = std::fma(y, x, static_cast<float>(kP[i]));
  y = y * x;
  y = std::fma(y, z, e * static_cast<float>(-2.12194440e-4));
  y = std::fma(-z, 0.5f, y);
  x = x + y;
  x = std::fma(e, static_cast<float>(0.693359375), x);
  return invalid ? std::bit_cast<float>(0xffffffffu) : x;
}

// Sine and cosine as torch's AVX2 normal kernel computes them (one lane of sincos256_ps):
// reduction by multiples of pi/4 in three parts, then the Cephes sine and cosine polynomials.
void cephes_sincosf(float x, float* s, float* c) {
  uint32_t sign_sin = std::bit_cast<uint32_t>(x) & 0x80000000u;
  x = std::fabs(x);
  float y = x * static_cast<float>(1.27323954473516);  // 4 / pi
  int32_t j = static_cast<int32_t>(y);                 // truncation (cvttps)
  j = (j + 1) & ~1;
  y = static_cast<float>(j);
  const uint32_t swap_sin = static_cast<uint32_t>(j & 4) << 29;
  const bool poly_mask = (j & 2) == 0;
  x = std::fma(y, static_cast<float>(-0.78515625), x);
  x = std::fma(y, static_cast<float>(-2.4187564849853515625e-4), x);
  x = std::fma(y, static_cast<float>(-3.77489497744594108e-8), x);
  const uint32_t sign_cos = static_cast<uint32_t>(~(j - 2) & 4) << 29;
  sign_sin ^= swap_sin;

  const float z = x * x;
  float yc = static_cast<float>(2.443315711809948E-005);
  yc = std::fma(yc, z, static_cast<float>(-1.388731625493765E-003));
  yc = std::fma(yc, z, static_cast<float>(4.166664568298827E-002));
  yc = yc * z;
  yc = std::fma(yc, z, -(z * 0.5f));
  yc = yc + 1.0f;

  float ys = static_cast<float>(-1.9515295891E-4);
  ys = std::fma(ys, z, static_cast<float>(8.3321608736E-3));
  ys = std::fma(ys, z, static_cast<float>(-1.6666654611E-1));
  ys = ys * z;
  ys = std::fma(ys, x, x);

  const float ysin2 = select(poly_mask, ys), ysin1 = select(!poly_mask, yc);
  ys = ys - ysin2;
  yc = yc - ysin1;
  *s = std::bit_cast<float>(std::bit_cast<uint32_t>(ysin1 + ysin2) ^ sign_sin);
  *c = std::bit_cast<float>(std::bit_cast<uint32_t>(yc + ys) ^ sign_cos);
}

// Eight Box-Muller pairs in place: data[j] (1 - u1 source) and data[j + 8] (u2).
void box_muller_16(float* data, TorchCpuCapability capability) {
  if (capability == TorchCpuCapability::kAvx2) {
    const auto two_pi = static_cast<float>(2.0 * std::numbers::pi);
    for (int j = 0; j < 8; ++j) {
      const float u1 = 1.0f - data[j], u2 = data[j + 8];
      const float radius = std::sqrt(-2.0f * cephes_logf(u1));
      float s = 0, c = 0;
      cephes_sincosf(two_pi * u2, &s, &c);
      // torch stores fma(n, std, mean) with std 1 and mean 0.
      data[j] = std::fma(radius * c, 1.0f, 0.0f);
      data[j + 8] = std::fma(radius * s, 1.0f, 0.0f);
    }
  } else {
    for (int j = 0; j < 8; ++j) {
      const float u1 = 1.0f - data[j], u2 = data[j + 8];
      const float radius = std::sqrt(-2.0f * std::log(u1));
      const auto theta = static_cast<float>(2.0 * std::numbers::pi * static_cast<double>(u2));
      data[j] = radius * std::cos(theta) * 1.0f + 0.0f;
      data[j + 8] = radius * std::sin(theta) * 1.0f + 0.0f;
    }
  }
}

// float to bfloat16 (nearest even, as c10::BFloat16), kept as the float of the same value.
float bf16(float f) {
  if (std::isnan(f)) return std::bit_cast<float>(0x7fc00000u);
  uint32_t u = std::bit_cast<uint32_t>(f);
  u += 0x7fffu + ((u >> 16) & 1u);
  return std::bit_cast<float>(u & 0xffff0000u);
}

}  // namespace

TorchGenerator::TorchGenerator(uint64_t seed, TorchCpuCapability capability)
    : engine_(static_cast<uint32_t>(seed & 0xffffffffu)), capability_(capability) {}

uint32_t TorchGenerator::random() {
  return static_cast<uint32_t>(engine_());
}

uint64_t TorchGenerator::random64() {
  const uint64_t hi = random();
  const uint64_t lo = random();
  return (hi << 32) | lo;
}

float TorchGenerator::uniform_float() {
  return static_cast<float>(random() & ((1u << 24) - 1)) * (1.0f / (1 << 24));
}

double TorchGenerator::uniform_double() {
  return static_cast<double>(random64() & ((uint64_t{1} << 53) - 1)) *
         (1.0 / static_cast<double>(uint64_t{1} << 53));
}

double TorchGenerator::normal_double() {
  if (has_next_normal_) {
    has_next_normal_ = false;
    return next_normal_;
  }
  const double u1 = uniform_double();
  const double u2 = uniform_double();
  const double r = std::sqrt(-2.0 * std::log1p(-u2));
  const double theta = 2.0 * std::numbers::pi * u1;
  next_normal_ = r * std::sin(theta);
  has_next_normal_ = true;
  return r * std::cos(theta);
}

void TorchGenerator::randn(float* out, int64_t n) {
  if (n < 16) {
    for (int64_t i = 0; i < n; ++i) out[i] = static_cast<float>(normal_double() * 1.0 + 0.0);
    return;
  }
  for (int64_t i = 0; i < n; ++i) out[i] = uniform_float();
  for (int64_t i = 0; i + 16 <= n; i += 16) box_muller_16(out + i, capability_);
  if (n % 16 != 0) {
    float* tail = out + n - 16;
    for (int i = 0; i < 16; ++i) tail[i] = uniform_float();
    box_muller_16(tail, capability_);
  }
}

void TorchGenerator::randn_bf16(float* out, int64_t n) {
  if (n < 16) {
    for (int64_t i = 0; i < n; ++i) out[i] = bf16(static_cast<float>(normal_double()));
    return;
  }
  // The float transform on float uniforms, rounded to bfloat16 at the end; only the tail
  // differs from float32's: the n % 16 uniforms left over are kept and 16 - n % 16 fresh ones
  // drawn after them, and the 16 results go to the last 16 places.
  for (int64_t i = 0; i < n; ++i) out[i] = uniform_float();
  const int64_t whole = n / 16 * 16;
  for (int64_t i = 0; i < whole; i += 16) box_muller_16(out + i, capability_);
  if (n != whole) {
    float tail[16];
    const int64_t rest = n - whole;
    for (int64_t i = 0; i < rest; ++i) tail[i] = out[whole + i];
    for (int64_t i = rest; i < 16; ++i) tail[i] = uniform_float();
    box_muller_16(tail, capability_);
    for (int i = 0; i < 16; ++i) out[n - 16 + i] = tail[i];
  }
  for (int64_t i = 0; i < n; ++i) out[i] = bf16(out[i]);
}

std::vector<float> TorchGenerator::randn(int64_t n) {
  std::vector<float> v(static_cast<size_t>(n));
  randn(v.data(), n);
  return v;
}

Tensor randn_tensor(TorchGenerator& g, const Shape& shape, DType dtype) {
  FLOWKV_CHECK(dtype == DType::kF32 || dtype == DType::kBF16,
               "randn_tensor: only float32 and bfloat16 are drawn as torch draws them");
  const int64_t n = checked_numel(shape, "randn_tensor shape");
  Tensor t = Tensor::empty(shape, DType::kF32);
  if (dtype == DType::kF32) {
    g.randn(t.f32(), n);
    return t;
  }
  g.randn_bf16(t.f32(), n);
  return t.to(DType::kBF16);  // exact: every value is a bfloat16 already
}

}  // namespace flowkv
