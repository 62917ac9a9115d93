// AVX2 int8 kernels (this file is compiled with -mavx2 -ffp-contract=off; it runs only after
// the driver has checked the CPU). Products use vpmaddubsw, which multiplies unsigned by signed
// bytes and adds pairs with signed 16-bit saturation; as in ggml's trick, but mirrored, the
// unsigned operand is |w| and the signed one is q carrying the sign of w (vpsignb), both within
// 127 in magnitude, so a pair sum is at most 2 * 127 * 127 = 32,258 and never saturates.
// vpmaddwd by ones then widens to exact int32 sums of 4 products.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "ops/cpu/int8_kernels.h"

namespace flowkv::ops::int8 {

namespace {

// c = c + (sx * sw) * float(dot), c starting from 0.0f at block 0 (as the reference).
inline void update_row(float sx, __m256 sw0, __m256 sw1, __m256i d0, __m256i d1, bool first,
                       float* ci) {
  const __m256 vx = _mm256_set1_ps(sx);
  const __m256 c0 = first ? _mm256_setzero_ps() : _mm256_loadu_ps(ci);
  const __m256 c1 = first ? _mm256_setzero_ps() : _mm256_loadu_ps(ci + 8);
  const __m256 t0 = _mm256_mul_ps(vx, sw0), t1 = _mm256_mul_ps(vx, sw1);
  _mm256_storeu_ps(ci, _mm256_add_ps(c0, _mm256_mul_ps(t0, _mm256_cvtepi32_ps(d0))));
  _mm256_storeu_ps(ci + 8, _mm256_add_ps(c1, _mm256_mul_ps(t1, _mm256_cvtepi32_ps(d1))));
}

alignas(32) constexpr int16_t kOnes[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1};

// Row i of a 5-row tile: ymm10/11 = w0/w1, ymm12/13 = |w0|/|w1|, ymm14 = q broadcast, ymm15
// temporary, ones from memory (the 10 accumulators take ymm0-9).
#define FLOWKV_INT8_ROW5(i, acc0, acc1)      \
  "vpbroadcastd " #i                         \
  "*4(%[ap]), %%ymm14\n\t"                   \
  "vpsignb %%ymm10, %%ymm14, %%ymm15\n\t"    \
  "vpmaddubsw %%ymm15, %%ymm12, %%ymm15\n\t" \
  "vpmaddwd (%[ones]), %%ymm15, %%ymm15\n\t" \
  "vpaddd %%ymm15, %%" #acc0 ", %%" #acc0    \
  "\n\t"                                     \
  "vpsignb %%ymm11, %%ymm14, %%ymm15\n\t"    \
  "vpmaddubsw %%ymm15, %%ymm13, %%ymm15\n\t" \
  "vpmaddwd (%[ones]), %%ymm15, %%ymm15\n\t" \
  "vpaddd %%ymm15, %%" #acc1 ", %%" #acc1 "\n\t"

// Quantizes one block (as quantize_block_int8) into s and u; returns the scale.
float quantize_block(const float* x, int64_t len, bool offset, int8_t* s, uint8_t* u) {
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  __m256 vmax = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= len; i += 8) {
    vmax = _mm256_max_ps(_mm256_and_ps(_mm256_loadu_ps(x + i), abs_mask), vmax);
  }
  float lanes[8];
  _mm256_storeu_ps(lanes, vmax);
  float amax = 0.0f;
  for (float l : lanes) amax = l > amax ? l : amax;
  for (; i < len; ++i) {
    const float a = std::fabs(x[i]);
    amax = a > amax ? a : amax;
  }
  const float scale = amax / 127.0f;
  if (!(scale > 0.0f)) {
    std::memset(s, 0, len);
    std::memset(u, offset ? 0x80 : 0, len);
    return 0.0f;
  }
  const __m256 vs = _mm256_set1_ps(scale);
  const __m256 lo = _mm256_set1_ps(-127.0f), hi = _mm256_set1_ps(127.0f);
  auto q8 = [&](const float* p) {
    __m256 v = _mm256_round_ps(_mm256_div_ps(_mm256_loadu_ps(p), vs),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    v = _mm256_min_ps(_mm256_max_ps(v, lo), hi);
    return _mm256_cvtps_epi32(v);
  };
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  const __m256i flip = _mm256_set1_epi8(static_cast<char>(0x80));
  i = 0;
  for (; i + 32 <= len; i += 32) {
    const __m256i ab = _mm256_packs_epi32(q8(x + i), q8(x + i + 8));
    const __m256i cd = _mm256_packs_epi32(q8(x + i + 16), q8(x + i + 24));
    const __m256i q = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(ab, cd), order);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(s + i), q);
    const __m256i uq = offset ? _mm256_xor_si256(q, flip) : _mm256_abs_epi8(q);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(u + i), uq);
  }
  for (; i < len; ++i) {
    float v = std::nearbyint(x[i] / scale);
    v = v > -127.0f ? v : -127.0f;
    v = v < 127.0f ? v : 127.0f;
    s[i] = static_cast<int8_t>(v);
    u[i] = static_cast<uint8_t>(offset ? s[i] + 128 : std::abs(s[i]));
  }
  return scale;
}

// kRowsAvx2 (5) rows x one panel (16 outputs, two vectors) over one K block: the activations of
// the row tile (ap) and the panel's weights (wp) are each one stream. Per quad (4 K values) and
// row: one broadcast and, per vector, vpsignb (q takes w's sign), vpmaddubsw (|w| unsigned times
// that, pairs in s16: at most 2 * 127 * 127 = 32,258, never saturating), vpmaddwd by ones (exact
// s32 sums of 4) and vpaddd. Written in assembly for its registers: 10 accumulators, w and |w|
// (two vectors each), q and a temporary fill the 16; GCC, from intrinsics, spilled and copied
// accumulators in the loop (1.13x the f32 Linear, against 1.45-1.5x for this, single thread).
inline void tile5(const uint8_t* ap, const int8_t* wp, int64_t quads, const float* sx,
                  const float* sw, bool first, float* c, int64_t ldc) {
  alignas(32) int32_t dot[10][8];  // [row * 2 + half][output]
  asm volatile(
      "vpxor %%ymm0, %%ymm0, %%ymm0\n\t"
      "vpxor %%ymm1, %%ymm1, %%ymm1\n\t"
      "vpxor %%ymm2, %%ymm2, %%ymm2\n\t"
      "vpxor %%ymm3, %%ymm3, %%ymm3\n\t"
      "vpxor %%ymm4, %%ymm4, %%ymm4\n\t"
      "vpxor %%ymm5, %%ymm5, %%ymm5\n\t"
      "vpxor %%ymm6, %%ymm6, %%ymm6\n\t"
      "vpxor %%ymm7, %%ymm7, %%ymm7\n\t"
      "vpxor %%ymm8, %%ymm8, %%ymm8\n\t"
      "vpxor %%ymm9, %%ymm9, %%ymm9\n\t"
      "1:\n\t"
      "vmovdqu (%[wp]), %%ymm10\n\t"
      "vmovdqu 32(%[wp]), %%ymm11\n\t"
      "vpabsb %%ymm10, %%ymm12\n\t"
      "vpabsb %%ymm11, %%ymm13\n\t"
      FLOWKV_INT8_ROW5(0, ymm0, ymm1)
      FLOWKV_INT8_ROW5(1, ymm2, ymm3)
      FLOWKV_INT8_ROW5(2, ymm4, ymm5)
      FLOWKV_INT8_ROW5(3, ymm6, ymm7)
      FLOWKV_INT8_ROW5(4, ymm8, ymm9)
      "add $64, %[wp]\n\t"
      "add $20, %[ap]\n\t"
      "dec %[n]\n\t"
      "jnz 1b\n\t"
      "vmovdqa %%ymm0, (%[dot])\n\t"
      "vmovdqa %%ymm1, 32(%[dot])\n\t"
      "vmovdqa %%ymm2, 64(%[dot])\n\t"
      "vmovdqa %%ymm3, 96(%[dot])\n\t"
      "vmovdqa %%ymm4, 128(%[dot])\n\t"
      "vmovdqa %%ymm5, 160(%[dot])\n\t"
      "vmovdqa %%ymm6, 192(%[dot])\n\t"
      "vmovdqa %%ymm7, 224(%[dot])\n\t"
      "vmovdqa %%ymm8, 256(%[dot])\n\t"
      "vmovdqa %%ymm9, 288(%[dot])\n\t"
      : [wp] "+r"(wp), [ap] "+r"(ap), [n] "+r"(quads)
      : [dot] "r"(&dot[0][0]), [ones] "r"(kOnes)
      : "memory", "cc", "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8",
        "xmm9", "xmm10", "xmm11", "xmm12", "xmm13", "xmm14", "xmm15");
  const __m256 sw0 = _mm256_loadu_ps(sw), sw1 = _mm256_loadu_ps(sw + 8);
  for (int i = 0; i < 5; ++i) {
    update_row(sx[i], sw0, sw1, _mm256_load_si256(reinterpret_cast<const __m256i*>(dot[2 * i])),
               _mm256_load_si256(reinterpret_cast<const __m256i*>(dot[2 * i + 1])), first,
               c + i * ldc);
  }
}

}  // namespace

void gemm_avx2(const Act& a, const Int8Weights& w, int64_t m0, int64_t rows, int64_t p0, int64_t p1,
               float* c, int64_t ldc) {
  constexpr int64_t kP = Int8Weights::kPanel;
  const int64_t quads = w.block_stride / 4;
  float sx[kRowsAvx2];
  for (int64_t b = 0; b < w.blocks; ++b) {
    for (int64_t p = p0; p < p1; ++p) {
      const int8_t* wp = w.values->data() + (p * w.blocks + b) * w.block_stride * kP;
      const float* sw = w.scales->data() + (p * w.blocks + b) * kP;
      for (int64_t r = 0; r < rows; r += kRowsAvx2) {
        for (int64_t i = 0; i < kRowsAvx2; ++i) sx[i] = a.scale[(m0 + r + i) * w.blocks + b];
        tile5(a.at(m0 + r, b), wp, quads, sx, sw, b == 0, c + r * ldc + (p - p0) * kP, ldc);
      }
    }
  }
}

void pack_rows_avx2(Mat x, int64_t r0, int64_t rows, const Int8Weights& w, const Act& a) {
  const bool offset = a.offset;  // VNNI: q + 128
  std::vector<int8_t> s(w.block_stride);
  std::vector<uint8_t> u(w.block_stride);
  std::vector<float> zeros(x.rows <= r0 + rows ? w.k : 0, 0.0f);
  for (int64_t r = r0; r < r0 + rows; ++r) {
    const float* xr = r < x.rows ? x.row(r) : zeros.data();
    for (int64_t b = 0; b < w.blocks; ++b) {
      const int64_t len = std::min(w.block, w.k - b * w.block);
      a.scale[r * w.blocks + b] = quantize_block(xr + b * w.block, len, offset, s.data(), u.data());
      std::memset(s.data() + len, 0, w.block_stride - len);
      std::memset(u.data() + len, offset ? 0x80 : 0, w.block_stride - len);
      uint8_t* dst = a.at(r - r % a.mr, b) + (r % a.mr) * a.quad_bytes;
      for (int64_t j = 0; j < a.quads; ++j, dst += a.mr * a.quad_bytes) {
        std::memcpy(dst, offset ? static_cast<const void*>(u.data() + 4 * j) : s.data() + 4 * j, 4);
      }
    }
  }
}

}  // namespace flowkv::ops::int8
