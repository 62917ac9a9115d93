// Highway implementations of the row kernels. This file is compiled once per target
// instruction set (foreach_target); HWY_DYNAMIC_DISPATCH picks one at run time.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/cpu/row_kernels_hwy.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include <cmath>
#include <cstring>

#include "hwy/contrib/math/math-inl.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace flowkv::ops::cpu {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using DF = hn::ScalableTag<float>;

// Sum of x[0..n) with vector accumulators (fixed order for a given n and target).
HWY_INLINE float SumRow(DF d, const float* x, int64_t n) {
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  auto a0 = hn::Zero(d), a1 = hn::Zero(d);
  int64_t i = 0;
  for (; i + 2 * N <= n; i += 2 * N) {
    a0 = hn::Add(a0, hn::LoadU(d, x + i));
    a1 = hn::Add(a1, hn::LoadU(d, x + i + N));
  }
  for (; i + N <= n; i += N) a0 = hn::Add(a0, hn::LoadU(d, x + i));
  float s = hn::GetLane(hn::SumOfLanes(d, hn::Add(a0, a1)));
  for (; i < n; ++i) s += x[i];
  return s;
}

HWY_INLINE float SumSqDevRow(DF d, const float* x, int64_t n, float mean) {
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const auto m = hn::Set(d, mean);
  auto a0 = hn::Zero(d), a1 = hn::Zero(d);
  int64_t i = 0;
  for (; i + 2 * N <= n; i += 2 * N) {
    const auto v0 = hn::Sub(hn::LoadU(d, x + i), m);
    const auto v1 = hn::Sub(hn::LoadU(d, x + i + N), m);
    a0 = hn::MulAdd(v0, v0, a0);
    a1 = hn::MulAdd(v1, v1, a1);
  }
  for (; i + N <= n; i += N) {
    const auto v = hn::Sub(hn::LoadU(d, x + i), m);
    a0 = hn::MulAdd(v, v, a0);
  }
  float s = hn::GetLane(hn::SumOfLanes(d, hn::Add(a0, a1)));
  for (; i < n; ++i) s += (x[i] - mean) * (x[i] - mean);
  return s;
}

void LayerNormModulate(const float* x, float* y, int64_t n, const float* scale, const float* shift,
                       float eps) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const float mean = SumRow(d, x, n) / static_cast<float>(n);
  const float var = SumSqDevRow(d, x, n, mean) / static_cast<float>(n);
  const float rstd = 1.0f / std::sqrt(var + eps);
  const auto vm = hn::Set(d, mean), vr = hn::Set(d, rstd), one = hn::Set(d, 1.0f);
  int64_t i = 0;
  for (; i + N <= n; i += N) {
    auto v = hn::Mul(hn::Sub(hn::LoadU(d, x + i), vm), vr);
    if (scale) v = hn::Mul(v, hn::Add(one, hn::LoadU(d, scale + i)));
    if (shift) v = hn::Add(v, hn::LoadU(d, shift + i));
    hn::StoreU(v, d, y + i);
  }
  for (; i < n; ++i) {
    float v = (x[i] - mean) * rstd;
    if (scale) v *= 1.0f + scale[i];
    if (shift) v += shift[i];
    y[i] = v;
  }
}

void GatedAdd(float* x, const float* y, const float* gate, int64_t n) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  int64_t i = 0;
  if (gate) {
    for (; i + N <= n; i += N) {
      hn::StoreU(hn::MulAdd(hn::LoadU(d, gate + i), hn::LoadU(d, y + i), hn::LoadU(d, x + i)), d,
                 x + i);
    }
    for (; i < n; ++i) x[i] += gate[i] * y[i];
  } else {
    for (; i + N <= n; i += N) {
      hn::StoreU(hn::Add(hn::LoadU(d, x + i), hn::LoadU(d, y + i)), d, x + i);
    }
    for (; i < n; ++i) x[i] += y[i];
  }
}

// The rotate_half rotation of one normalised head: pairs (i, i + hd/2).
void RopeHalf(float* v, int64_t hd, const float* cos, const float* sin) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d)), n = hd / 2;
  int64_t i = 0;
  for (; i + N <= n; i += N) {
    const auto a = hn::LoadU(d, v + i), b = hn::LoadU(d, v + n + i);
    hn::StoreU(hn::NegMulAdd(b, hn::LoadU(d, sin + i), hn::Mul(a, hn::LoadU(d, cos + i))), d,
               v + i);
    hn::StoreU(hn::MulAdd(a, hn::LoadU(d, sin + n + i), hn::Mul(b, hn::LoadU(d, cos + n + i))), d,
               v + n + i);
  }
  for (; i < n; ++i) {
    const float a = v[i], b = v[n + i];
    v[i] = a * cos[i] - b * sin[i];
    v[n + i] = b * cos[n + i] + a * sin[n + i];
  }
}

void RmsNormRope(float* x, int64_t heads, int64_t hd, const float* w, float eps, const float* cos,
                 const float* sin, bool half) {
  if (half && cos) {
    for (int64_t h = 0; h < heads; ++h) {
      RmsNormRope(x + h * hd, 1, hd, w, eps, nullptr, nullptr, false);
      RopeHalf(x + h * hd, hd, cos, sin);
    }
    return;
  }
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  for (int64_t h = 0; h < heads; ++h) {
    float* v = x + h * hd;
    float ms = 0;
    {
      auto a = hn::Zero(d);
      int64_t i = 0;
      for (; i + N <= hd; i += N) {
        const auto t = hn::LoadU(d, v + i);
        a = hn::MulAdd(t, t, a);
      }
      ms = hn::GetLane(hn::SumOfLanes(d, a));
      for (; i < hd; ++i) ms += v[i] * v[i];
    }
    const float inv = 1.0f / std::sqrt(ms / static_cast<float>(hd) + eps);
    const auto vinv = hn::Set(d, inv);
    int64_t i = 0;
    // Pairs (2k, 2k+1) never straddle a vector: N and hd are even.
#if HWY_TARGET != HWY_SCALAR
    for (; i + N <= hd; i += N) {
      auto t = hn::Mul(hn::LoadU(d, v + i), vinv);
      if (w) t = hn::Mul(t, hn::LoadU(d, w + i));
      if (cos) {
        const auto prod = hn::Mul(hn::Shuffle2301(t), hn::LoadU(d, sin + i));
        const auto rot = hn::OddEven(prod, hn::Neg(prod));  // even lanes: -x[2k+1]*sin
        t = hn::MulAdd(t, hn::LoadU(d, cos + i), rot);
      }
      hn::StoreU(t, d, v + i);
    }
#endif
    for (; i < hd; i += 2) {
      float a = v[i] * inv, b = v[i + 1] * inv;
      if (w) {
        a *= w[i];
        b *= w[i + 1];
      }
      if (cos) {
        v[i] = a * cos[i] - b * sin[i];
        v[i + 1] = b * cos[i + 1] + a * sin[i + 1];
      } else {
        v[i] = a;
        v[i + 1] = b;
      }
    }
  }
}

HWY_INLINE hn::Vec<DF> SiluV(DF d, hn::Vec<DF> g) {
  const auto e = hn::Exp(d, hn::Neg(g));
  return hn::Div(g, hn::Add(hn::Set(d, 1.0f), e));
}

void Swiglu(const float* in, float* out, int64_t f) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  int64_t i = 0;
  for (; i + N <= f; i += N) {
    const auto g = hn::LoadU(d, in + i);
    hn::StoreU(hn::Mul(SiluV(d, g), hn::LoadU(d, in + f + i)), d, out + i);
  }
  for (; i < f; ++i) out[i] = in[i] / (1.0f + std::exp(-in[i])) * in[f + i];
}

void Silu(const float* x, float* y, int64_t n) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  int64_t i = 0;
  for (; i + N <= n; i += N) hn::StoreU(SiluV(d, hn::LoadU(d, x + i)), d, y + i);
  for (; i < n; ++i) y[i] = x[i] / (1.0f + std::exp(-x[i]));
}

void GeluTanh(float* x, int64_t n) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const auto k = hn::Set(d, 0.7978845608028654f), c = hn::Set(d, 0.044715f),
             half = hn::Set(d, 0.5f), one = hn::Set(d, 1.0f);
  int64_t i = 0;
  for (; i + N <= n; i += N) {
    const auto a = hn::LoadU(d, x + i);
    const auto inner = hn::Mul(k, hn::MulAdd(hn::Mul(c, a), hn::Mul(a, a), a));
    hn::StoreU(hn::Mul(hn::Mul(half, a), hn::Add(one, hn::Tanh(d, inner))), d, x + i);
  }
  for (; i < n; ++i) {
    const float a = x[i];
    x[i] = 0.5f * a * (1.0f + std::tanh(0.7978845608028654f * (a + 0.044715f * a * a * a)));
  }
}

// Round-to-nearest-even on the bit pattern (NaN inputs do not occur in activations).
HWY_INLINE hn::Vec<hn::RebindToUnsigned<DF>> RoundedBits(DF d, hn::Vec<DF> v) {
  const hn::RebindToUnsigned<DF> du;
  const auto u = hn::BitCast(du, v);
  const auto lsb = hn::And(hn::ShiftRight<16>(u), hn::Set(du, 1u));
  return hn::Add(u, hn::Add(lsb, hn::Set(du, 0x7fffu)));
}

void ToBf16(const float* x, uint16_t* out, int64_t n) {
  const DF d;
  const hn::RebindToUnsigned<DF> du;
  const hn::Rebind<uint16_t, DF> d16;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  int64_t i = 0;
  for (; i + N <= n; i += N) {
    const auto r = hn::ShiftRight<16>(RoundedBits(d, hn::LoadU(d, x + i)));
    hn::StoreU(hn::DemoteTo(d16, hn::BitCast(hn::RebindToSigned<DF>(), r)), d16, out + i);
  }
  for (; i < n; ++i) {
    uint32_t u;
    std::memcpy(&u, &x[i], 4);
    u += 0x7fffu + ((u >> 16) & 1u);
    out[i] = static_cast<uint16_t>(u >> 16);
  }
  (void)du;
}

void RoundBf16(float* x, int64_t n) {
  const DF d;
  const hn::RebindToUnsigned<DF> du;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  int64_t i = 0;
  for (; i + N <= n; i += N) {
    const auto r = hn::And(RoundedBits(d, hn::LoadU(d, x + i)), hn::Set(du, 0xffff0000u));
    hn::StoreU(hn::BitCast(d, r), d, x + i);
  }
  for (; i < n; ++i) {
    uint32_t u;
    std::memcpy(&u, &x[i], 4);
    u += 0x7fffu + ((u >> 16) & 1u);
    u &= 0xffff0000u;
    std::memcpy(&x[i], &u, 4);
  }
}

const char* TargetName() {
  return hwy::TargetName(HWY_TARGET);
}

}  // namespace HWY_NAMESPACE
}  // namespace flowkv::ops::cpu
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include "ops/cpu/row_kernels.h"

namespace flowkv::ops::cpu {

HWY_EXPORT(LayerNormModulate);
HWY_EXPORT(GatedAdd);
HWY_EXPORT(RmsNormRope);
HWY_EXPORT(Swiglu);
HWY_EXPORT(Silu);
HWY_EXPORT(GeluTanh);
HWY_EXPORT(ToBf16);
HWY_EXPORT(RoundBf16);
HWY_EXPORT(TargetName);

const RowKernels& row_kernels() {
  // HWY_DYNAMIC_DISPATCH picks the target on first call and is a table lookup after that.
  static const RowKernels k = {
      [](const float* x, float* y, int64_t n, const float* sc, const float* sh, float eps) {
        HWY_DYNAMIC_DISPATCH(LayerNormModulate)(x, y, n, sc, sh, eps);
      },
      [](float* x, const float* y, const float* g, int64_t n) {
        HWY_DYNAMIC_DISPATCH(GatedAdd)(x, y, g, n);
      },
      [](float* x, int64_t heads, int64_t hd, const float* w, float eps, const float* c,
         const float* s, bool half) {
        HWY_DYNAMIC_DISPATCH(RmsNormRope)
        (x, heads, hd, w, eps, c, s, half);
      },
      [](const float* in, float* out, int64_t f) {
        HWY_DYNAMIC_DISPATCH(Swiglu)
        (in, out, f);
      },
      [](const float* x, float* y, int64_t n) {
        HWY_DYNAMIC_DISPATCH(Silu)
        (x, y, n);
      },
      [](float* x, int64_t n) {
        HWY_DYNAMIC_DISPATCH(GeluTanh)
        (x, n);
      },
      [](const float* x, uint16_t* o, int64_t n) {
        HWY_DYNAMIC_DISPATCH(ToBf16)
        (x, o, n);
      },
      [](float* x, int64_t n) {
        HWY_DYNAMIC_DISPATCH(RoundBf16)
        (x, n);
      },
  };
  return k;
}

const char* simd_target_name() {
  return HWY_DYNAMIC_DISPATCH(TargetName)();
}

}  // namespace flowkv::ops::cpu
#endif
