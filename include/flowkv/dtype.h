// Element types of checkpoints and tensors, and exact conversions between them.
#pragma once

#include <cstdint>
#include <cstring>
#include <string_view>

namespace flowkv {

// Dense types (one element each) and GGUF's block-quantized types (ggml's formats: a block of
// 32 or 256 consecutive elements of a row shares its scales). A quantized tensor's last
// dimension is a whole number of blocks; its rows are independent.
enum class DType : uint8_t {
  kF32,
  kBF16,
  kF16,
  kQ8_0,
  kQ4_0,
  kQ4_1,
  kQ5_0,
  kQ5_1,
  kQ4_K,
  kQ5_K,
  kQ6_K
};

constexpr bool dtype_is_quantized(DType t) {
  return t != DType::kF32 && t != DType::kBF16 && t != DType::kF16;
}

// Elements per block: 1 for dense types.
constexpr int64_t dtype_block(DType t) {
  switch (t) {
    case DType::kF32:
    case DType::kBF16:
    case DType::kF16:
      return 1;
    case DType::kQ8_0:
    case DType::kQ4_0:
    case DType::kQ4_1:
    case DType::kQ5_0:
    case DType::kQ5_1:
      return 32;
    case DType::kQ4_K:
    case DType::kQ5_K:
    case DType::kQ6_K:
      return 256;
  }
  return 1;
}

// Bytes per block (ggml's block structs).
constexpr int64_t dtype_block_bytes(DType t) {
  switch (t) {
    case DType::kF32:
      return 4;
    case DType::kBF16:
    case DType::kF16:
      return 2;
    case DType::kQ8_0:
      return 34;
    case DType::kQ4_0:
      return 18;
    case DType::kQ4_1:
      return 20;
    case DType::kQ5_0:
      return 22;
    case DType::kQ5_1:
      return 24;
    case DType::kQ4_K:
      return 144;
    case DType::kQ5_K:
      return 176;
    case DType::kQ6_K:
      return 210;
  }
  return 4;
}

// Bytes per element of a dense type; 0 for a quantized one (use dtype_bytes).
constexpr int64_t dtype_size(DType t) {
  return dtype_is_quantized(t) ? 0 : dtype_block_bytes(t);
}

// Bytes of `numel` elements; numel must be a whole number of blocks (checked where shapes are
// validated: a quantized tensor's last dimension divides by its block).
constexpr int64_t dtype_bytes(DType t, int64_t numel) {
  return numel / dtype_block(t) * dtype_block_bytes(t);
}

constexpr std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::kF32:
      return "F32";
    case DType::kBF16:
      return "BF16";
    case DType::kF16:
      return "F16";
    case DType::kQ8_0:
      return "Q8_0";
    case DType::kQ4_0:
      return "Q4_0";
    case DType::kQ4_1:
      return "Q4_1";
    case DType::kQ5_0:
      return "Q5_0";
    case DType::kQ5_1:
      return "Q5_1";
    case DType::kQ4_K:
      return "Q4_K";
    case DType::kQ5_K:
      return "Q5_K";
    case DType::kQ6_K:
      return "Q6_K";
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
