// Vectorized dequantization (Highway, chosen at run time). Each kernel computes exactly the
// scalar reference's operations lane by lane (integer -> float conversions are exact, then the
// same products and differences in the same order, never a fused multiply-add), so results are
// bit-identical to dequantize_row_ref.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "quant/dequant_hwy.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include <cstdint>
#include <cstring>

#include "flowkv/dtype.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace flowkv::quant {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
// At most 16 lanes: a Q6_K vector must not straddle two 16-element scale groups, and the
// 16 nibble bytes of a Q4_0..Q5_1 block are whole vectors.
using DF = hn::CappedTag<float, 16>;
using DI = hn::RebindToSigned<DF>;
using DU = hn::RebindToUnsigned<DF>;
using DU8 = hn::Rebind<uint8_t, DF>;
using DI8 = hn::Rebind<int8_t, DF>;
using DU16 = hn::Rebind<uint16_t, DF>;

HWY_INLINE float LoadF16(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return f16_to_f32(h);
}

// bf16 -> f32 is a 16-bit shift of the bits.
void DeqBf16(const uint8_t* src, float* dst, int64_t n) {
  const DF df;
  const DU du;
  const DU16 du16;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  int64_t i = 0;
  for (; i + N <= n; i += N) {
    const auto h = hn::LoadU(du16, reinterpret_cast<const uint16_t*>(src + 2 * i));
    const auto w = hn::ShiftLeft<16>(hn::PromoteTo(du, h));
    hn::StoreU(hn::BitCast(df, w), df, dst + i);
  }
  for (; i < n; ++i) {
    uint16_t h;
    std::memcpy(&h, src + 2 * i, 2);
    dst[i] = bf16_to_f32(h);
  }
}

// f16 -> f32 with integer operations, as the scalar f16_to_f32: normals rebias the exponent,
// Inf/NaN keep their payload bits (F16C's vcvtph2ps would quiet a signalling NaN), subnormals
// are their integer mantissa times 2^-24 (two normal floats: exact, and immune to DAZ).
void DeqF16(const uint8_t* src, float* dst, int64_t n) {
  const DF df;
  const DI di;
  const DU du;
  const DU16 du16;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  const auto nonsign_mask = hn::Set(du, 0x7fffu);
  const auto exp_mask = hn::Set(du, 0x7c00u);
  const auto rebias = hn::Set(du, (127u - 15u) << 23);
  const auto exp_all = hn::Set(du, 0x7f800000u);
  const auto zero = hn::Zero(du);
  const auto sub_scale = hn::Set(df, 0x1.0p-24f);
  int64_t i = 0;
  for (; i + N <= n; i += N) {
    const auto h =
        hn::PromoteTo(du, hn::LoadU(du16, reinterpret_cast<const uint16_t*>(src + 2 * i)));
    const auto sign = hn::ShiftLeft<16>(hn::AndNot(nonsign_mask, h));
    const auto mag = hn::And(h, nonsign_mask);
    const auto exp = hn::And(h, exp_mask);
    const auto shifted = hn::ShiftLeft<13>(mag);
    const auto normal = hn::Add(shifted, rebias);
    const auto special = hn::Or(shifted, exp_all);
    const auto sub = hn::BitCast(du, hn::Mul(hn::ConvertTo(df, hn::BitCast(di, mag)), sub_scale));
    auto bits = hn::IfThenElse(hn::Eq(exp, exp_mask), special, normal);
    bits = hn::IfThenElse(hn::Eq(exp, zero), sub, bits);
    hn::StoreU(hn::BitCast(df, hn::Or(bits, sign)), df, dst + i);
  }
  for (; i < n; ++i) dst[i] = LoadF16(src + 2 * i);
}

void DeqQ8_0(const uint8_t* src, float* dst, int64_t n) {
  const DF df;
  const DI di;
  const DI8 di8;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  for (int64_t b = 0; b < n / 32; ++b, src += 34, dst += 32) {
    const auto d = hn::Set(df, LoadF16(src));
    const auto* qs = reinterpret_cast<const int8_t*>(src + 2);
    for (int64_t j = 0; j < 32; j += N) {
      const auto q = hn::ConvertTo(df, hn::PromoteTo(di, hn::LoadU(di8, qs + j)));
      hn::StoreU(hn::Mul(q, d), df, dst + j);
    }
  }
}

HWY_INLINE void ScaleMinK4(int j, const uint8_t* q, int* d, int* m) {
  if (j < 4) {
    *d = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *d = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
    *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

void DeqQ4K(const uint8_t* src, float* dst, int64_t n) {
  const DF df;
  const DI di;
  const DU du;
  const DU8 du8;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  const auto low = hn::Set(du, 0xFu);
  for (int64_t b = 0; b < n / 256; ++b, src += 144) {
    const float d = LoadF16(src), min = LoadF16(src + 2);
    const uint8_t* scales = src + 4;
    const uint8_t* q = src + 16;
    for (int is = 0; is < 8; is += 2, q += 32, dst += 64) {
      int sc, m;
      ScaleMinK4(is, scales, &sc, &m);
      const auto d1 = hn::Set(df, d * static_cast<float>(sc));
      const auto m1 = hn::Set(df, min * static_cast<float>(m));
      ScaleMinK4(is + 1, scales, &sc, &m);
      const auto d2 = hn::Set(df, d * static_cast<float>(sc));
      const auto m2 = hn::Set(df, min * static_cast<float>(m));
      for (int64_t l = 0; l < 32; l += N) {
        const auto v = hn::PromoteTo(du, hn::LoadU(du8, q + l));
        const auto lo = hn::ConvertTo(df, hn::BitCast(di, hn::And(v, low)));
        const auto hi = hn::ConvertTo(df, hn::BitCast(di, hn::ShiftRight<4>(v)));
        hn::StoreU(hn::Sub(hn::Mul(d1, lo), m1), df, dst + l);
        hn::StoreU(hn::Sub(hn::Mul(d2, hi), m2), df, dst + 32 + l);
      }
    }
  }
}

// Q4_0 / Q4_1: 16 bytes of nibbles, low nibbles are elements 0..15, high ones 16..31.
template <bool kHasMin>
void DeqQ4Legacy(const uint8_t* src, float* dst, int64_t n) {
  const DF df;
  const DI di;
  const DU du;
  const DU8 du8;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  constexpr int64_t kBytes = kHasMin ? 20 : 18;
  const auto low = hn::Set(du, 0xFu);
  const auto eight = hn::Set(di, 8);
  for (int64_t b = 0; b < n / 32; ++b, src += kBytes, dst += 32) {
    const auto d = hn::Set(df, LoadF16(src));
    const auto m = hn::Set(df, kHasMin ? LoadF16(src + 2) : 0.0f);
    const uint8_t* qs = src + (kHasMin ? 4 : 2);
    for (int64_t j = 0; j < 16; j += N) {
      const auto v = hn::PromoteTo(du, hn::LoadU(du8, qs + j));
      auto x0 = hn::BitCast(di, hn::And(v, low));
      auto x1 = hn::BitCast(di, hn::ShiftRight<4>(v));
      if (kHasMin) {  // x * d + m
        hn::StoreU(hn::Add(hn::Mul(hn::ConvertTo(df, x0), d), m), df, dst + j);
        hn::StoreU(hn::Add(hn::Mul(hn::ConvertTo(df, x1), d), m), df, dst + 16 + j);
      } else {  // (x - 8) * d
        hn::StoreU(hn::Mul(hn::ConvertTo(df, hn::Sub(x0, eight)), d), df, dst + j);
        hn::StoreU(hn::Mul(hn::ConvertTo(df, hn::Sub(x1, eight)), d), df, dst + 16 + j);
      }
    }
  }
}

void DeqQ4_0(const uint8_t* src, float* dst, int64_t n) {
  DeqQ4Legacy<false>(src, dst, n);
}
void DeqQ4_1(const uint8_t* src, float* dst, int64_t n) {
  DeqQ4Legacy<true>(src, dst, n);
}

// Q5_0 / Q5_1: as Q4_0 / Q4_1 plus a fifth bit per element from the 32-bit qh.
template <bool kHasMin>
void DeqQ5Legacy(const uint8_t* src, float* dst, int64_t n) {
  const DF df;
  const DI di;
  const DU du;
  const DU8 du8;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  constexpr int64_t kBytes = kHasMin ? 24 : 22;
  const auto low = hn::Set(du, 0xFu);
  const auto one = hn::Set(du, 1u);
  const auto sixteen = hn::Set(di, 16);
  for (int64_t b = 0; b < n / 32; ++b, src += kBytes, dst += 32) {
    const auto d = hn::Set(df, LoadF16(src));
    const auto m = hn::Set(df, kHasMin ? LoadF16(src + 2) : 0.0f);
    uint32_t qh32;
    std::memcpy(&qh32, src + (kHasMin ? 4 : 2), 4);
    const auto qh = hn::Set(du, qh32);
    const uint8_t* qs = src + (kHasMin ? 8 : 6);
    for (int64_t j = 0; j < 16; j += N) {
      const auto lane = hn::Iota(du, static_cast<uint32_t>(j));
      const auto h0 = hn::ShiftLeft<4>(hn::And(hn::Shr(qh, lane), one));
      const auto h1 = hn::ShiftLeft<4>(hn::And(hn::Shr(qh, hn::Add(lane, hn::Set(du, 16u))), one));
      const auto v = hn::PromoteTo(du, hn::LoadU(du8, qs + j));
      auto x0 = hn::BitCast(di, hn::Or(hn::And(v, low), h0));
      auto x1 = hn::BitCast(di, hn::Or(hn::ShiftRight<4>(v), h1));
      if (kHasMin) {
        hn::StoreU(hn::Add(hn::Mul(hn::ConvertTo(df, x0), d), m), df, dst + j);
        hn::StoreU(hn::Add(hn::Mul(hn::ConvertTo(df, x1), d), m), df, dst + 16 + j);
      } else {
        hn::StoreU(hn::Mul(hn::ConvertTo(df, hn::Sub(x0, sixteen)), d), df, dst + j);
        hn::StoreU(hn::Mul(hn::ConvertTo(df, hn::Sub(x1, sixteen)), d), df, dst + 16 + j);
      }
    }
  }
}

void DeqQ5_0(const uint8_t* src, float* dst, int64_t n) {
  DeqQ5Legacy<false>(src, dst, n);
}
void DeqQ5_1(const uint8_t* src, float* dst, int64_t n) {
  DeqQ5Legacy<true>(src, dst, n);
}

void DeqQ5K(const uint8_t* src, float* dst, int64_t n) {
  const DF df;
  const DI di;
  const DU du;
  const DU8 du8;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  const auto low = hn::Set(du, 0xFu);
  const auto one = hn::Set(du, 1u);
  for (int64_t b = 0; b < n / 256; ++b, src += 176) {
    const float d = LoadF16(src), min = LoadF16(src + 2);
    const uint8_t* scales = src + 4;
    const uint8_t* qh = src + 16;
    const uint8_t* ql = src + 48;
    for (int is = 0; is < 8; is += 2, ql += 32, dst += 64) {
      int sc, m;
      ScaleMinK4(is, scales, &sc, &m);
      const auto d1 = hn::Set(df, d * static_cast<float>(sc));
      const auto m1 = hn::Set(df, min * static_cast<float>(m));
      ScaleMinK4(is + 1, scales, &sc, &m);
      const auto d2 = hn::Set(df, d * static_cast<float>(sc));
      const auto m2 = hn::Set(df, min * static_cast<float>(m));
      for (int64_t l = 0; l < 32; l += N) {
        const auto v = hn::PromoteTo(du, hn::LoadU(du8, ql + l));
        const auto h = hn::PromoteTo(du, hn::LoadU(du8, qh + l));
        // Bit `is` of qh[l] adds 16 to the low nibble, bit `is + 1` to the high one.
        const auto h1 = hn::ShiftLeft<4>(hn::And(hn::ShiftRightSame(h, is), one));
        const auto h2 = hn::ShiftLeft<4>(hn::And(hn::ShiftRightSame(h, is + 1), one));
        const auto lo = hn::ConvertTo(df, hn::BitCast(di, hn::Add(hn::And(v, low), h1)));
        const auto hi = hn::ConvertTo(df, hn::BitCast(di, hn::Add(hn::ShiftRight<4>(v), h2)));
        hn::StoreU(hn::Sub(hn::Mul(d1, lo), m1), df, dst + l);
        hn::StoreU(hn::Sub(hn::Mul(d2, hi), m2), df, dst + 32 + l);
      }
    }
  }
}

void DeqQ6K(const uint8_t* src, float* dst, int64_t n) {
  const DF df;
  const DI di;
  const DU du;
  const DU8 du8;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  const auto low = hn::Set(du, 0xFu);
  const auto three = hn::Set(du, 3u);
  const auto bias = hn::Set(di, 32);
  for (int64_t b = 0; b < n / 256; ++b, src += 210) {
    const uint8_t* ql = src;
    const uint8_t* qh = src + 128;
    const auto* sc = reinterpret_cast<const int8_t*>(src + 192);
    const float d = LoadF16(src + 208);
    for (int half = 0; half < 2; ++half, ql += 64, qh += 32, sc += 8, dst += 128) {
      for (int64_t l = 0; l < 32; l += N) {
        const int is = static_cast<int>(l / 16);
        const auto a = hn::PromoteTo(du, hn::LoadU(du8, ql + l));
        const auto c = hn::PromoteTo(du, hn::LoadU(du8, ql + l + 32));
        const auto h = hn::PromoteTo(du, hn::LoadU(du8, qh + l));
        auto level = [&](auto nibble, auto high) {
          const auto u = hn::Or(nibble, hn::ShiftLeft<4>(hn::And(high, three)));
          return hn::ConvertTo(df, hn::Sub(hn::BitCast(di, u), bias));
        };
        const auto q1 = level(hn::And(a, low), h);
        const auto q2 = level(hn::And(c, low), hn::ShiftRight<2>(h));
        const auto q3 = level(hn::ShiftRight<4>(a), hn::ShiftRight<4>(h));
        const auto q4 = level(hn::ShiftRight<4>(c), hn::ShiftRight<6>(h));
        hn::StoreU(hn::Mul(hn::Set(df, d * static_cast<float>(sc[is + 0])), q1), df, dst + l);
        hn::StoreU(hn::Mul(hn::Set(df, d * static_cast<float>(sc[is + 2])), q2), df, dst + l + 32);
        hn::StoreU(hn::Mul(hn::Set(df, d * static_cast<float>(sc[is + 4])), q3), df, dst + l + 64);
        hn::StoreU(hn::Mul(hn::Set(df, d * static_cast<float>(sc[is + 6])), q4), df, dst + l + 96);
      }
    }
  }
}

const char* TargetName() {
  return hwy::TargetName(HWY_TARGET);
}

}  // namespace HWY_NAMESPACE
}  // namespace flowkv::quant
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include "flowkv/error.h"
#include "quant/quant.h"

namespace flowkv::quant {

HWY_EXPORT(DeqBf16);
HWY_EXPORT(DeqF16);
HWY_EXPORT(DeqQ8_0);
HWY_EXPORT(DeqQ4_0);
HWY_EXPORT(DeqQ4_1);
HWY_EXPORT(DeqQ5_0);
HWY_EXPORT(DeqQ5_1);
HWY_EXPORT(DeqQ4K);
HWY_EXPORT(DeqQ5K);
HWY_EXPORT(DeqQ6K);
HWY_EXPORT(TargetName);

void dequantize_row(DType t, const void* src, float* dst, int64_t n) {
  FLOWKV_CHECK(n >= 0 && n % dtype_block(t) == 0, "dequantize_row: a ", dtype_name(t), " row of ",
               n, " elements is not a whole number of ", dtype_block(t), "-element blocks");
  const auto* s = static_cast<const uint8_t*>(src);
  switch (t) {
    case DType::kBF16:
      return HWY_DYNAMIC_DISPATCH(DeqBf16)(s, dst, n);
    case DType::kF16:
      return HWY_DYNAMIC_DISPATCH(DeqF16)(s, dst, n);
    case DType::kQ8_0:
      return HWY_DYNAMIC_DISPATCH(DeqQ8_0)(s, dst, n);
    case DType::kQ4_0:
      return HWY_DYNAMIC_DISPATCH(DeqQ4_0)(s, dst, n);
    case DType::kQ4_1:
      return HWY_DYNAMIC_DISPATCH(DeqQ4_1)(s, dst, n);
    case DType::kQ5_0:
      return HWY_DYNAMIC_DISPATCH(DeqQ5_0)(s, dst, n);
    case DType::kQ5_1:
      return HWY_DYNAMIC_DISPATCH(DeqQ5_1)(s, dst, n);
    case DType::kQ4_K:
      return HWY_DYNAMIC_DISPATCH(DeqQ4K)(s, dst, n);
    case DType::kQ5_K:
      return HWY_DYNAMIC_DISPATCH(DeqQ5K)(s, dst, n);
    case DType::kQ6_K:
      return HWY_DYNAMIC_DISPATCH(DeqQ6K)(s, dst, n);
    default:
      return dequantize_row_ref(t, src, dst, n);
  }
}

const char* dequantize_target_name() {
  return HWY_DYNAMIC_DISPATCH(TargetName)();
}

}  // namespace flowkv::quant
#endif
