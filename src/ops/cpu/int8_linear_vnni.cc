// AVX-512 VNNI int8 kernel (compiled with -mavx512f -mavx512bw -mavx512vl -mavx512vnni
// -ffp-contract=off; run only after the driver has checked the CPU). vpdpbusd multiplies
// unsigned by signed bytes and adds groups of 4 into int32 without intermediate saturation, so
// the activations enter as q + 128 (0..254) and the dot is corrected by 128 * sum(w) per
// output and block, which the weights carry: exact.
//
// NOT RUN where it was written (an AVX2-only machine): it compiles, and the driver calls it only
// when the CPU reports AVX-512 VNNI. Its tests are the same bit-identity tests as the AVX2
// kernel's, which run it on such a CPU.
#include <immintrin.h>

#include <cstring>

#include "ops/cpu/int8_kernels.h"

namespace flowkv::ops::int8 {

namespace {

// kRowsVnni rows x NP panels (16 outputs each, one vector), over one K block.
template <int MR, int NP>
inline void tile(const Act& a, const Int8Weights& w, int64_t m, int64_t b, int64_t p, float* c,
                 int64_t ldc) {
  constexpr int64_t kP = Int8Weights::kPanel;
  const int64_t quads = w.block_stride / 4;
  const int64_t panel_bytes = w.blocks * w.block_stride * kP;
  const int8_t* wp = w.values->data() + (p * w.blocks + b) * w.block_stride * kP;
  const uint8_t* ap = a.at(m, b);
  __m512i acc[MR][NP];
  for (int i = 0; i < MR; ++i) {
    for (int j = 0; j < NP; ++j) acc[i][j] = _mm512_setzero_si512();
  }
  for (int64_t q = 0; q < quads; ++q) {
    __m512i wv[NP];
    for (int j = 0; j < NP; ++j) wv[j] = _mm512_loadu_si512(wp + j * panel_bytes + 64 * q);
    for (int i = 0; i < MR; ++i) {
      const __m512i uq = _mm512_set1_epi32(load32(ap + 4 * i));
      for (int j = 0; j < NP; ++j) acc[i][j] = _mm512_dpbusd_epi32(acc[i][j], uq, wv[j]);
    }
    ap += 4 * MR;
  }
  for (int j = 0; j < NP; ++j) {
    const int64_t sidx = ((p + j) * w.blocks + b) * kP;
    const __m512 sw = _mm512_loadu_ps(w.scales->data() + sidx);
    const __m512i corr = _mm512_slli_epi32(_mm512_loadu_si512(w.sums->data() + sidx), 7);
    for (int i = 0; i < MR; ++i) {
      const __m512 sx = _mm512_set1_ps(a.scale[(m + i) * w.blocks + b]);
      float* ci = c + i * ldc + j * kP;
      const __m512 c0 = b == 0 ? _mm512_setzero_ps() : _mm512_loadu_ps(ci);
      const __m512 dot = _mm512_cvtepi32_ps(_mm512_sub_epi32(acc[i][j], corr));
      _mm512_storeu_ps(ci, _mm512_add_ps(c0, _mm512_mul_ps(_mm512_mul_ps(sx, sw), dot)));
    }
  }
}

}  // namespace

void gemm_vnni(const Act& a, const Int8Weights& w, int64_t m0, int64_t rows, int64_t p0, int64_t p1,
               float* c, int64_t ldc) {
  constexpr int64_t kP = Int8Weights::kPanel;
  for (int64_t b = 0; b < w.blocks; ++b) {
    int64_t p = p0;
    for (; p + 2 <= p1; p += 2) {
      for (int64_t r = 0; r < rows; r += kRowsVnni) {
        tile<kRowsVnni, 2>(a, w, m0 + r, b, p, c + r * ldc + (p - p0) * kP, ldc);
      }
    }
    for (; p < p1; ++p) {
      for (int64_t r = 0; r < rows; r += kRowsVnni) {
        tile<kRowsVnni, 1>(a, w, m0 + r, b, p, c + r * ldc + (p - p0) * kP, ldc);
      }
    }
  }
}

}  // namespace flowkv::ops::int8
