// Element types of checkpoints and tensors, and exact conversions between them.
#pragma once

#include <cstdint>
#include <cstring>
#include <string_view>

namespace flowkv {

enum class DType : uint8_t { kF32, kBF16, kF16 };

constexpr int64_t dtype_size(DType t) {
  return t == DType::kF32 ? 4 : 2;
}

constexpr std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::kF32:
      return "F32";
    case DType::kBF16:
      return "BF16";
    case DType::kF16:
      return "F16";
  }
  return "?";
}

// Round-to-nearest-even, as torch's float -> bfloat16 cast. NaN stays a quiet NaN.
inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

inline float bf16_to_f32(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// The value bf16 would store, kept in f32: what a bf16 tensor round trip does.
inline float round_bf16(float f) {
  return bf16_to_f32(f32_to_bf16(f));
}

// IEEE half -> float (exact; every f16 value is an f32 value).
inline float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      exp = 127 - 15 + 1;
      while ((mant & 0x400u) == 0) {
        mant <<= 1;
        --exp;
      }
      mant &= 0x3ffu;
      bits = sign | (exp << 23) | (mant << 13);
    }
  } else if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// float -> IEEE half, round-to-nearest-even (used by tests that write F16 checkpoints).
uint16_t f32_to_f16(float f);

}  // namespace flowkv
