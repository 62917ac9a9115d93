// The narrow-weight GEMM (see ops/gemm.h): packing and a 6 x (2 vectors) micro-kernel.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/cpu/gemm_hwy.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include "hwy/highway.h"

#ifndef FLOWKV_GEMM_HWY_SHARED
#define FLOWKV_GEMM_HWY_SHARED
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "flowkv/dtype.h"
#include "ops/gemm.h"

namespace flowkv::ops::cpu {
constexpr int64_t kMr = 6;  // rows per micro-tile
constexpr int64_t kKc = kGemmKBlock;

inline float* scratch(std::vector<float>& v, size_t n) {
  if (v.size() < n) v.resize(n);
  return v.data();
}
}  // namespace flowkv::ops::cpu
#endif

HWY_BEFORE_NAMESPACE();
namespace flowkv::ops::cpu {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

#if HWY_TARGET == HWY_AVX2
// Transposes rows[8][kc] (row stride kc), columns [k, k + 8), into dst[k + i][0..8) (row stride
// nr): one 8 x 8 block, by unpacks and lane concatenations.
template <class D>
HWY_INLINE void Transpose8(D d, const float* rows, int64_t kc, float* dst, int64_t nr) {
  const hn::Repartition<double, D> dd;
  using V = hn::Vec<D>;
  V r[8];
  for (int i = 0; i < 8; ++i) r[i] = hn::LoadU(d, rows + i * kc);
  const V t0 = hn::InterleaveLower(d, r[0], r[1]), t1 = hn::InterleaveUpper(d, r[0], r[1]);
  const V t2 = hn::InterleaveLower(d, r[2], r[3]), t3 = hn::InterleaveUpper(d, r[2], r[3]);
  const V t4 = hn::InterleaveLower(d, r[4], r[5]), t5 = hn::InterleaveUpper(d, r[4], r[5]);
  const V t6 = hn::InterleaveLower(d, r[6], r[7]), t7 = hn::InterleaveUpper(d, r[6], r[7]);
  auto lo64 = [&](V a, V b) {
    return hn::BitCast(d, hn::InterleaveLower(dd, hn::BitCast(dd, a), hn::BitCast(dd, b)));
  };
  auto hi64 = [&](V a, V b) {
    return hn::BitCast(d, hn::InterleaveUpper(dd, hn::BitCast(dd, a), hn::BitCast(dd, b)));
  };
  const V u0 = lo64(t0, t2), u1 = hi64(t0, t2), u2 = lo64(t1, t3), u3 = hi64(t1, t3);
  const V u4 = lo64(t4, t6), u5 = hi64(t4, t6), u6 = lo64(t5, t7), u7 = hi64(t5, t7);
  hn::StoreU(hn::ConcatLowerLower(d, u4, u0), d, dst);
  hn::StoreU(hn::ConcatLowerLower(d, u5, u1), d, dst + nr);
  hn::StoreU(hn::ConcatLowerLower(d, u6, u2), d, dst + 2 * nr);
  hn::StoreU(hn::ConcatLowerLower(d, u7, u3), d, dst + 3 * nr);
  hn::StoreU(hn::ConcatUpperUpper(d, u4, u0), d, dst + 4 * nr);
  hn::StoreU(hn::ConcatUpperUpper(d, u5, u1), d, dst + 5 * nr);
  hn::StoreU(hn::ConcatUpperUpper(d, u6, u2), d, dst + 6 * nr);
  hn::StoreU(hn::ConcatUpperUpper(d, u7, u3), d, dst + 7 * nr);
}
#endif

// Packs B rows [j0, j0 + cols) (cols <= nr), all k, into one sliver [k][nr] (columns past cols
// are zero), widening kKc columns at a time through `rows` [nr][kKc].
void PackSliver(const RowSource& b, int64_t j0, int64_t cols, int64_t k, int64_t nr, float* sl,
                float* rows) {
  for (int64_t k0 = 0; k0 < k; k0 += kKc) {
    const int64_t kc = std::min(kKc, k - k0);
    b.widen(b.self, j0, cols, k0, kc, rows);
    float* out = sl + k0 * nr;
    int64_t i = 0;
#if HWY_TARGET == HWY_AVX2
    // Whole 8 x 8 blocks by vector transposes (8 lanes here, so nr = 16: two row groups).
    if (cols == nr) {
      const hn::FixedTag<float, 8> d8;
      for (; i + 8 <= kc; i += 8) {
        Transpose8(d8, rows + i, kc, out + i * nr, nr);
        Transpose8(d8, rows + 8 * kc + i, kc, out + i * nr + 8, nr);
      }
    }
#endif
    for (; i < kc; ++i) {
      float* dst = out + i * nr;
      for (int64_t j = 0; j < cols; ++j) dst[j] = rows[j * kc + i];
      for (int64_t j = cols; j < nr; ++j) dst[j] = 0.0f;
    }
  }
}

// c[6][2 vectors] (row stride ldc) = sum_k a[r][k] * bp[k][j], one FMA chain per output from
// k = 0, A read in place (row stride lda); rows from h on repeat row h - 1 (not kept).
void Kernel(int64_t kc, const float* a, int64_t lda, int64_t h, const float* HWY_RESTRICT bp,
            float* c, int64_t ldc) {
  const hn::ScalableTag<float> d;
  const size_t L = hn::Lanes(d);
  const float* a0 = a;
  const float* a1 = a + std::min<int64_t>(1, h - 1) * lda;
  const float* a2 = a + std::min<int64_t>(2, h - 1) * lda;
  const float* a3 = a + std::min<int64_t>(3, h - 1) * lda;
  const float* a4 = a + std::min<int64_t>(4, h - 1) * lda;
  const float* a5 = a + std::min<int64_t>(5, h - 1) * lda;
  auto c00 = hn::Zero(d), c01 = hn::Zero(d), c10 = hn::Zero(d), c11 = hn::Zero(d);
  auto c20 = hn::Zero(d), c21 = hn::Zero(d), c30 = hn::Zero(d), c31 = hn::Zero(d);
  auto c40 = hn::Zero(d), c41 = hn::Zero(d), c50 = hn::Zero(d), c51 = hn::Zero(d);
  for (int64_t k = 0; k < kc; ++k) {
    const auto b0 = hn::LoadU(d, bp), b1 = hn::LoadU(d, bp + L);
    auto a = hn::Set(d, a0[k]);
    c00 = hn::MulAdd(a, b0, c00);
    c01 = hn::MulAdd(a, b1, c01);
    a = hn::Set(d, a1[k]);
    c10 = hn::MulAdd(a, b0, c10);
    c11 = hn::MulAdd(a, b1, c11);
    a = hn::Set(d, a2[k]);
    c20 = hn::MulAdd(a, b0, c20);
    c21 = hn::MulAdd(a, b1, c21);
    a = hn::Set(d, a3[k]);
    c30 = hn::MulAdd(a, b0, c30);
    c31 = hn::MulAdd(a, b1, c31);
    a = hn::Set(d, a4[k]);
    c40 = hn::MulAdd(a, b0, c40);
    c41 = hn::MulAdd(a, b1, c41);
    a = hn::Set(d, a5[k]);
    c50 = hn::MulAdd(a, b0, c50);
    c51 = hn::MulAdd(a, b1, c51);
    bp += 2 * L;
  }
  auto store = [&](float* row, decltype(c00) v0, decltype(c00) v1) {
    hn::StoreU(v0, d, row);
    hn::StoreU(v1, d, row + L);
  };
  store(c, c00, c01);
  store(c + ldc, c10, c11);
  store(c + 2 * ldc, c20, c21);
  store(c + 3 * ldc, c30, c31);
  store(c + 4 * ldc, c40, c41);
  store(c + 5 * ldc, c50, c51);
}

// Sliver by sliver: the sliver (all of K, in L2) is packed once and every micro-tile of rows
// streams A past it; each output is one FMA chain over k and is stored once.
void GemmRowsSource(const float* a, int64_t lda, int64_t m, int64_t k, const RowSource& b,
                    int64_t n0, int64_t n1, float* c, int64_t ldc) {
  const hn::ScalableTag<float> d;
  const int64_t nr = 2 * static_cast<int64_t>(hn::Lanes(d));
  thread_local std::vector<float> sbuf, rbuf;
  float* sl = scratch(sbuf, static_cast<size_t>(k * nr));
  float* rows = scratch(rbuf, static_cast<size_t>(nr * kKc));
  float edge[kMr * 64];  // a partial micro-tile (nr <= 64)
  for (int64_t j0 = n0; j0 < n1; j0 += nr) {
    const int64_t cols = std::min(nr, n1 - j0);
    PackSliver(b, j0, cols, k, nr, sl, rows);
    for (int64_t p = 0; p < m; p += kMr) {
      const int64_t h = std::min(kMr, m - p);
      float* ct = c + p * ldc + j0;
      if (h == kMr && cols == nr) {
        Kernel(k, a + p * lda, lda, h, sl, ct, ldc);
        continue;
      }
      Kernel(k, a + p * lda, lda, h, sl, edge, nr);
      for (int64_t i = 0; i < h; ++i) {
        std::memcpy(ct + i * ldc, edge + i * nr, static_cast<size_t>(cols) * 4);
      }
    }
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace flowkv::ops::cpu
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace flowkv::ops {
namespace cpu {
HWY_EXPORT(GemmRowsSource);
}

void gemm_rows_source(const float* a, int64_t lda, int64_t m, int64_t k, const RowSource& b,
                      int64_t n0, int64_t n1, float* c, int64_t ldc) {
  if (m <= 0 || n1 <= n0) return;
  if (k == 0) {
    for (int64_t r = 0; r < m; ++r) std::fill(c + r * ldc + n0, c + r * ldc + n1, 0.0f);
    return;
  }
  HWY_DYNAMIC_DISPATCH(cpu::GemmRowsSource)(a, lda, m, k, b, n0, n1, c, ldc);
}

void gemm_rows_source_reference(const float* a, int64_t lda, int64_t m, int64_t k,
                                const RowSource& b, int64_t n0, int64_t n1, float* c, int64_t ldc) {
  std::vector<float> row(static_cast<size_t>(k));
  for (int64_t j = n0; j < n1; ++j) {
    for (int64_t k0 = 0; k0 < k; k0 += cpu::kKc) {
      const int64_t kc = std::min(cpu::kKc, k - k0);
      b.widen(b.self, j, 1, k0, kc, row.data() + k0);
    }
    for (int64_t r = 0; r < m; ++r) {
      float total = 0.0f;
      for (int64_t i = 0; i < k; ++i) total = std::fma(a[r * lda + i], row[size_t(i)], total);
      c[r * ldc + j] = total;
    }
  }
}

}  // namespace flowkv::ops
#endif
