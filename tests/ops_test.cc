// Level 1 and 2 of the test ladder: every op's fast kernel against its scalar reference at odd
// sizes and remainders, and thread-count independence.
#include <gtest/gtest.h>

#include <cstring>

#include "core/parallel.h"
#include "ops/attention.h"
#include "ops/gemm.h"
#include "ops/linear.h"
#include "ops/ops.h"
#include "test_util.h"

namespace flowkv {
namespace {

using test::compare;
using test::randn;

struct Ctx {
  Arena arena;
  ExecContext fast{&arena, KernelPath::kFast, nullptr};
  ExecContext ref{&arena, KernelPath::kReference, nullptr};
};

TEST(Ops, LayerNormModulateMatchesReference) {
  Ctx c;
  for (int64_t cols : {1, 7, 16, 33, 96, 517}) {
    const int64_t rows = 13, groups = 2;
    auto x = randn(rows * cols, 1, 3.0f);
    auto sc = randn(groups * cols, 2, 0.5f), sh = randn(groups * cols, 3);
    std::vector<float> a(x.size()), b(x.size());
    // rows_per_group 7: the two groups split rows 0-6 and 7-12.
    ops::ModRows scale{sc.data(), cols, 7}, shift{sh.data(), cols, 7};
    ops::layer_norm_modulate(c.fast, make_mat(x.data(), rows, cols), make_mat(a.data(), rows, cols),
                             scale, shift, 1e-6f);
    ops::layer_norm_modulate(c.ref, make_mat(x.data(), rows, cols), make_mat(b.data(), rows, cols),
                             scale, shift, 1e-6f);
    EXPECT_LE(compare(a.data(), b.data(), rows * cols).rel(), 2e-6) << "cols " << cols;
    // Without scale and shift: a plain LayerNorm.
    ops::layer_norm_modulate(c.fast, make_mat(x.data(), rows, cols), make_mat(a.data(), rows, cols),
                             {}, {}, 1e-6f);
    ops::layer_norm_modulate(c.ref, make_mat(x.data(), rows, cols), make_mat(b.data(), rows, cols),
                             {}, {}, 1e-6f);
    EXPECT_LE(compare(a.data(), b.data(), rows * cols).rel(), 2e-6) << "cols " << cols;
  }
}

TEST(Ops, GatedAddMatchesReference) {
  Ctx c;
  for (int64_t cols : {1, 15, 64, 131}) {
    const int64_t rows = 9;
    auto x = randn(rows * cols, 4), y = randn(rows * cols, 5), g = randn(3 * cols, 6);
    auto x2 = x;
    ops::ModRows gate{g.data(), cols, 3};
    ops::gated_add(c.fast, make_mat(x.data(), rows, cols), make_mat(y.data(), rows, cols), gate);
    ops::gated_add(c.ref, make_mat(x2.data(), rows, cols), make_mat(y.data(), rows, cols), gate);
    EXPECT_LE(compare(x.data(), x2.data(), rows * cols).rel(), 1e-6);
  }
}

TEST(Ops, RmsNormRopeMatchesReference) {
  Ctx c;
  for (int64_t hd : {2, 6, 16, 18, 32, 128}) {
    const int64_t heads = 3, rows = 11, seq = 5;
    auto x = randn(rows * heads * hd, 7, 2.0f);
    auto w = randn(hd, 8, 0.3f);
    for (float& v : w) v += 1.0f;
    auto cs = randn(seq * hd, 9), sn = randn(seq * hd, 10);
    for (bool half : {false, true}) {
      auto a = x, b = x;
      ops::RopeRows rope{cs.data(), sn.data(), seq, half};
      ops::rms_norm_rope(c.fast, make_mat(a.data(), rows, heads * hd), hd, w.data(), 1e-6f, rope);
      ops::rms_norm_rope(c.ref, make_mat(b.data(), rows, heads * hd), hd, w.data(), 1e-6f, rope);
      EXPECT_LE(compare(a.data(), b.data(), rows * heads * hd).rel(), 2e-6)
          << "hd " << hd << " half " << half;
    }
  }
}

TEST(Ops, RopeHalfPairsDimsIAndIPlusHalf) {
  // One head of 4, weight 1, a unit-RMS input: rotate_half pairs (0, 2) and (1, 3).
  Ctx c;
  std::vector<float> x = {1, 1, 1, 1};
  const float cs[4] = {0.5f, 0.25f, 0.5f, 0.25f}, sn[4] = {0.1f, 0.2f, 0.3f, 0.4f};
  for (const ExecContext* ctx : {&c.fast, &c.ref}) {
    auto v = x;
    ops::rms_norm_rope(*ctx, make_mat(v.data(), 1, 4), 4, nullptr, 0.0f, {cs, sn, 1, true});
    EXPECT_FLOAT_EQ(v[0], 1 * 0.5f - 1 * 0.1f);
    EXPECT_FLOAT_EQ(v[1], 1 * 0.25f - 1 * 0.2f);
    EXPECT_FLOAT_EQ(v[2], 1 * 0.5f + 1 * 0.3f);
    EXPECT_FLOAT_EQ(v[3], 1 * 0.25f + 1 * 0.4f);
  }
}

TEST(Ops, SwigluAndSiluMatchReference) {
  Ctx c;
  for (int64_t f : {1, 17, 48, 100}) {
    const int64_t rows = 5;
    auto in = randn(rows * 2 * f, 11, 4.0f);
    std::vector<float> a(rows * f), b(rows * f);
    ops::swiglu(c.fast, make_mat(in.data(), rows, 2 * f), make_mat(a.data(), rows, f));
    ops::swiglu(c.ref, make_mat(in.data(), rows, 2 * f), make_mat(b.data(), rows, f));
    EXPECT_LE(compare(a.data(), b.data(), rows * f).rel(), 2e-6);
    ops::silu(c.fast, in.data(), a.data(), rows * f);
    ops::silu(c.ref, in.data(), b.data(), rows * f);
    EXPECT_LE(compare(a.data(), b.data(), rows * f).rel(), 2e-6);
  }
}

TEST(Ops, GeluTanhMatchesReference) {
  Ctx c;
  for (int64_t n : {1, 9, 64, 77}) {
    auto x = randn(3 * n, 21, 3.0f);
    auto a = x, b = x;
    ops::gelu_tanh(c.fast, make_mat(a.data(), 3, n));
    ops::gelu_tanh(c.ref, make_mat(b.data(), 3, n));
    EXPECT_LE(compare(a.data(), b.data(), 3 * n).rel(), 2e-6) << n;
  }
}

TEST(Ops, GeluErfMatchesReferenceAndKnownValues) {
  Ctx c;
  for (int64_t n : {1, 9, 64, 77}) {
    auto x = randn(3 * n, 25, 3.0f);
    auto a = x, b = x;
    ops::gelu_erf(c.fast, make_mat(a.data(), 3, n));
    ops::gelu_erf(c.ref, make_mat(b.data(), 3, n));
    EXPECT_TRUE(test::bit_equal(a.data(), b.data(), 3 * n)) << n;
  }
  // torch.nn.functional.gelu(torch.tensor([-3., -1., 0., 0.5, 2.])) in f32.
  std::vector<float> v = {-3.0f, -1.0f, 0.0f, 0.5f, 2.0f};
  const float want[] = {-0.0040498674f, -0.15865529f, 0.0f, 0.3457312f, 1.9545f};
  ops::gelu_erf(c.ref, make_mat(v.data(), 1, 5));
  for (int i = 0; i < 5; ++i) EXPECT_NEAR(v[i], want[i], 4e-7f) << i;  // torch: float erf
}

TEST(Ops, LinearBiasIsAddedToEveryRow) {
  Ctx c;
  const int64_t m = 37, n = 300, k = 20;
  auto w = randn(n * k, 22, 0.2f), x = randn(m * k, 23), bias = randn(n, 24);
  ops::Linear lin(Tensor::from_vector(w, {n, k}), DType::kF32, true);
  lin.set_bias(Tensor::from_vector(bias, {n}));
  std::vector<float> a(m * n), b(m * n);
  lin.forward(c.fast, make_mat(x.data(), m, k), make_mat(a.data(), m, n));
  lin.forward(c.ref, make_mat(x.data(), m, k), make_mat(b.data(), m, n));
  EXPECT_LE(compare(a.data(), b.data(), m * n).rel(), 1e-5);
}

TEST(Ops, Bf16RoundingIsExactlyRoundToNearestEven) {
  Ctx c;
  auto x = randn(1000, 12, 100.0f);
  x.push_back(1.00390625f);  // exactly halfway between two bf16 values: rounds to even
  x.push_back(-0.0f);
  const int64_t n = static_cast<int64_t>(x.size());
  std::vector<uint16_t> a(n), b(n);
  ops::to_bf16(c.fast, make_mat(x.data(), 1, n), a.data());
  ops::to_bf16(c.ref, make_mat(x.data(), 1, n), b.data());
  EXPECT_EQ(a, b);
  EXPECT_EQ(a[1000], 0x3f80);
  auto r = x;
  ops::round_bf16(c.fast, make_mat(r.data(), 1, n));
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(r[i], bf16_to_f32(b[i]));
}

TEST(Ops, F16ConversionRoundTrips) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = f16_to_f32(static_cast<uint16_t>(h));
    if (std::isnan(f)) continue;
    ASSERT_EQ(f32_to_f16(f), h) << std::hex << h;
  }
}

// Linear: oneDNN tiles against the double-accumulating reference, f32 and bf16.
TEST(Ops, LinearMatchesReference) {
  Ctx c;
  struct Case {
    int64_t m, n, k;
  };
  for (Case s : {Case{1, 1, 1}, Case{3, 5, 7}, Case{130, 300, 33}, Case{257, 513, 96},
                 Case{64, 1024, 512}}) {
    for (DType dt : {DType::kF32, DType::kBF16}) {
      auto w = randn(s.n * s.k, 13, 0.1f), x = randn(s.m * s.k, 14);
      ops::Linear lin(Tensor::from_vector(w, {s.n, s.k}), dt, /*keep_plain=*/true);
      std::vector<float> a(s.m * s.n), b(s.m * s.n);
      lin.forward(c.fast, make_mat(x.data(), s.m, s.k), make_mat(a.data(), s.m, s.n));
      lin.forward(c.ref, make_mat(x.data(), s.m, s.k), make_mat(b.data(), s.m, s.n));
      EXPECT_LE(compare(a.data(), b.data(), s.m * s.n).rel(), 1e-5)
          << s.m << "x" << s.n << "x" << s.k << " " << dtype_name(dt);
    }
  }
}

TEST(Ops, LinearStridedViewsAndRowIndependence) {
  Ctx c;
  const int64_t m = 300, n = 260, k = 70;
  auto w = randn(n * k, 15, 0.1f), x = randn(m * (k + 5), 16);
  ops::Linear lin(Tensor::from_vector(w, {n, k}), DType::kF32);
  // Strided input (5 spare columns) and output written into a wider buffer.
  std::vector<float> y(m * (n + 3), -1.0f);
  Mat xv{x.data(), m, k, k + 5}, yv{y.data(), m, n, n + 3};
  lin.forward(c.fast, xv, yv);
  // Rows 131..170 computed alone give bit-identical rows: a row's result does not depend on
  // which other rows share the call.
  std::vector<float> part(40 * n);
  lin.forward(c.fast, xv.rows_slice(131, 40), make_mat(part.data(), 40, n));
  for (int64_t r = 0; r < 40; ++r) {
    ASSERT_TRUE(test::bit_equal(part.data() + r * n, yv.row(131 + r), n)) << "row " << r;
  }
  EXPECT_EQ(y[n], -1.0f);  // the spare columns are untouched
}

void expect_same_on_one_and_two_threads(const ops::Linear& lin, std::vector<float>& x, int64_t m,
                                        int64_t n, int64_t k) {
  Ctx c;
  std::vector<float> a(m * n), b(m * n);
  set_num_threads(1);
  lin.forward(c.fast, make_mat(x.data(), m, k), make_mat(a.data(), m, n));
  set_num_threads(2);
  lin.forward(c.fast, make_mat(x.data(), m, k), make_mat(b.data(), m, n));
  set_num_threads(0);
  EXPECT_TRUE(test::bit_equal(a.data(), b.data(), m * n)) << dtype_name(lin.compute_dtype());
}

TEST(Ops, LinearIsBitIdenticalForOneAndTwoThreads) {
  const int64_t m = 517, n = 700, k = 300;
  auto w = randn(n * k, 17, 0.1f), x = randn(m * k, 18);
  for (DType dt : {DType::kF32, DType::kBF16}) {
    expect_same_on_one_and_two_threads(ops::Linear(Tensor::from_vector(w, {n, k}), dt), x, m, n, k);
  }
}

// Narrow weights: a weight tensor of type t holding the values of w (rounded to t).
Tensor narrow_weights(const std::vector<float>& w, int64_t n, int64_t k, DType t) {
  Tensor out = Tensor::empty({n, k}, t);
  for (int64_t i = 0; i < n * k; ++i) {
    out.u16()[i] = t == DType::kBF16 ? f32_to_bf16(w[i]) : f32_to_f16(w[i]);
  }
  return out;
}

// The narrow-weight GEMM against its scalar mirror (same summation order): bit for bit on every
// edge (partial micro-tiles, partial slivers, K not a multiple of the K block, strided A and C).
TEST(Ops, NarrowGemmMatchesItsReferenceBitForBit) {
  struct Case {
    int64_t m, k, n0, n1;
  };
  for (Case s : {Case{1, 1, 0, 1}, Case{5, 7, 3, 20}, Case{6, 256, 0, 16}, Case{7, 300, 1, 50},
                 Case{150, 520, 5, 77}, Case{13, 1000, 0, 130}}) {
    const int64_t n = s.n1 + 2, lda = s.k + 3, ldc = n + 4;
    auto w = randn(n * s.k, 31, 0.1f), a = randn(s.m * lda, 32);
    const Tensor wt = narrow_weights(w, n, s.k, DType::kBF16);
    struct Src {
      const Tensor* w;
      int64_t k;
    } src{&wt, s.k};
    ops::RowSource rs{
        [](const void* self, int64_t j0, int64_t count, int64_t k0, int64_t kc, float* out) {
          const auto* p = static_cast<const Src*>(self);
          for (int64_t j = 0; j < count; ++j) {
            for (int64_t i = 0; i < kc; ++i) {
              out[j * kc + i] = bf16_to_f32(p->w->u16()[(j0 + j) * p->k + k0 + i]);
            }
          }
        },
        &src};
    std::vector<float> fast(s.m * ldc, -7.0f), ref(s.m * ldc, -7.0f);
    ops::gemm_rows_source(a.data(), lda, s.m, s.k, rs, s.n0, s.n1, fast.data(), ldc);
    ops::gemm_rows_source_reference(a.data(), lda, s.m, s.k, rs, s.n0, s.n1, ref.data(), ldc);
    EXPECT_TRUE(test::bit_equal(fast.data(), ref.data(), s.m * ldc))
        << s.m << "x" << s.k << " [" << s.n0 << ", " << s.n1 << ")";
    EXPECT_EQ(fast[0 * ldc + s.n1], -7.0f);  // columns outside [n0, n1) untouched
  }
}

// Narrow weights kept as stored multiply the same values as the f32 packing: the two paths agree
// to f32 rounding, for bf16 and f16 weights, f32 and bf16 compute, one tensor or stacked parts.
TEST(Ops, NarrowWeightsMatchThePackedPath) {
  Ctx c;
  const int64_t m = 37, k = 300, n = 90;
  auto w = randn(n * k, 33, 0.1f), x = randn(m * k, 34);
  for (DType t : {DType::kBF16, DType::kF16}) {
    const Tensor wt = narrow_weights(w, n, k, t);
    for (DType compute : {DType::kF32, DType::kBF16}) {
      if (compute == DType::kBF16 && t != DType::kBF16) continue;
      ops::set_compact_weights(false);
      ops::Linear packed(wt, compute);
      ops::set_compact_weights(true);
      ops::Linear narrow(wt, compute, /*keep_plain=*/true);
      if (compute == DType::kBF16 && ops::native_bf16_gemm()) {
        // A CPU with bf16 instructions multiplies bf16 in oneDNN: packed bf16, padded to its
        // blocks (n = 90 is no multiple of them).
        EXPECT_GE(narrow.packed_bytes(), n * k * 2);
      } else {
        EXPECT_EQ(narrow.packed_bytes(), n * k * 2);
      }
      std::vector<float> a(m * n), b(m * n), r(m * n);
      packed.forward(c.fast, make_mat(x.data(), m, k), make_mat(a.data(), m, n));
      narrow.forward(c.fast, make_mat(x.data(), m, k), make_mat(b.data(), m, n));
      narrow.forward(c.ref, make_mat(x.data(), m, k), make_mat(r.data(), m, n));
      EXPECT_LE(compare(b.data(), a.data(), m * n).rel(), 1e-6) << dtype_name(t);
      EXPECT_LE(compare(b.data(), r.data(), m * n).rel(), 1e-6) << dtype_name(t);
    }
    // Stacked parts and a row slice read the right rows.
    const Tensor top = narrow_weights(std::vector<float>(w.begin(), w.begin() + 40 * k), 40, k, t);
    const Tensor bottom =
        narrow_weights(std::vector<float>(w.begin() + 40 * k, w.end()), n - 40, k, t);
    ops::Linear whole(wt, DType::kF32);
    ops::Linear stacked = ops::Linear::stacked({top, bottom}, DType::kF32, false);
    ops::Linear slice = ops::Linear::rows_of(wt, 30, 20, DType::kF32, false);
    std::vector<float> a(m * n), b(m * n), s(m * 20);
    whole.forward(c.fast, make_mat(x.data(), m, k), make_mat(a.data(), m, n));
    stacked.forward(c.fast, make_mat(x.data(), m, k), make_mat(b.data(), m, n));
    slice.forward(c.fast, make_mat(x.data(), m, k), make_mat(s.data(), m, 20));
    EXPECT_TRUE(test::bit_equal(a.data(), b.data(), m * n));
    for (int64_t r = 0; r < m; ++r) {
      EXPECT_TRUE(test::bit_equal(s.data() + r * 20, a.data() + r * n + 30, 20)) << r;
    }
  }
}

TEST(Ops, NarrowWeightsAreBitIdenticalForOneAndTwoThreads) {
  const int64_t m = 2100, n = 300, k = 270;  // from 2,048 rows the rows split too
  auto w = randn(n * k, 35, 0.1f), x = randn(m * k, 36);
  expect_same_on_one_and_two_threads(
      ops::Linear(narrow_weights(w, n, k, DType::kBF16), DType::kF32), x, m, n, k);
}

// Attention with several sources, causal runs and key masks.
void run_attention_case(int64_t batch, int64_t heads, int64_t hd, int64_t sq,
                        std::vector<int64_t> lens, bool causal_last, bool masked, DType kv_type) {
  Ctx c;
  const int64_t width = heads * hd;
  auto q = randn(batch * sq * width, 20, 1.5f);
  std::vector<std::vector<float>> kf, vf;
  std::vector<std::vector<uint16_t>> kb, vb;
  std::vector<std::vector<uint8_t>> valid;
  std::vector<ops::KVSource> srcs;
  for (size_t i = 0; i < lens.size(); ++i) {
    kf.push_back(randn(batch * lens[i] * width, 30 + i, 1.5f));
    vf.push_back(randn(batch * lens[i] * width, 40 + i));
    valid.emplace_back(batch * lens[i], 1);
    for (size_t j = 0; j < valid.back().size(); j += 3) valid.back()[j] = masked ? 0 : 1;
  }
  for (size_t i = 0; i < lens.size(); ++i) {
    ops::KVSource s;
    s.len = lens[i];
    s.k_stride = s.v_stride = width;
    if (kv_type == DType::kBF16) {
      kb.emplace_back(kf[i].size());
      vb.emplace_back(vf[i].size());
      for (size_t j = 0; j < kf[i].size(); ++j) {
        kb.back()[j] = f32_to_bf16(kf[i][j]);
        vb.back()[j] = f32_to_bf16(vf[i][j]);
      }
      s.k = kb.back().data();
      s.v = vb.back().data();
      s.dtype = DType::kBF16;
    } else {
      s.k = kf[i].data();
      s.v = vf[i].data();
    }
    if (causal_last && i + 1 == lens.size()) s.causal = true;
    if (masked && i == 0) s.valid = valid[i].data();
    srcs.push_back(s);
  }
  std::vector<float> a(batch * sq * width), b(batch * sq * width);
  ops::AttnShape shape{batch, heads, hd, sq};
  ops::attention(c.fast, shape, make_mat(q.data(), batch * sq, width), srcs,
                 make_mat(a.data(), batch * sq, width));
  ops::attention(c.ref, shape, make_mat(q.data(), batch * sq, width), srcs,
                 make_mat(b.data(), batch * sq, width));
  EXPECT_LE(compare(a.data(), b.data(), batch * sq * width).rel(), 2e-6)
      << "b" << batch << " h" << heads << " hd" << hd << " sq" << sq;
}

TEST(Ops, AttentionMatchesReference) {
  run_attention_case(1, 2, 16, 5, {7}, false, false, DType::kF32);
  run_attention_case(2, 3, 32, 70, {13, 64, 65}, false, false, DType::kF32);
  run_attention_case(1, 1, 128, 130, {200}, false, false, DType::kF32);
  run_attention_case(2, 2, 64, 77, {30, 77}, true, false, DType::kF32);    // causal run
  run_attention_case(2, 2, 16, 33, {50, 33}, true, true, DType::kF32);     // + key mask
  run_attention_case(1, 2, 32, 40, {20, 45}, false, false, DType::kBF16);  // bf16 memory
}

TEST(Ops, AttentionSplicedSourceEqualsContiguousKeys) {
  // Keys given as [A, B, C] sources give bit-identical output whether B is a slice of one
  // buffer holding A|B|C or a separate buffer (what a cache splice does).
  Ctx c;
  const int64_t heads = 2, hd = 32, sq = 50, la = 20, lb = 67, lc = 50;
  const int64_t w = heads * hd, total = la + lb + lc;
  auto q = randn(sq * w, 50), k = randn(total * w, 51), v = randn(total * w, 52);
  std::vector<float> kb(k.begin() + la * w, k.begin() + (la + lb) * w);
  std::vector<float> vb(v.begin() + la * w, v.begin() + (la + lb) * w);
  ops::KVSource a = ops::KVSource::f32(make_mat(k.data(), la, w), make_mat(v.data(), la, w), la);
  ops::KVSource b1 = ops::KVSource::f32(make_mat(k.data() + la * w, lb, w),
                                        make_mat(v.data() + la * w, lb, w), lb);
  ops::KVSource b2 = ops::KVSource::f32(make_mat(kb.data(), lb, w), make_mat(vb.data(), lb, w), lb);
  ops::KVSource cc = ops::KVSource::f32(make_mat(k.data() + (la + lb) * w, lc, w),
                                        make_mat(v.data() + (la + lb) * w, lc, w), lc);
  std::vector<float> o1(sq * w), o2(sq * w), o3(sq * w);
  ops::AttnShape shape{1, heads, hd, sq};
  std::vector<ops::KVSource> s1{a, b1, cc}, s2{a, b2, cc};
  ops::attention(c.fast, shape, make_mat(q.data(), sq, w), s1, make_mat(o1.data(), sq, w));
  ops::attention(c.fast, shape, make_mat(q.data(), sq, w), s2, make_mat(o2.data(), sq, w));
  EXPECT_TRUE(test::bit_equal(o1.data(), o2.data(), sq * w));
  // And for 1 vs 2 threads.
  set_num_threads(1);
  ops::attention(c.fast, shape, make_mat(q.data(), sq, w), s1, make_mat(o3.data(), sq, w));
  set_num_threads(0);
  EXPECT_TRUE(test::bit_equal(o1.data(), o3.data(), sq * w));
}

TEST(Ops, GroupedQueryAttentionEqualsRepeatedKeyValueHeads) {
  // 6 query heads over 2 key/value heads: the same as the key/value heads repeated (repeat_kv:
  // heads 0-2 read kv head 0, heads 3-5 kv head 1), causal with a key mask, fast and reference.
  Ctx c;
  const int64_t batch = 2, heads = 6, kvh = 2, hd = 16, sq = 37, w = heads * hd, wk = kvh * hd;
  auto q = randn(batch * sq * w, 60), k = randn(batch * sq * wk, 61),
       v = randn(batch * sq * wk, 62);
  std::vector<float> kr(batch * sq * w), vr(batch * sq * w);
  for (int64_t r = 0; r < batch * sq; ++r) {
    for (int64_t h = 0; h < heads; ++h) {
      std::memcpy(&kr[r * w + h * hd], &k[r * wk + (h / 3) * hd], hd * sizeof(float));
      std::memcpy(&vr[r * w + h * hd], &v[r * wk + (h / 3) * hd], hd * sizeof(float));
    }
  }
  std::vector<uint8_t> valid(batch * sq, 1);
  for (int64_t j = 29; j < sq; ++j) valid[j] = 0;  // batch 0: right padding from 29
  auto src = [&](std::vector<float>& kk, std::vector<float>& vv, int64_t width) {
    ops::KVSource s = ops::KVSource::f32(make_mat(kk.data(), batch * sq, width),
                                         make_mat(vv.data(), batch * sq, width), sq);
    s.causal = true;
    s.valid = valid.data();
    return s;
  };
  std::vector<ops::KVSource> gqa{src(k, v, wk)}, full{src(kr, vr, w)};
  ops::AttnShape gshape{batch, heads, hd, sq};
  gshape.kv_heads = kvh;
  const ops::AttnShape fshape{batch, heads, hd, sq};
  std::vector<float> o1(batch * sq * w), o2(o1.size()), o3(o1.size()), o4(o1.size());
  const Mat qm = make_mat(q.data(), batch * sq, w);
  ops::attention(c.fast, gshape, qm, gqa, make_mat(o1.data(), batch * sq, w));
  ops::attention(c.fast, fshape, qm, full, make_mat(o2.data(), batch * sq, w));
  EXPECT_TRUE(test::bit_equal(o1.data(), o2.data(), batch * sq * w));
  ops::attention(c.ref, gshape, qm, gqa, make_mat(o3.data(), batch * sq, w));
  ops::attention(c.ref, fshape, qm, full, make_mat(o4.data(), batch * sq, w));
  EXPECT_TRUE(test::bit_equal(o3.data(), o4.data(), batch * sq * w));
  EXPECT_LE(compare(o1.data(), o3.data(), batch * sq * w).rel(), 2e-6);
  gshape.kv_heads = 4;  // 6 heads cannot share 4
  EXPECT_THROW(ops::attention(c.fast, gshape, qm, gqa, make_mat(o1.data(), batch * sq, w)), Error);
}

}  // namespace
}  // namespace flowkv
