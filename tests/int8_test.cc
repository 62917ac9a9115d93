// Int8 Linear (ops/int8_linear.h): quantization properties, every instruction set's kernel
// bit-identical to the scalar reference at odd shapes and strided views, thread-count
// independence, and the error against the f32 product bounded by the quantization step.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <vector>

#include "core/parallel.h"
#include "ops/int8_linear.h"
#include "test_util.h"

namespace flowkv {
namespace {

using test::randn;

constexpr ops::Int8Isa kIsas[] = {ops::Int8Isa::kScalar, ops::Int8Isa::kAvx2,
                                  ops::Int8Isa::kAvx512Vnni};

TEST(Int8, QuantizeBlockRoundsToNearestEvenAndKeepsTheAbsmax) {
  // absmax 127: the scale is exactly 1, and halves round to even.
  const std::vector<float> x = {127.0f, 0.5f, 1.5f, 2.5f, -0.5f, -2.5f, -3.5f, 126.6f, -127.0f};
  std::vector<int8_t> q(x.size());
  EXPECT_EQ(ops::quantize_block_int8(x.data(), x.size(), q.data()), 1.0f);
  EXPECT_EQ(q, (std::vector<int8_t>{127, 0, 2, 2, 0, -2, -4, 127, -127}));

  std::vector<float> zeros(9, 0.0f);
  EXPECT_EQ(ops::quantize_block_int8(zeros.data(), zeros.size(), q.data()), 0.0f);
  EXPECT_EQ(q, std::vector<int8_t>(9, 0));
}

TEST(Int8, QuantizeBlockErrorIsWithinHalfAStep) {
  const auto x = randn(1000, 1, 3.0f);
  std::vector<int8_t> q(x.size());
  const float s = ops::quantize_block_int8(x.data(), x.size(), q.data());
  float amax = 0;
  for (float v : x) amax = std::max(amax, std::fabs(v));
  EXPECT_EQ(s, amax / 127.0f);
  int at_limit = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    ASSERT_LE(std::abs(int{q[i]}), 127);
    // Half a step, plus the rounding of x / s (a few ulps of 127).
    ASSERT_LE(std::fabs(x[i] - q[i] * s), 0.5f * s * (1.0f + 1e-5f)) << i;
    at_limit += std::abs(int{q[i]}) == 127;
  }
  EXPECT_GE(at_limit, 1);  // the absmax element maps to +-127
}

TEST(Int8, WeightsHoldEachRowBlockQuantized) {
  // K = 600: blocks of 256, 256 and 88; K = 70: one block of 70.
  for (int64_t k : {600, 70, 256, 3}) {
    const int64_t n = 37;
    const auto w = randn(n * k, 2 + k);
    const ops::Int8Weights q = ops::quantize_weights_int8(w.data(), n, k);
    ASSERT_EQ(q.block, std::min<int64_t>(k, ops::kInt8Block));
    ASSERT_EQ(q.blocks, (k + q.block - 1) / q.block);
    std::vector<int8_t> expect(q.block);
    for (int64_t r = 0; r < n; ++r) {
      for (int64_t b = 0; b < q.blocks; ++b) {
        const int64_t len = std::min(q.block, k - b * q.block);
        const float s =
            ops::quantize_block_int8(w.data() + r * k + b * q.block, len, expect.data());
        ASSERT_EQ(q.scale(r, b), s) << "row " << r << " block " << b;
        for (int64_t i = 0; i < len; ++i) {
          ASSERT_EQ(q.value(r, b * q.block + i), expect[i]) << "row " << r << " col " << i;
        }
      }
    }
  }
}

struct Shape {
  int64_t m, k, n;
};

// y from one instruction set's kernel, x and y as strided views into wider buffers.
void expect_isa_matches_reference(ops::Int8Isa isa, Shape s) {
  const auto w = randn(s.n * s.k, 3 + s.k, 0.1f);
  auto x = randn(s.m * (s.k + 3), 4 + s.m);
  x[3] = 0.0f;  // some all-zero input (scale 0) and exact ties do not hurt either
  const ops::Int8Weights q = ops::quantize_weights_int8(w.data(), s.n, s.k);
  const Mat xv{x.data(), s.m, s.k, s.k + 3};
  std::vector<float> ref(s.m * (s.n + 5), -1.0f), got(s.m * (s.n + 5), -1.0f);
  const Mat rv{ref.data(), s.m, s.n, s.n + 5}, gv{got.data(), s.m, s.n, s.n + 5};
  ops::int8_linear_reference(xv, q, rv);
  Arena arena;
  ops::int8_linear_on(isa, ExecContext{&arena}, xv, q, gv);
  EXPECT_TRUE(test::bit_equal(ref.data(), got.data(), ref.size()))
      << ops::int8_isa_name(isa) << " M " << s.m << " K " << s.k << " N " << s.n;
  // Without an arena (owned scratch): the same bits.
  std::fill(got.begin(), got.end(), -1.0f);
  ops::int8_linear_on(isa, ExecContext{}, xv, q, gv);
  EXPECT_TRUE(test::bit_equal(ref.data(), got.data(), ref.size())) << ops::int8_isa_name(isa);
}

constexpr Shape kOddShapes[] = {
    {1, 1, 1},       {3, 70, 5},      {5, 256, 17}, {37, 600, 45},   {67, 1030, 33},
    {130, 513, 260}, {263, 257, 531}, {9, 3, 300},  {300, 1000, 16},
};

TEST(Int8, Avx2MatchesReferenceBitForBit) {
  if (!ops::int8_isa_supported(ops::Int8Isa::kAvx2)) GTEST_SKIP() << "no AVX2 here";
  for (Shape s : kOddShapes) expect_isa_matches_reference(ops::Int8Isa::kAvx2, s);
}

TEST(Int8, Avx512VnniMatchesReferenceBitForBit) {
  if (!ops::int8_isa_supported(ops::Int8Isa::kAvx512Vnni)) {
    // Asking for it anyway is an error, not a crash on an illegal instruction.
    std::vector<float> x(4, 1.0f), w(4, 1.0f), y(1);
    const ops::Int8Weights q = ops::quantize_weights_int8(w.data(), 1, 4);
    EXPECT_THROW(ops::int8_linear_on(ops::Int8Isa::kAvx512Vnni, ExecContext{},
                                     make_mat(x.data(), 1, 4), q, make_mat(y.data(), 1, 1)),
                 Error);
    GTEST_SKIP() << "no AVX-512 VNNI here";
  }
  for (Shape s : kOddShapes) expect_isa_matches_reference(ops::Int8Isa::kAvx512Vnni, s);
}

TEST(Int8, DispatchRunsTheBestKernelOrTheReference) {
  const Shape s{41, 300, 70};
  const auto w = randn(s.n * s.k, 5, 0.1f), x = randn(s.m * s.k, 6);
  const ops::Int8Weights q = ops::quantize_weights_int8(w.data(), s.n, s.k);
  std::vector<float> a(s.m * s.n), b(s.m * s.n);
  ops::int8_linear(ExecContext{nullptr, KernelPath::kFast},
                   make_mat(const_cast<float*>(x.data()), s.m, s.k), q,
                   make_mat(a.data(), s.m, s.n));
  ops::int8_linear(ExecContext{nullptr, KernelPath::kReference},
                   make_mat(const_cast<float*>(x.data()), s.m, s.k), q,
                   make_mat(b.data(), s.m, s.n));
  EXPECT_TRUE(test::bit_equal(a.data(), b.data(), a.size()))
      << ops::int8_isa_name(ops::int8_best_isa());
}

TEST(Int8, IsBitIdenticalForOneAndTwoThreads) {
  const Shape s{517, 700, 300};
  const auto w = randn(s.n * s.k, 7, 0.1f), x = randn(s.m * s.k, 8);
  const ops::Int8Weights q = ops::quantize_weights_int8(w.data(), s.n, s.k);
  Mat xv = make_mat(const_cast<float*>(x.data()), s.m, s.k);
  for (ops::Int8Isa isa : kIsas) {
    if (!ops::int8_isa_supported(isa)) continue;
    std::vector<float> a(s.m * s.n), b(s.m * s.n);
    set_num_threads(1);
    ops::int8_linear_on(isa, ExecContext{}, xv, q, make_mat(a.data(), s.m, s.n));
    set_num_threads(2);
    ops::int8_linear_on(isa, ExecContext{}, xv, q, make_mat(b.data(), s.m, s.n));
    set_num_threads(0);
    EXPECT_TRUE(test::bit_equal(a.data(), b.data(), a.size())) << ops::int8_isa_name(isa);
  }
}

// Against the exact (double) product on Gaussian data at K = 3,072. Each quantized value is off
// by at most half its block's step, about uniformly, so the error of y = sum_k x_k w_k has
// variance sum_k (E[ex^2] w_k^2 + x_k^2 E[ew^2]) with E[e^2] = s^2 / 12 per block: relative to
// the product's own variance, NMSE ~= mean(sx^2) / (12 mean(x^2)) + mean(sw^2) / (12 mean(w^2)).
// That prediction, from the scales the quantizer actually chose, is the yardstick.
TEST(Int8, ErrorAgainstTheF32ProductMatchesTheQuantizationStep) {
  const Shape s{64, 3072, 256};
  const auto w = randn(s.n * s.k, 9, 0.05f), x = randn(s.m * s.k, 10);
  const ops::Int8Weights q = ops::quantize_weights_int8(w.data(), s.n, s.k);
  std::vector<float> y(s.m * s.n), exact(s.m * s.n);
  ops::int8_linear(ExecContext{}, make_mat(const_cast<float*>(x.data()), s.m, s.k), q,
                   make_mat(y.data(), s.m, s.n));
  for (int64_t i = 0; i < s.m; ++i) {
    for (int64_t j = 0; j < s.n; ++j) {
      double acc = 0;
      for (int64_t k = 0; k < s.k; ++k) acc += double(x[i * s.k + k]) * w[j * s.k + k];
      exact[i * s.n + j] = static_cast<float>(acc);
    }
  }
  const double nmse = test::compare(y.data(), exact.data(), y.size()).nmse();

  auto mean_sq = [](const std::vector<float>& v) {
    double a = 0;
    for (float e : v) a += double(e) * e;
    return a / v.size();
  };
  double sw2 = 0;
  for (int64_t r = 0; r < s.n; ++r) {
    for (int64_t b = 0; b < q.blocks; ++b) sw2 += double(q.scale(r, b)) * q.scale(r, b);
  }
  sw2 /= s.n * q.blocks;
  double sx2 = 0;
  std::vector<int8_t> tmp(q.block);
  for (int64_t r = 0; r < s.m; ++r) {
    for (int64_t b = 0; b < q.blocks; ++b) {
      const float sx =
          ops::quantize_block_int8(x.data() + r * s.k + b * q.block, q.block, tmp.data());
      sx2 += double(sx) * sx;
    }
  }
  sx2 /= s.m * q.blocks;
  const double predicted = sx2 / (12 * mean_sq(x)) + sw2 / (12 * mean_sq(w));
  std::printf("int8 NMSE at K=%ld: %.3e (predicted from the quantization steps %.3e)\n", s.k, nmse,
              predicted);
  RecordProperty("nmse", std::to_string(nmse));
  // 16,384 outputs: the measured NMSE concentrates within a few percent of its expectation.
  EXPECT_LT(nmse, 1.5 * predicted);
  EXPECT_GT(nmse, predicted / 1.5);
}

}  // namespace
}  // namespace flowkv
