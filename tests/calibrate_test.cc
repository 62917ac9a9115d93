// flowkv calibrate's parts: the least-squares polynomial (exact recovery; noisy samples against
// numpy.polyfit, python/ref/polyfit_expected.py), pooling what calibration requests measured,
// the case manifest, and the command end to end on the tiny random Klein pipeline (its specs
// parse back into policies).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "cache/policy.h"
#include "flowkv/calibrate.h"
#include "flowkv/error.h"
#include "temp_files.h"

namespace flowkv {
namespace {

// TeaCache's published FLUX.1 polynomial, highest power first.
const std::vector<double> kFlux1 = {4.98651651e02, -2.83781631e02, 5.58554382e01, -3.82021401e00,
                                    2.64230861e-01};

double poly(const std::vector<double>& c, double x) {
  double y = 0;
  for (double v : c) y = y * x + v;
  return y;
}

TEST(PolynomialFit, RecoversAnExactPolynomial) {
  std::vector<double> x, y;
  for (int i = 0; i < 25; ++i) {
    x.push_back(0.03 + 0.5 * i / 24.0);
    y.push_back(poly(kFlux1, x.back()));
  }
  const PolynomialFit f = fit_polynomial(x, y, 4);
  ASSERT_EQ(f.coefficients.size(), 5u);
  for (size_t i = 0; i < 5; ++i)
    EXPECT_NEAR(f.coefficients[i], kFlux1[i], 1e-9 * std::abs(kFlux1[i])) << i;
  EXPECT_LT(f.rms_residual, 1e-12);
  EXPECT_EQ(f.samples, 25);
  EXPECT_DOUBLE_EQ(f.x_min, 0.03);
  EXPECT_DOUBLE_EQ(f.x_max, 0.53);
  // Exactly as many distinct x values as coefficients, in any order, repeated: still exact.
  const std::vector<double> x5 = {0.4, 0.1, 0.3, 0.1, 0.2, 0.5, 0.4};
  std::vector<double> y5;
  for (double v : x5) y5.push_back(poly(kFlux1, v));
  const PolynomialFit g = fit_polynomial(x5, y5, 4);
  for (size_t i = 0; i < 5; ++i)
    EXPECT_NEAR(g.coefficients[i], kFlux1[i], 1e-8 * std::abs(kFlux1[i])) << i;
  // Degree 1 through two points.
  const PolynomialFit line = fit_polynomial({1, 3}, {5, 9}, 1);
  EXPECT_NEAR(line.coefficients[0], 2, 1e-12);
  EXPECT_NEAR(line.coefficients[1], 3, 1e-12);
}

// python/ref/polyfit_expected.py (numpy 2.4.6) on the same samples.
TEST(PolynomialFit, NoisySamplesMatchNumpyPolyfit) {
  const int n = 40;
  std::vector<double> x, y;
  for (int i = 0; i < n; ++i) {
    x.push_back(0.02 + 0.58 * i / (n - 1));
    y.push_back(poly(kFlux1, x.back()) + 0.05 * std::sin(1.7 * i));
  }
  const std::vector<double> numpy = {501.42513633062464, -287.3858544999233, 57.46433936461879,
                                     -4.102731729497298, 0.2797308472221395};
  const PolynomialFit f = fit_polynomial(x, y, 4);
  ASSERT_EQ(f.coefficients.size(), 5u);
  for (size_t i = 0; i < 5; ++i)
    EXPECT_NEAR(f.coefficients[i], numpy[i], 1e-9 * std::abs(numpy[i])) << i;
  EXPECT_NEAR(f.rms_residual, 0.03487345435730063, 1e-12);
  EXPECT_NEAR(f.max_residual, 0.051208694742401306, 1e-12);
}

TEST(PolynomialFit, RefusesWhatCannotBeFitted) {
  auto message = [](const std::vector<double>& x, const std::vector<double>& y, int degree) {
    try {
      fit_polynomial(x, y, degree);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message({0.1, 0.2, 0.2, 0.3, 0.3, 0.1}, {1, 2, 3, 4, 5, 6}, 4)
                .find("needs 5 distinct x values; got 3 (of 6 samples)"),
            std::string::npos);
  EXPECT_NE(message({0.1, 0.2}, {1}, 1).find("2 x values but 1 y values"), std::string::npos);
  EXPECT_NE(message({0.1, NAN}, {1, 2}, 1).find("sample 1 is not finite"), std::string::npos);
  EXPECT_NE(message({}, {}, 4).find("got 0"), std::string::npos);
  EXPECT_NE(message({1}, {1}, 11).find("outside [0, 10]"), std::string::npos);
}

StepCacheStats teacache_stats(int branch, std::vector<double> x, std::vector<double> y) {
  StepCacheStats s;
  s.name = "teacache";
  s.measured = {{"teacache.x", branch, std::move(x)}, {"teacache.y", branch, std::move(y)}};
  return s;
}

StepCacheStats magcache_stats(std::vector<std::vector<double>> series) {
  StepCacheStats s;
  s.name = "magcache";
  for (size_t b = 0; b < series.size(); ++b)
    s.measured.push_back({"magcache.ratios", static_cast<int>(b), series[b]});
  return s;
}

// Pairs pool over requests and branches; ratios average per step; the specs parse back into
// policies holding the same numbers.
TEST(StepCacheCalibration, PoolsPairsAveragesRatiosAndPrintsParsableSpecs) {
  std::vector<double> x1, y1, x2, y2;
  for (int i = 0; i < 4; ++i) {
    x1.push_back(0.05 + 0.1 * i), y1.push_back(poly(kFlux1, x1.back()));
    x2.push_back(0.07 + 0.1 * i), y2.push_back(poly(kFlux1, x2.back()));
  }
  const std::vector<std::vector<StepCacheStats>> runs = {
      {teacache_stats(0, x1, y1), magcache_stats({{1.0, 1.2, 0.9}, {1.0, 1.4, 0.7}})},
      {magcache_stats({{1.0, 1.0, 1.1}}), teacache_stats(1, x2, y2)},
  };
  const StepCacheCalibration cal = fit_step_caches(runs);
  EXPECT_EQ(cal.teacache.samples, 8);
  EXPECT_TRUE(cal.teacache_problem.empty()) << cal.teacache_problem;
  for (size_t i = 0; i < 5; ++i)
    EXPECT_NEAR(cal.teacache.coefficients[i], kFlux1[i], 1e-8 * std::abs(kFlux1[i])) << i;
  EXPECT_EQ(cal.magcache_series, 3);
  ASSERT_EQ(cal.magcache_ratios.size(), 3u);
  EXPECT_DOUBLE_EQ(cal.magcache_ratios[0], 1.0);
  EXPECT_NEAR(cal.magcache_ratios[1], 3.6 / 3, 1e-15);
  EXPECT_NEAR(cal.magcache_ratios[2], 2.7 / 3, 1e-15);

  cache::Topology t;  // a model that publishes nothing: the specs carry everything needed
  t.model = "tiny";
  t.blocks = {{"blocks.0", "joint"}};
  const std::string tea = cal.teacache_spec(), mag = cal.magcache_spec();
  ASSERT_EQ(tea.rfind("teacache:coefficients=", 0), 0u) << tea;
  ASSERT_EQ(mag.rfind("magcache:ratios=", 0), 0u) << mag;
  EXPECT_NO_THROW(cache::make_policies({tea, mag}, t));
  // The printed values read back as the same doubles.
  const std::vector<double> back =
      cache::PolicyOptions::parse(tea.substr(9)).list("coefficients", {});
  EXPECT_EQ(back, cal.teacache.coefficients);
  EXPECT_EQ(cache::PolicyOptions::parse(mag.substr(9)).list("ratios", {}), cal.magcache_ratios);
}

TEST(StepCacheCalibration, SaysWhyNothingWasFitted) {
  const StepCacheCalibration none = fit_step_caches({{teacache_stats(0, {0.1, 0.2}, {1, 2})}});
  EXPECT_TRUE(none.teacache_spec().empty());
  EXPECT_TRUE(none.magcache_spec().empty());
  EXPECT_NE(none.teacache_problem.find("run more cases or more steps"), std::string::npos)
      << none.teacache_problem;
  EXPECT_THROW(fit_step_caches({{magcache_stats({{1, 2}})}, {magcache_stats({{1, 2, 3}})}}), Error);
}

// ---------------------------------------------------------------- the command

// `flowkv calibrate` on the tiny random Klein pipeline over a two-case manifest: it prints two
// --cache specs that the policies accept, and its JSON says the same. The command line's path
// comes in FLOWKV_CLI (ctest sets it, tests/CMakeLists.txt); without it the test is skipped.
TEST(CalibrateCli, FitsTheTinyPipelineAndItsSpecsParseBack) {
  const char* cli = std::getenv("FLOWKV_CLI");
  if (cli == nullptr || *cli == '\0') GTEST_SKIP() << "FLOWKV_CLI not set";
  const std::string golden = FLOWKV_GOLDEN_DIR "/klein_pipeline";
  test::TempDir dir;
  const std::string manifest = dir.file("cases.json");
  std::ofstream(manifest) << R"({"size": [32, 32], "steps": 4, "seed": 1, "cases": [
      {"name": "fox", "task": "edit", "prompt": "a fox", "references": [")"
                          << golden << R"(/reference.png"], "truth": null},
      {"name": "cat", "task": "t2i", "prompt": "a cat"}]})";
  const std::string json = dir.file("fit.json");
  const std::string cmd = "'" + std::string(cli) + "' calibrate --model '" + golden +
                          "/kv/pipeline' --cases '" + manifest + "' --json '" + json + "' 2>&1";
  FILE* pipe = popen(cmd.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string out;
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, pipe)) > 0;) out.append(buf, n);
  ASSERT_EQ(pclose(pipe), 0) << out;

  std::vector<std::string> specs;
  std::istringstream in(out);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("--cache ", 0) == 0) specs.push_back(line.substr(8));
  }
  ASSERT_EQ(specs.size(), 2u) << out;
  EXPECT_EQ(specs[0].rfind("teacache:coefficients=", 0), 0u) << specs[0];
  EXPECT_EQ(specs[1].rfind("magcache:ratios=1/", 0), 0u) << specs[1];
  EXPECT_NE(out.find("calibrated on 2 case(s) at 4 steps"), std::string::npos) << out;
  EXPECT_NE(out.find("teacache: 6 pairs"), std::string::npos) << out;  // 2 cases x 3
  EXPECT_NE(out.find("magcache: 2 series averaged"), std::string::npos) << out;
  cache::Topology t;
  t.model = "tiny";
  t.blocks = {{"blocks.0", "joint"}};
  for (const std::string& s : specs) {
    const auto made = cache::make_policies({s}, t);
    ASSERT_EQ(made.size(), 1u) << s;
  }
  EXPECT_EQ(cache::PolicyOptions::parse(specs[1].substr(9)).list("ratios", {}).size(), 4u);

  std::ifstream f(json);
  std::stringstream text;
  text << f.rdbuf();
  EXPECT_NE(text.str().find("\"spec\": \"" + specs[0] + "\""), std::string::npos) << text.str();
  EXPECT_NE(text.str().find("\"spec\": \"" + specs[1] + "\""), std::string::npos) << text.str();
  EXPECT_NE(text.str().find("\"pairs\": 6"), std::string::npos) << text.str();
}

}  // namespace
}  // namespace flowkv
