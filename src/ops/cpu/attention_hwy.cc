// Flash-style attention kernels: scores for a tile of queries against a block of keys, an
// online softmax per row, and the value accumulation, all in f32 registers and L1/L2.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/cpu/attention_hwy.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include <cmath>
#include <cstring>
#include <limits>

#include "hwy/contrib/math/math-inl.h"
#include "hwy/highway.h"
#include "ops/cpu/attention_kernels.h"

HWY_BEFORE_NAMESPACE();
namespace flowkv::ops::cpu {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;

// Register blocking per instruction set: AVX-512 has 32 vector registers, AVX2 and SSE 16.
// Scores keep kQkRows x kKeyVecs accumulators (+ kKeyVecs key vectors + 1 broadcast) over a
// strip of kKeyVecs vectors of keys; a key block is kStrips strips (the softmax bookkeeping
// is per block, so wider blocks amortise it). The value pass keeps kPvRows x kPvVecs
// accumulators. Each configuration has at least 12 independent FMA chains.
#if HWY_TARGET <= HWY_AVX3
constexpr int kKeyVecs = 4, kStrips = 2, kQkRows = 4, kPvRows = 3, kPvVecs = 8;
#else
constexpr int kKeyVecs = 3, kStrips = 4, kQkRows = 4, kPvRows = 3, kPvVecs = 4;
#endif

int64_t KeyStrip() {
  return kKeyVecs * static_cast<int64_t>(hn::Lanes(DF()));
}
int64_t KeyBlock() {
  return kStrips * KeyStrip();
}
int64_t LaneCount() {
  return static_cast<int64_t>(hn::Lanes(DF()));
}

HWY_INLINE float LoadScalar(const void* p, bool bf16, int64_t i) {
  if (bf16) {
    uint32_t u = static_cast<uint32_t>(static_cast<const uint16_t*>(p)[i]) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
  return static_cast<const float*>(p)[i];
}

void Pack(const void* k, const void* v, bool bf16, int64_t len, int64_t ks, int64_t vs, int64_t hd,
          float* kt, float* vp) {
  const int64_t bk = KeyBlock();
  const int64_t nb = (len + bk - 1) / bk;
  for (int64_t blk = 0; blk < nb; ++blk) {
    float* dst = kt + blk * hd * bk;
    for (int64_t jj = 0; jj < bk; ++jj) {
      const int64_t j = blk * bk + jj;
      if (j < len) {
        for (int64_t d = 0; d < hd; ++d) dst[d * bk + jj] = LoadScalar(k, bf16, j * ks + d);
      } else {
        for (int64_t d = 0; d < hd; ++d) dst[d * bk + jj] = 0.0f;
      }
    }
  }
  for (int64_t j = 0; j < nb * bk; ++j) {
    float* dst = vp + j * hd;
    if (j < len && !bf16) {
      std::memcpy(dst, static_cast<const float*>(v) + j * vs, static_cast<size_t>(hd) * 4);
    } else {
      for (int64_t d = 0; d < hd; ++d) dst[d] = j < len ? LoadScalar(v, bf16, j * vs + d) : 0.0f;
    }
  }
}

// s[r][0:nk] = q[r] · kt for the strips that hold keys [0, nk); kQkRows rows at a time.
void Scores(const float* qs, int64_t nq, int64_t hd, const float* kt, int64_t nk, float* s) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const int64_t bk = KeyBlock(), strip = KeyStrip();
  for (int64_t k0 = 0; k0 < nk; k0 += strip) {
    const float* ks = kt + k0;
    int64_t r = 0;
    for (; r + kQkRows <= nq; r += kQkRows) {
      VF c[kQkRows][kKeyVecs];
      for (auto& row : c)
        for (auto& x : row) x = hn::Zero(d);
      const float* q0 = qs + r * hd;
      for (int64_t e = 0; e < hd; ++e) {
        const float* kr = ks + e * bk;
        VF kv[kKeyVecs];
        for (int v = 0; v < kKeyVecs; ++v) kv[v] = hn::Load(d, kr + v * N);
        for (int i = 0; i < kQkRows; ++i) {
          const VF qb = hn::Set(d, q0[i * hd + e]);
          for (int v = 0; v < kKeyVecs; ++v) c[i][v] = hn::MulAdd(qb, kv[v], c[i][v]);
        }
      }
      for (int i = 0; i < kQkRows; ++i)
        for (int v = 0; v < kKeyVecs; ++v) hn::Store(c[i][v], d, s + (r + i) * bk + k0 + v * N);
    }
    for (; r < nq; ++r) {
      VF c[kKeyVecs];
      for (auto& x : c) x = hn::Zero(d);
      for (int64_t e = 0; e < hd; ++e) {
        const VF qb = hn::Set(d, qs[r * hd + e]);
        for (int v = 0; v < kKeyVecs; ++v) {
          c[v] = hn::MulAdd(qb, hn::Load(d, ks + e * bk + v * N), c[v]);
        }
      }
      for (int v = 0; v < kKeyVecs; ++v) hn::Store(c[v], d, s + r * bk + k0 + v * N);
    }
  }
}

// acc[r][c0 : c0 + NV*N] += sum_j p[r][j] * v[j][c0 : ...], ROWS rows at a time: ROWS*NV
// independent accumulator chains keep the FMA units fed despite their latency.
template <int ROWS, int NV>
void AccumulateCols(const float* p, int64_t nq, int64_t bk, int64_t nk, const float* vp, int64_t hd,
                    int64_t c0, float* acc) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  int64_t r = 0;
  for (; r + ROWS <= nq; r += ROWS) {
    VF a[ROWS][NV];
    for (int i = 0; i < ROWS; ++i)
      for (int v = 0; v < NV; ++v) a[i][v] = hn::Load(d, acc + (r + i) * hd + c0 + v * N);
    for (int64_t j = 0; j < nk; ++j) {
      const float* vr = vp + j * hd + c0;
      VF b[ROWS];
      for (int i = 0; i < ROWS; ++i) b[i] = hn::Set(d, p[(r + i) * bk + j]);
      for (int v = 0; v < NV; ++v) {
        const VF x = hn::Load(d, vr + v * N);
        for (int i = 0; i < ROWS; ++i) a[i][v] = hn::MulAdd(b[i], x, a[i][v]);
      }
    }
    for (int i = 0; i < ROWS; ++i)
      for (int v = 0; v < NV; ++v) hn::Store(a[i][v], d, acc + (r + i) * hd + c0 + v * N);
  }
  if (r < nq) AccumulateCols<1, NV>(p + r * bk, nq - r, bk, nk, vp, hd, c0, acc + r * hd);
}

void Accumulate(const float* p, int64_t nq, int64_t bk, int64_t nk, const float* vp, int64_t hd,
                float* acc) {
  const int64_t N = static_cast<int64_t>(hn::Lanes(DF()));
  int64_t c0 = 0;
  for (; c0 + kPvVecs * N <= hd; c0 += kPvVecs * N) {
    AccumulateCols<kPvRows, kPvVecs>(p, nq, bk, nk, vp, hd, c0, acc);
  }
  for (; c0 + 2 * N <= hd; c0 += 2 * N) AccumulateCols<kPvRows, 2>(p, nq, bk, nk, vp, hd, c0, acc);
  for (; c0 < hd; c0 += N) AccumulateCols<kPvRows, 1>(p, nq, bk, nk, vp, hd, c0, acc);
}

void Block(const float* q, int64_t q_stride, int64_t nq, int64_t q0, int64_t hd, float scale,
           const PackedSource* src, int nsrc, float* out, int64_t out_stride, float* scratch) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const int64_t bk = KeyBlock();
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  // Scratch layout (all 64-byte aligned multiples): qs [nq][hd], s [nq][bk], acc [nq][hd], m, l.
  float* qs = scratch;
  float* s = qs + nq * hd;
  float* acc = s + nq * bk;
  float* m = acc + nq * hd;
  float* l = m + ((nq + 15) / 16) * 16;
  const VF vscale = hn::Set(d, scale);
  for (int64_t r = 0; r < nq; ++r) {
    for (int64_t e = 0; e < hd; e += N) {
      hn::Store(hn::Mul(hn::LoadU(d, q + r * q_stride + e), vscale), d, qs + r * hd + e);
      hn::Store(hn::Zero(d), d, acc + r * hd + e);
    }
    m[r] = kNegInf;
    l[r] = 0.0f;
  }
  for (int si = 0; si < nsrc; ++si) {
    const PackedSource& ps = src[si];
    const int64_t nb = (ps.len + bk - 1) / bk;
    for (int64_t blk = 0; blk < nb; ++blk) {
      const int64_t j0 = blk * bk;
      const int64_t nk = std::min(bk, ps.len - j0);
      // Causal: rows with i + off < j0 see nothing of this block; skip it if that is every row.
      if (ps.causal && j0 > q0 + nq - 1 + ps.causal_offset) break;
      Scores(qs, nq, hd, ps.kt + blk * hd * bk, nk, s);
      const bool partial_causal = ps.causal && j0 + bk - 1 > q0 + ps.causal_offset;
      if (nk < bk || partial_causal || ps.valid) {
        for (int64_t r = 0; r < nq; ++r) {
          float* sr = s + r * bk;
          for (int64_t jj = 0; jj < bk; ++jj) {
            const int64_t j = j0 + jj;
            if (jj >= nk || (ps.causal && j > q0 + r + ps.causal_offset) ||
                (ps.valid && !ps.valid[j])) {
              sr[jj] = kNegInf;
            }
          }
        }
      }
      // Online softmax: rescale what is accumulated so far to the new row maximum.
      for (int64_t r = 0; r < nq; ++r) {
        float* sr = s + r * bk;
        VF mx = hn::Load(d, sr);
        for (int64_t v = N; v < bk; v += N) mx = hn::Max(mx, hn::Load(d, sr + v));
        const float m_blk = hn::GetLane(hn::MaxOfLanes(d, mx));
        const float m_new = std::max(m[r], m_blk);
        if (m_new == kNegInf) {  // nothing allowed yet in this row
          for (int64_t jj = 0; jj < bk; jj += N) hn::Store(hn::Zero(d), d, sr + jj);
          continue;
        }
        const VF vm = hn::Set(d, m_new);
        VF sum = hn::Zero(d);
        for (int64_t v = 0; v < bk; v += N) {
          const VF e = hn::Exp(d, hn::Sub(hn::Load(d, sr + v), vm));
          hn::Store(e, d, sr + v);
          sum = hn::Add(sum, e);
        }
        const float alpha = m[r] == kNegInf ? 0.0f : std::exp(m[r] - m_new);
        if (alpha != 1.0f) {
          const VF va = hn::Set(d, alpha);
          float* ar = acc + r * hd;
          for (int64_t e = 0; e < hd; e += N)
            hn::Store(hn::Mul(hn::Load(d, ar + e), va), d, ar + e);
        }
        l[r] = l[r] * alpha + hn::GetLane(hn::SumOfLanes(d, sum));
        m[r] = m_new;
      }
      Accumulate(s, nq, bk, nk, ps.v + j0 * hd, hd, acc);
    }
  }
  for (int64_t r = 0; r < nq; ++r) {
    const VF inv = hn::Set(d, l[r] > 0 ? 1.0f / l[r] : 0.0f);
    for (int64_t e = 0; e < hd; e += N) {
      hn::StoreU(hn::Mul(hn::Load(d, acc + r * hd + e), inv), d, out + r * out_stride + e);
    }
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace flowkv::ops::cpu
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace flowkv::ops::cpu {

HWY_EXPORT(KeyBlock);
HWY_EXPORT(LaneCount);
HWY_EXPORT(Pack);
HWY_EXPORT(Block);

const AttnKernels& attn_kernels() {
  static const AttnKernels k = {
      HWY_DYNAMIC_DISPATCH(KeyBlock)(),
      HWY_DYNAMIC_DISPATCH(LaneCount)(),
      [](const void* kk, const void* v, bool bf16, int64_t len, int64_t ks, int64_t vs, int64_t hd,
         float* kt, float* vp) {
        HWY_DYNAMIC_DISPATCH(Pack)(kk, v, bf16, len, ks, vs, hd, kt, vp);
      },
      [](const float* q, int64_t qs, int64_t nq, int64_t q0, int64_t hd, float scale,
         const PackedSource* src, int nsrc, float* out, int64_t os, float* scratch) {
        HWY_DYNAMIC_DISPATCH(Block)(q, qs, nq, q0, hd, scale, src, nsrc, out, os, scratch);
      },
  };
  return k;
}

int64_t attn_scratch_floats(int64_t nq, int64_t hd, int64_t key_block) {
  return nq * hd * 2 + nq * key_block + 2 * ((nq + 15) / 16) * 16 + 64;
}

}  // namespace flowkv::ops::cpu
#endif
