// Scalar reference of ggml's block formats. Block layouts (ggml-common.h), byte offsets:
//   Q8_0  34: d f16 | qs int8[32]
//   Q4_0  18: d | qs[16]                 (low nibbles: elements 0..15, high: 16..31)
//   Q4_1  20: d | m | qs[16]
//   Q5_0  22: d | qh u32 | qs[16]       (qh bit j: the fifth bit of element j)
//   Q5_1  24: d | m | qh u32 | qs[16]
//   Q4_K 144: d | dmin | scales[12] (eight 6-bit scales and mins) | qs[128]
//   Q5_K 176: d | dmin | scales[12] | qh[32] | qs[128]
//   Q6_K 210: ql[128] | qh[64] | scales int8[16] | d
// Every product below is written in ggml's order; this file is compiled without contraction
// (-ffp-contract=off), so `a * b - c` is two roundings as in ggml's reference.
#include "quant/quant.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "flowkv/error.h"

namespace flowkv::quant {
namespace {

constexpr int kQK = 256;  // elements of a k-quant super-block

inline float load_f16(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return f16_to_f32(h);
}

inline void store_f16(uint8_t* p, float f) {
  const uint16_t h = f32_to_f16(f);
  std::memcpy(p, &h, 2);
}

void check_row(DType t, int64_t n, const char* what) {
  FLOWKV_CHECK(n >= 0 && n % dtype_block(t) == 0, what, ": a ", dtype_name(t), " row of ", n,
               " elements is not a whole number of ", dtype_block(t), "-element blocks");
}

// ---- dequantization, one block at a time ----

void deq_q8_0(const uint8_t* b, float* y) {
  const float d = load_f16(b);
  const auto* qs = reinterpret_cast<const int8_t*>(b + 2);
  for (int j = 0; j < 32; ++j) y[j] = qs[j] * d;
}

void deq_q4_0(const uint8_t* b, float* y) {
  const float d = load_f16(b);
  const uint8_t* qs = b + 2;
  for (int j = 0; j < 16; ++j) {
    y[j] = ((qs[j] & 0x0F) - 8) * d;
    y[j + 16] = ((qs[j] >> 4) - 8) * d;
  }
}

void deq_q4_1(const uint8_t* b, float* y) {
  const float d = load_f16(b), m = load_f16(b + 2);
  const uint8_t* qs = b + 4;
  for (int j = 0; j < 16; ++j) {
    y[j] = (qs[j] & 0x0F) * d + m;
    y[j + 16] = (qs[j] >> 4) * d + m;
  }
}

void deq_q5_0(const uint8_t* b, float* y) {
  const float d = load_f16(b);
  uint32_t qh;
  std::memcpy(&qh, b + 2, 4);
  const uint8_t* qs = b + 6;
  for (int j = 0; j < 16; ++j) {
    const int x0 = static_cast<int>((qs[j] & 0x0F) | (((qh >> j) << 4) & 0x10)) - 16;
    const int x1 = static_cast<int>((qs[j] >> 4) | ((qh >> (j + 12)) & 0x10)) - 16;
    y[j] = x0 * d;
    y[j + 16] = x1 * d;
  }
}

void deq_q5_1(const uint8_t* b, float* y) {
  const float d = load_f16(b), m = load_f16(b + 2);
  uint32_t qh;
  std::memcpy(&qh, b + 4, 4);
  const uint8_t* qs = b + 8;
  for (int j = 0; j < 16; ++j) {
    const int x0 = static_cast<int>((qs[j] & 0x0F) | (((qh >> j) << 4) & 0x10));
    const int x1 = static_cast<int>((qs[j] >> 4) | ((qh >> (j + 12)) & 0x10));
    y[j] = x0 * d + m;
    y[j + 16] = x1 * d + m;
  }
}

// The j-th (0..7) 6-bit scale and min of a Q4_K/Q5_K block.
inline void scale_min_k4(int j, const uint8_t* q, uint8_t* d, uint8_t* m) {
  if (j < 4) {
    *d = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *d = static_cast<uint8_t>((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
    *m = static_cast<uint8_t>((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
  }
}

void deq_q4_k(const uint8_t* b, float* y) {
  const float d = load_f16(b), min = load_f16(b + 2);
  const uint8_t* scales = b + 4;
  const uint8_t* q = b + 16;
  for (int j = 0, is = 0; j < kQK; j += 64, is += 2, q += 32) {
    uint8_t sc, m;
    scale_min_k4(is, scales, &sc, &m);
    const float d1 = d * sc, m1 = min * m;
    scale_min_k4(is + 1, scales, &sc, &m);
    const float d2 = d * sc, m2 = min * m;
    for (int l = 0; l < 32; ++l) *y++ = d1 * (q[l] & 0xF) - m1;
    for (int l = 0; l < 32; ++l) *y++ = d2 * (q[l] >> 4) - m2;
  }
}

void deq_q5_k(const uint8_t* b, float* y) {
  const float d = load_f16(b), min = load_f16(b + 2);
  const uint8_t* scales = b + 4;
  const uint8_t* qh = b + 16;
  const uint8_t* ql = b + 48;
  uint8_t u1 = 1, u2 = 2;
  for (int j = 0, is = 0; j < kQK; j += 64, is += 2, ql += 32) {
    uint8_t sc, m;
    scale_min_k4(is, scales, &sc, &m);
    const float d1 = d * sc, m1 = min * m;
    scale_min_k4(is + 1, scales, &sc, &m);
    const float d2 = d * sc, m2 = min * m;
    for (int l = 0; l < 32; ++l) *y++ = d1 * ((ql[l] & 0xF) + (qh[l] & u1 ? 16 : 0)) - m1;
    for (int l = 0; l < 32; ++l) *y++ = d2 * ((ql[l] >> 4) + (qh[l] & u2 ? 16 : 0)) - m2;
    u1 = static_cast<uint8_t>(u1 << 2);
    u2 = static_cast<uint8_t>(u2 << 2);
  }
}

void deq_q6_k(const uint8_t* b, float* y) {
  const uint8_t* ql = b;
  const uint8_t* qh = b + 128;
  const auto* sc = reinterpret_cast<const int8_t*>(b + 192);
  const float d = load_f16(b + 208);
  for (int n = 0; n < kQK; n += 128, y += 128, ql += 64, qh += 32, sc += 8) {
    for (int l = 0; l < 32; ++l) {
      const int is = l / 16;
      const int q1 = static_cast<int>((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
      const int q2 = static_cast<int>((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
      const int q3 = static_cast<int>((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
      const int q4 = static_cast<int>((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
      y[l + 0] = d * sc[is + 0] * q1;
      y[l + 32] = d * sc[is + 2] * q2;
      y[l + 64] = d * sc[is + 4] * q3;
      y[l + 96] = d * sc[is + 6] * q4;
    }
  }
}

template <void (*Block)(const uint8_t*, float*)>
void deq_blocks(DType t, const void* src, float* dst, int64_t n) {
  const auto* b = static_cast<const uint8_t*>(src);
  const int64_t qk = dtype_block(t), bytes = dtype_block_bytes(t);
  for (int64_t i = 0; i < n / qk; ++i) Block(b + i * bytes, dst + i * qk);
}

// ---- quantization helpers (ggml-quants.c) ----

// Round to nearest (ties to even) for |x| <= 2^22, by ggml's magic-number trick.
inline int nearest_int(float fval) {
  const float val = fval + 12582912.f;
  int i;
  std::memcpy(&i, &val, sizeof(int));
  return (i & 0x007fffff) - 0x00400000;
}

constexpr float kGroupMaxEps = 1e-15f;

// C's float -> integer conversion, truncating toward zero, for the values ggml's quantizers
// produce (always in range for finite input); out-of-range values, which would be undefined
// behaviour in C, saturate instead.
inline int trunc_sat(float v, int lo, int hi) {
  if (!(v > lo)) return lo;  // NaN too
  if (!(v < hi)) return hi;
  return static_cast<int>(v);
}

float make_qx_quants(int n, int nmax, const float* x, int8_t* L, int rmse_type) {
  float max = 0, amax = 0;
  for (int i = 0; i < n; ++i) {
    const float ax = std::fabs(x[i]);
    if (ax > amax) {
      amax = ax;
      max = x[i];
    }
  }
  if (amax < kGroupMaxEps) {
    for (int i = 0; i < n; ++i) L[i] = 0;
    return 0.f;
  }
  float iscale = -nmax / max;
  if (rmse_type == 0) {
    for (int i = 0; i < n; ++i) {
      const int l = nearest_int(iscale * x[i]);
      L[i] = static_cast<int8_t>(nmax + std::max(-nmax, std::min(nmax - 1, l)));
    }
    return 1 / iscale;
  }
  // Only rmse_type 1 (weights x^2) is used by the reference quantizers here.
  auto weight = [&](int i) { return x[i] * x[i]; };
  float sumlx = 0, suml2 = 0;
  for (int i = 0; i < n; ++i) {
    int l = nearest_int(iscale * x[i]);
    l = std::max(-nmax, std::min(nmax - 1, l));
    L[i] = static_cast<int8_t>(l + nmax);
    const float w = weight(i);
    sumlx += w * x[i] * l;
    suml2 += w * l * l;
  }
  float scale = suml2 ? sumlx / suml2 : 0.0f;
  float best = scale * sumlx;
  for (int is = -9; is <= 9; ++is) {
    if (is == 0) continue;
    iscale = -(nmax + 0.1f * is) / max;
    sumlx = suml2 = 0;
    for (int i = 0; i < n; ++i) {
      int l = nearest_int(iscale * x[i]);
      l = std::max(-nmax, std::min(nmax - 1, l));
      const float w = weight(i);
      sumlx += w * x[i] * l;
      suml2 += w * l * l;
    }
    if (suml2 > 0 && sumlx * sumlx > best * suml2) {
      for (int i = 0; i < n; ++i) {
        const int l = nearest_int(iscale * x[i]);
        L[i] = static_cast<int8_t>(nmax + std::max(-nmax, std::min(nmax - 1, l)));
      }
      scale = sumlx / suml2;
      best = scale * sumlx;
    }
  }
  return scale;
}

float make_qkx2_quants(int n, int nmax, const float* x, const float* weights, uint8_t* L,
                       float* the_min, uint8_t* Laux, float rmin, float rdelta, int nstep) {
  float min = x[0], max = x[0];
  float sum_w = weights[0];
  float sum_x = sum_w * x[0];
  for (int i = 1; i < n; ++i) {
    if (x[i] < min) min = x[i];
    if (x[i] > max) max = x[i];
    const float w = weights[i];
    sum_w += w;
    sum_x += w * x[i];
  }
  if (min > 0) min = 0;
  if (max == min) {
    for (int i = 0; i < n; ++i) L[i] = 0;
    *the_min = -min;
    return 0.f;
  }
  float iscale = nmax / (max - min);
  float scale = 1 / iscale;
  float best_error = 0;
  for (int i = 0; i < n; ++i) {
    const int l = nearest_int(iscale * (x[i] - min));
    L[i] = static_cast<uint8_t>(std::max(0, std::min(nmax, l)));
    float diff = scale * L[i] + min - x[i];
    diff = diff * diff;
    best_error += weights[i] * diff;
  }
  for (int is = 0; is <= nstep; ++is) {
    iscale = (rmin + rdelta * is + nmax) / (max - min);
    float sum_l = 0, sum_l2 = 0, sum_xl = 0;
    for (int i = 0; i < n; ++i) {
      int l = nearest_int(iscale * (x[i] - min));
      l = std::max(0, std::min(nmax, l));
      Laux[i] = static_cast<uint8_t>(l);
      const float w = weights[i];
      sum_l += w * l;
      sum_l2 += w * l * l;
      sum_xl += w * l * x[i];
    }
    const float D = sum_w * sum_l2 - sum_l * sum_l;
    if (D > 0) {
      float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
      float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
      if (this_min > 0) {
        this_min = 0;
        this_scale = sum_xl / sum_l2;
      }
      float cur_error = 0;
      for (int i = 0; i < n; ++i) {
        float diff = this_scale * Laux[i] + this_min - x[i];
        diff = diff * diff;
        cur_error += weights[i] * diff;
      }
      if (cur_error < best_error) {
        for (int i = 0; i < n; ++i) L[i] = Laux[i];
        best_error = cur_error;
        scale = this_scale;
        min = this_min;
      }
    }
  }
  *the_min = -min;
  return scale;
}

// ---- quantization, one block at a time ----

void q_q8_0(const float* x, uint8_t* b) {
  float amax = 0;
  for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[j]));
  const float d = amax / ((1 << 7) - 1);
  const float id = d ? 1.0f / d : 0.0f;
  store_f16(b, d);
  for (int j = 0; j < 32; ++j)
    b[2 + j] = static_cast<uint8_t>(trunc_sat(std::round(x[j] * id), -128, 127));
}

// The value of largest magnitude (the first such), with its sign.
float signed_absmax(const float* x) {
  float amax = 0, max = 0;
  for (int j = 0; j < 32; ++j) {
    if (amax < std::fabs(x[j])) {
      amax = std::fabs(x[j]);
      max = x[j];
    }
  }
  return max;
}

void q_q4_0(const float* x, uint8_t* b) {
  const float d = signed_absmax(x) / -8;
  const float id = d ? 1.0f / d : 0.0f;
  store_f16(b, d);
  for (int j = 0; j < 16; ++j) {
    const int xi0 = std::min(15, trunc_sat(x[j] * id + 8.5f, -128, 127));
    const int xi1 = std::min(15, trunc_sat(x[16 + j] * id + 8.5f, -128, 127));
    b[2 + j] = static_cast<uint8_t>(xi0 | (xi1 << 4));
  }
}

void min_max(const float* x, float* mn, float* mx) {
  float min = 3.402823466e+38f, max = -3.402823466e+38f;
  for (int j = 0; j < 32; ++j) {
    if (x[j] < min) min = x[j];
    if (x[j] > max) max = x[j];
  }
  *mn = min;
  *mx = max;
}

void q_q4_1(const float* x, uint8_t* b) {
  float min, max;
  min_max(x, &min, &max);
  const float d = (max - min) / ((1 << 4) - 1);
  const float id = d ? 1.0f / d : 0.0f;
  store_f16(b, d);
  store_f16(b + 2, min);
  for (int j = 0; j < 16; ++j) {
    const int xi0 = std::min(15, trunc_sat((x[j] - min) * id + 0.5f, -128, 127));
    const int xi1 = std::min(15, trunc_sat((x[16 + j] - min) * id + 0.5f, -128, 127));
    b[4 + j] = static_cast<uint8_t>(xi0 | (xi1 << 4));
  }
}

void q_q5_0(const float* x, uint8_t* b) {
  const float d = signed_absmax(x) / -16;
  const float id = d ? 1.0f / d : 0.0f;
  store_f16(b, d);
  uint32_t qh = 0;
  for (int j = 0; j < 16; ++j) {
    const auto xi0 = static_cast<uint8_t>(std::min(31, trunc_sat(x[j] * id + 16.5f, -128, 127)));
    const auto xi1 =
        static_cast<uint8_t>(std::min(31, trunc_sat(x[16 + j] * id + 16.5f, -128, 127)));
    b[6 + j] = static_cast<uint8_t>((xi0 & 0x0F) | ((xi1 & 0x0F) << 4));
    qh |= ((xi0 & 0x10u) >> 4) << j;
    qh |= ((xi1 & 0x10u) >> 4) << (j + 16);
  }
  std::memcpy(b + 2, &qh, 4);
}

void q_q5_1(const float* x, uint8_t* b) {
  float min, max;
  min_max(x, &min, &max);
  const float d = (max - min) / ((1 << 5) - 1);
  const float id = d ? 1.0f / d : 0.0f;
  store_f16(b, d);
  store_f16(b + 2, min);
  uint32_t qh = 0;
  for (int j = 0; j < 16; ++j) {
    const auto xi0 = static_cast<uint8_t>(trunc_sat((x[j] - min) * id + 0.5f, 0, 255));
    const auto xi1 = static_cast<uint8_t>(trunc_sat((x[16 + j] - min) * id + 0.5f, 0, 255));
    b[8 + j] = static_cast<uint8_t>((xi0 & 0x0F) | ((xi1 & 0x0F) << 4));
    qh |= ((xi0 & 0x10u) >> 4) << j;
    qh |= ((xi1 & 0x10u) >> 4) << (j + 16);
  }
  std::memcpy(b + 4, &qh, 4);
}

// Q4_K and Q5_K share the choice of the eight (scale, min) pairs and their 6-bit packing;
// returns the per-element levels in L.
void k_scales_mins(const float* x, int nmax, float rmin, int nstep, uint8_t* b, uint8_t* L) {
  float mins[8], scales[8], weights[32];
  uint8_t Laux[32];
  float max_scale = 0, max_min = 0;
  for (int j = 0; j < 8; ++j) {
    float sum_x2 = 0;
    for (int l = 0; l < 32; ++l) sum_x2 += x[32 * j + l] * x[32 * j + l];
    const float av_x = std::sqrt(sum_x2 / 32);
    for (int l = 0; l < 32; ++l) weights[l] = av_x + std::fabs(x[32 * j + l]);
    scales[j] = make_qkx2_quants(32, nmax, x + 32 * j, weights, L + 32 * j, &mins[j], Laux, rmin,
                                 0.1f, nstep);
    if (scales[j] > max_scale) max_scale = scales[j];
    if (mins[j] > max_min) max_min = mins[j];
  }
  const float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f;
  const float inv_min = max_min > 0 ? 63.f / max_min : 0.f;
  uint8_t* sc = b + 4;
  std::memset(sc, 0, 12);
  for (int j = 0; j < 8; ++j) {
    const auto ls = std::min<uint8_t>(63, static_cast<uint8_t>(nearest_int(inv_scale * scales[j])));
    const auto lm = std::min<uint8_t>(63, static_cast<uint8_t>(nearest_int(inv_min * mins[j])));
    if (j < 4) {
      sc[j] = ls;
      sc[j + 4] = lm;
    } else {
      sc[j + 4] = static_cast<uint8_t>((ls & 0xF) | ((lm & 0xF) << 4));
      sc[j - 4] |= static_cast<uint8_t>((ls >> 4) << 6);
      sc[j] |= static_cast<uint8_t>((lm >> 4) << 6);
    }
  }
  store_f16(b, max_scale / 63.f);
  store_f16(b + 2, max_min / 63.f);
  for (int j = 0; j < 8; ++j) {
    uint8_t s, m;
    scale_min_k4(j, sc, &s, &m);
    const float d = load_f16(b) * s;
    if (!d) continue;
    const float dm = load_f16(b + 2) * m;
    for (int ii = 0; ii < 32; ++ii) {
      const int l = nearest_int((x[32 * j + ii] + dm) / d);
      L[32 * j + ii] = static_cast<uint8_t>(std::max(0, std::min(nmax, l)));
    }
  }
}

void q_q4_k(const float* x, uint8_t* b) {
  uint8_t L[kQK];
  k_scales_mins(x, 15, -1.f, 20, b, L);
  uint8_t* q = b + 16;
  for (int j = 0; j < kQK; j += 64, q += 32) {
    for (int l = 0; l < 32; ++l) q[l] = static_cast<uint8_t>(L[j + l] | (L[j + l + 32] << 4));
  }
}

void q_q5_k(const float* x, uint8_t* b) {
  uint8_t L[kQK];
  k_scales_mins(x, 31, -0.5f, 15, b, L);
  uint8_t* qh = b + 16;
  uint8_t* ql = b + 48;
  std::memset(qh, 0, 32);
  uint8_t m1 = 1, m2 = 2;
  for (int n = 0; n < kQK; n += 64, ql += 32) {
    for (int j = 0; j < 32; ++j) {
      int l1 = L[n + j];
      if (l1 > 15) {
        l1 -= 16;
        qh[j] |= m1;
      }
      int l2 = L[n + j + 32];
      if (l2 > 15) {
        l2 -= 16;
        qh[j] |= m2;
      }
      ql[j] = static_cast<uint8_t>(l1 | (l2 << 4));
    }
    m1 = static_cast<uint8_t>(m1 << 2);
    m2 = static_cast<uint8_t>(m2 << 2);
  }
}

void q_q6_k(const float* x, uint8_t* b) {
  int8_t L[kQK];
  float scales[kQK / 16];
  float max_scale = 0, max_abs_scale = 0;
  for (int ib = 0; ib < kQK / 16; ++ib) {
    const float scale = make_qx_quants(16, 32, x + 16 * ib, L + 16 * ib, 1);
    scales[ib] = scale;
    const float abs_scale = std::fabs(scale);
    if (abs_scale > max_abs_scale) {
      max_abs_scale = abs_scale;
      max_scale = scale;
    }
  }
  std::memset(b, 0, 210);
  if (max_abs_scale < kGroupMaxEps) return;  // all zero (d = +0)
  const float iscale = -128.f / max_scale;
  store_f16(b + 208, 1 / iscale);
  auto* sc = reinterpret_cast<int8_t*>(b + 192);
  for (int ib = 0; ib < kQK / 16; ++ib) {
    sc[ib] = static_cast<int8_t>(std::min(127, nearest_int(iscale * scales[ib])));
  }
  for (int j = 0; j < kQK / 16; ++j) {
    const float d = load_f16(b + 208) * sc[j];
    if (!d) continue;
    for (int ii = 0; ii < 16; ++ii) {
      const int l = nearest_int(x[16 * j + ii] / d);
      L[16 * j + ii] = static_cast<int8_t>(std::max(-32, std::min(31, l)) + 32);
    }
  }
  uint8_t* ql = b;
  uint8_t* qh = b + 128;
  for (int j = 0; j < kQK; j += 128, ql += 64, qh += 32) {
    for (int l = 0; l < 32; ++l) {
      const int q1 = L[j + l] & 0xF, q2 = L[j + l + 32] & 0xF;
      const int q3 = L[j + l + 64] & 0xF, q4 = L[j + l + 96] & 0xF;
      ql[l] = static_cast<uint8_t>(q1 | (q3 << 4));
      ql[l + 32] = static_cast<uint8_t>(q2 | (q4 << 4));
      qh[l] = static_cast<uint8_t>((L[j + l] >> 4) | ((L[j + l + 32] >> 4) << 2) |
                                   ((L[j + l + 64] >> 4) << 4) | ((L[j + l + 96] >> 4) << 6));
    }
  }
}

template <void (*Block)(const float*, uint8_t*)>
void q_blocks(DType t, const float* src, void* dst, int64_t n) {
  auto* b = static_cast<uint8_t*>(dst);
  const int64_t qk = dtype_block(t), bytes = dtype_block_bytes(t);
  for (int64_t i = 0; i < n / qk; ++i) Block(src + i * qk, b + i * bytes);
}

}  // namespace

void dequantize_row_ref(DType t, const void* src, float* dst, int64_t n) {
  check_row(t, n, "dequantize_row");
  switch (t) {
    case DType::kF32:
      std::memcpy(dst, src, static_cast<size_t>(n) * 4);
      return;
    case DType::kBF16: {
      const auto* p = static_cast<const uint8_t*>(src);
      for (int64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, p + 2 * i, 2);
        dst[i] = bf16_to_f32(h);
      }
      return;
    }
    case DType::kF16:
      for (int64_t i = 0; i < n; ++i) dst[i] = load_f16(static_cast<const uint8_t*>(src) + 2 * i);
      return;
    case DType::kQ8_0:
      return deq_blocks<deq_q8_0>(t, src, dst, n);
    case DType::kQ4_0:
      return deq_blocks<deq_q4_0>(t, src, dst, n);
    case DType::kQ4_1:
      return deq_blocks<deq_q4_1>(t, src, dst, n);
    case DType::kQ5_0:
      return deq_blocks<deq_q5_0>(t, src, dst, n);
    case DType::kQ5_1:
      return deq_blocks<deq_q5_1>(t, src, dst, n);
    case DType::kQ4_K:
      return deq_blocks<deq_q4_k>(t, src, dst, n);
    case DType::kQ5_K:
      return deq_blocks<deq_q5_k>(t, src, dst, n);
    case DType::kQ6_K:
      return deq_blocks<deq_q6_k>(t, src, dst, n);
  }
  fail("dequantize_row: unknown type");
}

void quantize_row(DType t, const float* src, void* dst, int64_t n) {
  check_row(t, n, "quantize_row");
  if (t != DType::kF32 && t != DType::kBF16 && t != DType::kF16) {
    for (int64_t i = 0; i < n; ++i) {
      FLOWKV_CHECK(std::isfinite(src[i]), "quantize_row: element ", i, " is ", src[i],
                   "; only finite values can be quantized to ", dtype_name(t));
    }
  }
  auto* out = static_cast<uint8_t*>(dst);
  switch (t) {
    case DType::kF32:
      std::memcpy(dst, src, static_cast<size_t>(n) * 4);
      return;
    case DType::kBF16:
      for (int64_t i = 0; i < n; ++i) {
        const uint16_t h = f32_to_bf16(src[i]);
        std::memcpy(out + 2 * i, &h, 2);
      }
      return;
    case DType::kF16:
      for (int64_t i = 0; i < n; ++i) store_f16(out + 2 * i, src[i]);
      return;
    case DType::kQ8_0:
      return q_blocks<q_q8_0>(t, src, dst, n);
    case DType::kQ4_0:
      return q_blocks<q_q4_0>(t, src, dst, n);
    case DType::kQ4_1:
      return q_blocks<q_q4_1>(t, src, dst, n);
    case DType::kQ5_0:
      return q_blocks<q_q5_0>(t, src, dst, n);
    case DType::kQ5_1:
      return q_blocks<q_q5_1>(t, src, dst, n);
    case DType::kQ4_K:
      return q_blocks<q_q4_k>(t, src, dst, n);
    case DType::kQ5_K:
      return q_blocks<q_q5_k>(t, src, dst, n);
    case DType::kQ6_K:
      return q_blocks<q_q6_k>(t, src, dst, n);
  }
  fail("quantize_row: unknown type");
}

}  // namespace flowkv::quant
