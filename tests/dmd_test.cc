// TaylorSeer's DMD forecaster (taylorseer:forecaster=dmd, cache/dmd.h): the small dense kernels;
// exactness on a trajectory that is linear-dynamical (where a Taylor series is not); cache-dit's
// own DMD forecasts (tests/golden/dmd, python/ref/dump_dmd.py) at the forecaster and through the
// policy on TaylorSeer's schedule; the exact Klein reference cache composed with it; its knobs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <complex>
#include <string>
#include <vector>

#include "cache/dmd.h"
#include "cache/policy.h"
#include "fixtures.h"
#include "flowkv/error.h"
#include "golden_util.h"
#include "io/json.h"
#include "test_util.h"

namespace flowkv {
namespace {

using test::klein_run;
using test::same_bits;

using cache::DmdOptions;
using cd = std::complex<double>;

// max |a - b| / max |b|
double rel_err(const std::vector<double>& a, const std::vector<double>& b) {
  double diff = 0, scale = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    diff = std::max(diff, std::abs(a[i] - b[i]));
    scale = std::max(scale, std::abs(b[i]));
  }
  return diff / scale;
}

std::vector<double> randn_d(int64_t n, uint64_t seed) {
  const std::vector<float> f = test::randn(n, seed);
  return std::vector<double>(f.begin(), f.end());
}

// ---------------------------------------------------------------- kernels

TEST(DmdKernels, JacobiSvdReconstructsAndOrders) {
  const int rows = 7, cols = 5;
  const std::vector<double> a = randn_d(rows * cols, 3);
  std::vector<double> s, u, v;
  cache::dmd_detail::jacobi_svd(a, rows, cols, s, u, v);
  for (int k = 1; k < cols; ++k) EXPECT_GE(s[k - 1], s[k]);
  for (int i = 0; i < rows; ++i) {
    for (int j = 0; j < cols; ++j) {
      double sum = 0;  // (U S V^T)[i][j]
      for (int k = 0; k < cols; ++k) sum += u[i * cols + k] * s[k] * v[j * cols + k];
      EXPECT_NEAR(sum, a[i * cols + j], 1e-13);
    }
  }
}

TEST(DmdKernels, GramFactorAndDotProducts) {
  // More values than the dot product's unrolled step, and a remainder; a rank-deficient set (the
  // fourth column is the sum of the first two) whose Gram matrix has a zero eigenvalue.
  const int64_t d = 2501;
  const int m = 4;
  std::vector<std::vector<double>> cols;
  for (int j = 0; j < 3; ++j) cols.push_back(randn_d(d, 10 + j));
  cols.push_back(cols[0]);
  for (int64_t i = 0; i < d; ++i) cols[3][i] += cols[1][i];
  std::vector<double> gram(m * m);
  for (int p = 0; p < m; ++p) {
    for (int q = 0; q < m; ++q) {
      double plain = 0;
      for (int64_t i = 0; i < d; ++i) plain += cols[p][i] * cols[q][i];
      gram[p * m + q] = cache::dmd_dot(cols[p].data(), cols[q].data(), d);
      EXPECT_NEAR(gram[p * m + q], plain, 1e-12 * d);
    }
  }
  const std::vector<double> f = cache::dmd_detail::gram_factor(gram, m);
  for (int p = 0; p < m; ++p) {
    for (int q = 0; q < m; ++q) {
      double ftf = 0;
      for (int i = 0; i < m; ++i) ftf += f[i * m + p] * f[i * m + q];
      EXPECT_NEAR(ftf, gram[p * m + q], 1e-12 * d);
    }
  }
}

TEST(DmdKernels, EigenOfARealMatrixWithAComplexPair) {
  // Similar (by a fixed matrix) to diag-blocks [[0.9cos, -0.9sin], [0.9sin, 0.9cos]], 1.02, -0.5.
  const int n = 4;
  const double c = 0.9 * std::cos(0.4), s = 0.9 * std::sin(0.4);
  const std::vector<double> d = {c, -s, 0, 0, s, c, 0, 0, 0, 0, 1.02, 0, 0, 0, 0, -0.5};
  const std::vector<double> p = {1,   0.2,  -0.3, 0.5, 0.1,  1,   0.4, -0.2,
                                 0.3, -0.1, 1,    0.2, -0.4, 0.2, 0.1, 1};
  std::vector<double> pinv;  // by the 4x4 Gauss-Jordan elimination below
  {
    std::vector<double> aug(n * 2 * n, 0.0);
    for (int i = 0; i < n; ++i) {
      for (int j = 0; j < n; ++j) aug[i * 2 * n + j] = p[i * n + j];
      aug[i * 2 * n + n + i] = 1;
    }
    for (int k = 0; k < n; ++k) {
      const double piv = aug[k * 2 * n + k];
      for (int j = 0; j < 2 * n; ++j) aug[k * 2 * n + j] /= piv;
      for (int i = 0; i < n; ++i) {
        if (i == k) continue;
        const double f = aug[i * 2 * n + k];
        for (int j = 0; j < 2 * n; ++j) aug[i * 2 * n + j] -= f * aug[k * 2 * n + j];
      }
    }
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < n; ++j) pinv.push_back(aug[i * 2 * n + n + j]);
  }
  std::vector<double> a(n * n, 0.0);  // P D P^-1
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < n; ++j)
      for (int k = 0; k < n; ++k)
        for (int l = 0; l < n; ++l) a[i * n + j] += p[i * n + k] * d[k * n + l] * pinv[l * n + j];
  std::vector<cd> lambda, w;
  ASSERT_TRUE(cache::dmd_detail::eigen(a, n, lambda, w));
  std::vector<cd> want = {cd(c, s), cd(c, -s), 1.02, -0.5};
  for (const cd& x : want) {
    double best = 1;
    for (const cd& y : lambda) best = std::min(best, std::abs(x - y));
    EXPECT_LT(best, 1e-12) << x;
  }
  for (int k = 0; k < n; ++k) {  // A w = lambda w, |w| = 1
    double norm = 0;
    for (int i = 0; i < n; ++i) {
      cd sum = 0;
      for (int j = 0; j < n; ++j) sum += a[i * n + j] * w[j * n + k];
      EXPECT_LT(std::abs(sum - lambda[k] * w[i * n + k]), 1e-12);
      norm += std::norm(w[i * n + k]);
    }
    EXPECT_NEAR(norm, 1.0, 1e-12);
  }
}

// ---------------------------------------------------------------- exactness

// x_t = B D^t z0 in 64 dimensions, D with a damped rotation, a growing mode (no clipping of
// |lambda| > 1) and a negative real mode: the trajectory spans 4 dimensions.
std::vector<std::vector<double>> linear_trajectory(int steps, double negative) {
  const int d = 64;
  const std::vector<double> b = randn_d(d * 4, 21);
  const double c = 0.95 * std::cos(0.4), s = 0.95 * std::sin(0.4);
  std::vector<double> z = {1.0, 0.5, -0.8, 0.7};
  std::vector<std::vector<double>> out;
  for (int t = 0; t < steps; ++t) {
    std::vector<double> x(d, 0.0);
    for (int i = 0; i < d; ++i)
      for (int k = 0; k < 4; ++k) x[i] += b[i * 4 + k] * z[k];
    out.push_back(x);
    z = {c * z[0] - s * z[1], s * z[0] + c * z[1], 1.02 * z[2], negative * z[3]};
  }
  return out;
}

TEST(DmdForecast, ExactOnALinearDynamicalTrajectoryWhereTaylorIsNot) {
  const auto traj = linear_trajectory(12, -0.7);
  const int m = 6;  // snapshots 0..5
  std::vector<const double*> window;
  for (int t = 0; t < m; ++t) window.push_back(traj[t].data());
  // cache-dit's ridge (1e-8, added to singular values of order 1 here) biases the eigenvalues
  // by about 1e-8 relative; without it the fit is exact to rounding.
  const auto fit = cache::dmd_fit(window, 64, DmdOptions{.ridge = 0});
  ASSERT_TRUE(fit.has_value());
  EXPECT_EQ(fit->rank(), 4);  // the fifth singular value is rounding: truncated
  for (int k : {1, 2, 3, 6}) {
    std::vector<double> pred(64);
    cache::dmd_combine(window, 64, fit->coefficients(k), pred.data());
    EXPECT_LT(rel_err(pred, traj[m - 1 + k]), 1e-10) << "k=" << k;
    // TaylorSeer's series from the same outputs (orders 1 and 2, unit spacing) misses by far.
    std::vector<double> t1(64), t2(64);
    for (int i = 0; i < 64; ++i) {
      const double x0 = traj[m - 1][i], x1 = traj[m - 2][i], x2 = traj[m - 3][i];
      const double d1 = x0 - x1, d2 = x0 - 2 * x1 + x2;
      t1[i] = x0 + k * d1;
      t2[i] = x0 + k * d1 + k * k / 2.0 * d2;
    }
    EXPECT_GT(rel_err(t1, traj[m - 1 + k]), 1e-2) << "k=" << k;
    EXPECT_GT(rel_err(t2, traj[m - 1 + k]), 1e-2) << "k=" << k;
  }
  // With the default ridge: within its bias.
  const auto ridged = cache::dmd_fit(window, 64, DmdOptions{});
  ASSERT_TRUE(ridged.has_value());
  std::vector<double> pred(64);
  cache::dmd_combine(window, 64, ridged->coefficients(3), pred.data());
  EXPECT_LT(rel_err(pred, traj[m - 1 + 3]), 1e-6);
  // A fixed rank equal to the trajectory's is the same fit.
  const auto fixed = cache::dmd_fit(window, 64, DmdOptions{.rank = 4, .ridge = 0});
  ASSERT_TRUE(fixed.has_value());
  std::vector<double> a(64), b(64);
  cache::dmd_combine(window, 64, fit->coefficients(2.5), a.data());
  cache::dmd_combine(window, 64, fixed->coefficients(2.5), b.data());
  EXPECT_LT(rel_err(a, b), 1e-12);
}

TEST(DmdForecast, DegenerateWindowsAreRefused) {
  const std::vector<double> zero(16, 0.0);
  EXPECT_FALSE(cache::dmd_fit(std::vector<const double*>(5, zero.data()), 16, DmdOptions{}));
}

// ---------------------------------------------------------------- a TaylorSeer policy driven

// One block whose attention outputs, call by call, are given: a "target" stream of `batch`
// items of seq x cols. Returns the attention output each call saw (computed or forecast).
struct Driver {
  int64_t batch = 1, seq = 8, cols = 8;
  std::vector<std::vector<float>> run(const std::string& spec,
                                      const std::vector<std::vector<float>>& outputs,
                                      std::string* report = nullptr, int branches = 1) const {
    cache::Topology topo;
    topo.model = "test";
    topo.blocks.push_back({"transformer_blocks.0", "double"});
    cache::Composite p(cache::make_policies({spec}, topo));
    const int64_t n = batch * seq * cols;
    std::vector<float> x(static_cast<size_t>(n), 0.0f), y(static_cast<size_t>(n));
    auto streams = [&](std::vector<float>& v) {
      cache::Streams s;
      s.batch = batch;
      s.s.push_back({"target", {v.data(), batch * seq, cols, cols}, seq, 0});
      return s;
    };
    std::vector<std::vector<float>> seen;
    for (size_t call = 0; call < outputs.size(); ++call) {
      for (int branch = 0; branch < branches; ++branch) {
        cache::StepContext ctx;
        ctx.step = static_cast<int>(call), ctx.num_steps = static_cast<int>(outputs.size());
        ctx.branch = branch, ctx.cfg = branches > 1;
        p.set_step(ctx);
        cache::Streams in = streams(x), out = streams(y);
        p.begin(in, in.s[0].x);
        EXPECT_EQ(p.before_block(0, in), cache::BlockAction::kRun);
        if (p.reuse(0, cache::Sublayer::kAttention)) {
          p.fetch(0, cache::Sublayer::kAttention, out);
        } else {
          y = outputs[call];
          if (branch == 1) {  // the other branch sees other outputs
            for (float& v : y) v = -3.0f * v + 1.0f;
          }
          p.store(0, cache::Sublayer::kAttention, out);
        }
        if (branch == 0) seen.push_back(y);
        if (!p.reuse(0, cache::Sublayer::kMlp)) p.store(0, cache::Sublayer::kMlp, out);
        p.after_block(0, in);
        p.end(in);
      }
    }
    if (report) *report = p.report();
    return seen;
  }
};

TEST(DmdPolicy, ForecastsALinearTrajectoryAtFloatPrecision) {
  // Positive real parts only: the forecaster advances by fractional powers of the operator of
  // two calls, whose principal square root is then the one-call operator.
  const auto traj = linear_trajectory(16, 0.7);
  std::vector<std::vector<float>> outputs;
  for (const auto& x : traj) outputs.emplace_back(x.begin(), x.end());
  const Driver drv;
  std::string report;
  const auto dmd =
      drv.run("taylorseer:interval=2,before=1,factors=f32,forecaster=dmd", outputs, &report);
  const auto taylor = drv.run("taylorseer:interval=2,before=1,factors=f32", outputs);
  // Computed at even calls: DMD from call 7 on (4 evenly spaced outputs 0, 2, 4, 6), which
  // resolves at most 3 modes; the trajectory's 4 are resolved from 5 outputs (call 9) on.
  EXPECT_LT(rel_err(std::vector<double>(dmd[7].begin(), dmd[7].end()), traj[7]), 0.1);
  for (int call : {9, 11, 13, 15}) {
    const std::vector<double> got(dmd[call].begin(), dmd[call].end());
    const std::vector<double> tay(taylor[call].begin(), taylor[call].end());
    EXPECT_LT(rel_err(got, traj[call]), 2e-5) << call;
    EXPECT_GT(rel_err(tay, traj[call]), 1e-3) << call;
  }
  // Before that the Taylor series forecasts, identically.
  for (int call : {1, 3, 5}) EXPECT_EQ(dmd[call], taylor[call]) << call;
  EXPECT_NE(report.find("5 stream forecasts by DMD (5 fits), 3 by the Taylor series"),
            std::string::npos)
      << report;
}

TEST(DmdPolicy, BranchesKeepTheirOwnWindows) {
  const auto traj = linear_trajectory(12, 0.7);
  std::vector<std::vector<float>> outputs;
  for (const auto& x : traj) outputs.emplace_back(x.begin(), x.end());
  const Driver drv;
  const std::string spec = "taylorseer:interval=2,before=1,forecaster=dmd";
  EXPECT_EQ(drv.run(spec, outputs), drv.run(spec, outputs, nullptr, 2));
}

TEST(DmdPolicy, ADegenerateFitReusesTheNewestOutput) {
  std::vector<std::vector<float>> outputs(10, std::vector<float>(64, 0.0f));
  const Driver drv;
  std::string report;
  const auto seen = drv.run("taylorseer:interval=2,before=1,forecaster=dmd", outputs, &report);
  EXPECT_EQ(seen[9], outputs[8]);
  EXPECT_NE(report.find("2 reused the newest output"), std::string::npos) << report;
}

// ---------------------------------------------------------------- cache-dit's forecasts

std::vector<float> floats(const Json& j) {
  std::vector<float> out;
  for (const Json& v : j) out.push_back(static_cast<float>(v.get<double>()));
  return out;
}

TEST(DmdGolden, WindowsMatchCacheDit) {
  const Json doc = read_json_file(test::golden("dmd/cases.json"));
  EXPECT_EQ(doc["versions"]["cache-dit"], "1.5.3");
  int compared = 0;
  for (const Json& c : doc["cases"]) {
    const std::string name = c["name"];
    const int64_t batch = c["batch"], d = c["features"];
    std::vector<std::vector<double>> steps;
    for (const Json& s : c["steps"]) {
      const std::vector<float> f = floats(s);  // float32 values, as cache-dit was given
      steps.emplace_back(f.begin(), f.end());
    }
    for (const Json& w : c["windows"]) {
      const int first = w["first"], count = w["count"];
      const double k = w["k"];
      ASSERT_FALSE(w["forecast"].is_null()) << name;
      std::vector<double> ref, got(static_cast<size_t>(batch * d));
      for (const Json& v : w["forecast"]) ref.push_back(v.get<double>());
      for (int64_t b = 0; b < batch; ++b) {
        std::vector<const double*> window;
        for (int t = first; t < first + count; ++t) window.push_back(steps[t].data() + b * d);
        const auto fit = cache::dmd_fit(window, d, DmdOptions{});
        ASSERT_TRUE(fit.has_value()) << name;
        EXPECT_EQ(fit->rank(), w["ranks"][b].get<int>()) << name << " item " << b;
        cache::dmd_combine(window, d, fit->coefficients(k), got.data() + b * d);
      }
      EXPECT_LT(rel_err(got, ref), 1e-12)
          << name << " first " << first << " count " << count << " k " << k;
      ++compared;
    }
  }
  EXPECT_EQ(compared, 4 * 3 * 4);
}

TEST(DmdGolden, PolicyOnTheTaylorSeerScheduleMatchesCacheDit) {
  const Json doc = read_json_file(test::golden("dmd/cases.json"));
  int compared = 0;
  for (const Json& c : doc["cases"]) {
    const std::string name = c["name"];
    Driver drv;
    drv.batch = c["batch"];
    drv.cols = 8;
    drv.seq = c["features"].get<int64_t>() / 8;
    std::vector<std::vector<float>> outputs;
    for (const Json& s : c["steps"]) outputs.push_back(floats(s));
    for (const Json& sched : c["schedules"]) {
      const std::string spec =
          "taylorseer:forecaster=dmd,interval=" + std::to_string(sched["interval"].get<int>()) +
          ",before=" + std::to_string(sched["before"].get<int>());
      const auto seen = drv.run(spec, outputs);
      ASSERT_FALSE(sched["records"].empty()) << name << " " << spec;
      for (const Json& r : sched["records"]) {
        const int call = r["call"];
        std::vector<double> ref;
        for (const Json& v : r["forecast"]) ref.push_back(v.get<double>());
        const std::vector<double> got(seen[call].begin(), seen[call].end());
        EXPECT_LT(rel_err(got, ref), 1e-6) << name << " " << spec << " call " << call;
        ++compared;
      }
    }
  }
  EXPECT_GT(compared, 40);
}

// ---------------------------------------------------------------- inside the model

// Forecasts replace the text and target streams' attention outputs only: the references' K/V
// stay exact, so the cache with the policy equals the policy alone, bit for bit.
TEST(DmdInModels, ComposesWithTheKleinReferenceCache) {
  const test::KleinFixture f(DType::kF32);
  const std::string spec = "taylorseer:forecaster=dmd,interval=2,before=1";
  std::vector<StepCacheStats> st;
  const auto cached = klein_run(f, KVMode::kCached, 12, {spec}, &st);
  EXPECT_TRUE(same_bits(cached, klein_run(f, KVMode::kRecompute, 12, {spec})));
  ASSERT_EQ(st.size(), 1u);
  EXPECT_EQ(st[0].decisions, "CpCpCpCpCpCp");
  EXPECT_NE(st[0].settings.find("forecaster=dmd dmd_history=6 dmd_rank=0 dmd_ridge=1e-08"),
            std::string::npos)
      << st[0].settings;
  EXPECT_EQ(st[0].report.find(" 0 stream forecasts by DMD"), std::string::npos) << st[0].report;
  EXPECT_EQ(st[0].report.find("(0 fits)"), std::string::npos) << st[0].report;
  // It forecasts differently from the Taylor series; forecaster=taylor is the default, bit for
  // bit.
  const auto taylor = klein_run(f, KVMode::kCached, 12, {"taylorseer:interval=2,before=1"});
  EXPECT_FALSE(same_bits(cached, taylor));
  EXPECT_TRUE(same_bits(taylor, klein_run(f, KVMode::kCached, 12,
                                          {"taylorseer:interval=2,before=1,forecaster=taylor"})));
}

// ---------------------------------------------------------------- knobs

std::string error_of(const std::string& spec) {
  cache::Topology topo;
  topo.blocks.push_back({"transformer_blocks.0", "double"});
  try {
    cache::make_policies({spec}, topo);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(DmdKnobs, RangesAndMisuseAreNamed) {
  EXPECT_EQ(error_of("taylorseer:forecaster=dmd,dmd_history=4,dmd_rank=3,dmd_ridge=0"), "");
  EXPECT_NE(error_of("taylorseer:forecaster=prony").find("forecaster must be taylor or dmd"),
            std::string::npos);
  EXPECT_NE(error_of("taylorseer:forecaster=dmd,dmd_history=3").find("dmd_history=3 is outside"),
            std::string::npos);
  EXPECT_NE(error_of("taylorseer:forecaster=dmd,dmd_history=33").find("dmd_history=33"),
            std::string::npos);
  EXPECT_NE(error_of("taylorseer:forecaster=dmd,dmd_history=5.5").find("must be an integer"),
            std::string::npos);
  EXPECT_NE(error_of("taylorseer:forecaster=dmd,dmd_rank=6").find("dmd_rank=6 is more than"),
            std::string::npos);
  EXPECT_NE(error_of("taylorseer:forecaster=dmd,dmd_history=8,dmd_rank=8").find("dmd_rank=8"),
            std::string::npos);
  EXPECT_EQ(error_of("taylorseer:forecaster=dmd,dmd_history=8,dmd_rank=7"), "");
  EXPECT_NE(error_of("taylorseer:forecaster=dmd,dmd_rank=-1").find("dmd_rank=-1 is outside"),
            std::string::npos);
  EXPECT_NE(error_of("taylorseer:forecaster=dmd,dmd_ridge=-1e-3").find("dmd_ridge"),
            std::string::npos);
  EXPECT_NE(error_of("taylorseer:forecaster=dmd,dmd_ridge=nan").find("not a finite number"),
            std::string::npos);
  for (const std::string spec :
       {"taylorseer:dmd_history=6", "taylorseer:forecaster=taylor,dmd_rank=2",
        "taylorseer:dmd_ridge=0"}) {
    EXPECT_NE(error_of(spec).find("apply only with forecaster=dmd"), std::string::npos) << spec;
  }
  EXPECT_NE(error_of("taylorseer:forecaster=dmd,dmd_svd_precision=low")
                .find("has no option 'dmd_svd_precision'"),
            std::string::npos);
}

TEST(DmdKnobs, TheSummaryNamesTheForecaster) {
  for (const cache::PolicyInfo& p : cache::registered_policies()) {
    if (p.name != "taylorseer") continue;
    EXPECT_NE(p.summary.find("forecaster (taylor|dmd)"), std::string::npos);
    EXPECT_NE(p.summary.find("dmd_history (6)"), std::string::npos);
    return;
  }
  FAIL() << "taylorseer is not registered";
}

}  // namespace
}  // namespace flowkv
