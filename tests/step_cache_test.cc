// Approximate step caches: each policy's compute/skip decisions against the traces recorded
// from diffusers' hooks (spec caches.md §13) on a scripted block stack, the edge rules of §14,
// branch and request isolation, and the policies inside the real models: a policy that never
// fires is bit-identical to the uncached run, and every policy composed with an exact cache
// (Klein references, Qwen-Image-2.1 prefix) gives what it gives with the cache off.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <set>
#include <sstream>

#include "cache/policy.h"
#include "cache/spectral.h"
#include "families/family.h"
#include "family_cases.h"
#include "fixtures.h"
#include "flowkv/error.h"
#include "flowkv/step_cache.h"
#include "test_util.h"

namespace flowkv {
namespace {

using test::klein_run;
using test::qwen21_run;
using test::same_bits;

using cache::BlockAction;
using cache::Composite;
using cache::StepContext;
using cache::Streams;
using cache::Sublayer;

// ---------------------------------------------------------------- a scripted block stack

// A stand-in for a model's block loop: `blocks` blocks over a text and a target stream of
// `tokens` x `cols`; block b's attention and MLP sublayers output the constant field
// value(b, sublayer, call) (call: this branch's call index), added to both streams. Each call
// reports the first block's attention output (computed, predicted or reused).
struct Stack {
  int blocks = 1;
  int64_t tokens = 4, cols = 3;  // a 2x2 grid
  std::function<float(int block, int sub, int call)> value = [](int, int, int) { return 0.0f; };
  cache::Topology topology() const {
    cache::Topology t;
    t.model = "flux1";
    t.tables = families::flux1_tables();  // the scripted traces were made with FLUX.1's tables
    for (int b = 0; b < blocks; ++b) t.blocks.push_back({"blocks." + std::to_string(b), "joint"});
    return t;
  }

  struct Call {
    std::vector<float> target;  // target stream after the stack
    float attn0 = NAN;          // block 0's attention output (token 0, column 0)
  };

  Call run(Composite& p, const StepContext& ctx, int call, std::vector<float> target) const {
    p.set_step(ctx);
    std::vector<float> text(static_cast<size_t>(tokens * cols), 1.0f);
    Streams s;
    s.s.push_back({"text", {text.data(), tokens, cols, cols}, tokens, 0});
    s.s.push_back({"target", {target.data(), tokens, cols, cols}, tokens, 0});
    p.begin(s, s.s[1].x);
    Call out;
    std::vector<float> yt(text.size()), yi(text.size());
    Streams y;
    y.s.push_back({"text", {yt.data(), tokens, cols, cols}, tokens, 0});
    y.s.push_back({"target", {yi.data(), tokens, cols, cols}, tokens, 0});
    for (int b = 0; b < blocks; ++b) {
      if (p.before_block(b, s) == BlockAction::kRun) {
        for (int sub = 0; sub < 2; ++sub) {
          const Sublayer which = sub == 0 ? Sublayer::kAttention : Sublayer::kMlp;
          if (p.reuse(b, which)) {
            p.fetch(b, which, y);
          } else {
            std::fill(yt.begin(), yt.end(), value(b, sub, call));
            std::fill(yi.begin(), yi.end(), value(b, sub, call));
            p.store(b, which, y);
          }
          if (b == 0 && sub == 0) out.attn0 = yi[0];
          for (size_t i = 0; i < yi.size(); ++i) text[i] += yt[i], target[i] += yi[i];
        }
      }
      p.after_block(b, s);
    }
    p.end(s);
    out.target = target;
    return out;
  }
};

Composite policy(const std::string& spec, const Stack& stack) {
  return Composite(cache::make_policies({spec}, stack.topology()));
}

StepContext step(int k, int n, float t = 500.0f, int branch = 0, bool cfg = false) {
  StepContext c;
  c.step = k, c.num_steps = n, c.timestep = t, c.sigma = t / 1000.0f, c.branch = branch,
  c.cfg = cfg;
  return c;
}

// Runs `calls` calls of one branch (one call per step) and returns the decisions.
std::string decisions(const std::string& spec, int calls, const Stack& stack = Stack{},
                      std::vector<float> times = {}) {
  Composite p = policy(spec, stack);
  for (int k = 0; k < calls; ++k) {
    const float t = times.empty() ? 500.0f : times[static_cast<size_t>(k)];
    stack.run(p, step(k, calls, t), k,
              std::vector<float>(static_cast<size_t>(stack.tokens * stack.cols)));
  }
  return p.parts()[0]->stats().decisions;
}

// ---------------------------------------------------------------- §13.1 TaylorSeer

TEST(TaylorSeerTrace, SchedulesOfTheSpec) {
  EXPECT_EQ(decisions("taylorseer", 28), "CCCpCppppCppppCppppCppppCppp");
  EXPECT_EQ(decisions("taylorseer:interval=5,before=10", 28), "CCCCCCCCCCpCppppCppppCppppCp");
  EXPECT_EQ(decisions("taylorseer:interval=3,before=1", 28), "CpCppCppCppCppCppCppCppCppCp");
  EXPECT_EQ(decisions("taylorseer:interval=1,before=3", 28), std::string(28, 'C'));
  EXPECT_EQ(decisions("taylorseer:interval=5,before=3,after=20", 28),
            "CCCpCppppCppppCppppCCCCCCCCC");
  // diffusers raises at call 0; flowkv refuses the settings up front.
  EXPECT_THROW(decisions("taylorseer:interval=4,before=0", 1), Error);
}

// flowkv predict's expected work: from the knobs alone, equal to what a run's schedule does
// where the schedule is fixed (TaylorSeer's forecasts, MeanCache's skipped steps), a bound for
// SeaCache, unknown for a policy that decides from the data.
TEST(StepCachePredict, ExpectedWorkFollowsTheSchedules) {
  auto count = [](const std::string& d, char c) {
    return static_cast<double>(std::count(d.begin(), d.end(), c));
  };
  const std::vector<std::string> specs = {"taylorseer",
                                          "taylorseer:interval=3,before=1",
                                          "taylorseer:forecaster=dmd,interval=2",
                                          "meancache",
                                          "meancache:budget=8",
                                          "seacache",
                                          "teacache"};
  const std::vector<StepCacheExpectation> e = expected_step_cache_work(specs, 28, 2);
  ASSERT_EQ(e.size(), specs.size());
  for (int i : {0, 1, 2}) {
    const std::string d = decisions(specs[static_cast<size_t>(i)], 28);
    EXPECT_TRUE(e[static_cast<size_t>(i)].known);
    EXPECT_DOUBLE_EQ(e[static_cast<size_t>(i)].skipped_fraction, count(d, 'p') / 28)
        << specs[static_cast<size_t>(i)] << " " << d;
  }
  // MeanCache at 40% of 28 steps (11 computed) and at a budget of 8: the measured runs of
  // docs/caches.md skipped 238 and 280 of 392 calls (14 cases x 28 steps).
  EXPECT_DOUBLE_EQ(e[3].skipped_fraction, 17.0 / 28);
  EXPECT_DOUBLE_EQ(e[4].skipped_fraction, 20.0 / 28);
  EXPECT_NE(e[4].text.find("0/4/8/12/15/19/23/27"), std::string::npos) << e[4].text;
  // SeaCache: steps 1..26 may skip, at most 2 in a row: 26 - 26 / 3 = 18.
  EXPECT_TRUE(e[5].upper_bound);
  EXPECT_DOUBLE_EQ(e[5].skipped_fraction, 18.0 / 28);
  EXPECT_FALSE(e[6].known);
  EXPECT_NE(e[6].text.find("run time"), std::string::npos);
  EXPECT_THROW(expected_step_cache_work({"meancache:schedule=0/4/7"}, 28, 1), Error);
}

std::vector<float> taylor_values(const std::string& spec, std::function<float(int)> g, int n) {
  Stack s;
  s.value = [g](int, int sub, int call) { return sub == 0 ? g(call) : 0.0f; };
  Composite p = policy(spec, s);
  std::vector<float> out;
  for (int k = 0; k < n; ++k) out.push_back(s.run(p, step(k, n), k, std::vector<float>(12)).attn0);
  return out;
}

TEST(TaylorSeerTrace, ForecastValuesOfTheSpec) {
  auto linear = taylor_values(
      "taylorseer:factors=f32", [](int k) { return 1.0f + 2.0f * k; }, 12);
  for (int k = 0; k < 12; ++k) EXPECT_EQ(linear[static_cast<size_t>(k)], 1.0f + 2.0f * k) << k;

  const std::vector<float> order1 = {0, 1, 4, 7, 16, 22, 28, 34, 40, 81, 94, 107};
  EXPECT_EQ(taylor_values(
                "taylorseer:factors=f32", [](int k) { return float(k * k); }, 12),
            order1);

  const std::vector<float> order2 = {0, 1, 4, 8, 16, 22.75f, 31, 40.75f, 52, 81, 94.7f, 109.8f};
  const auto got2 = taylor_values(
      "taylorseer:factors=f32,order=2", [](int k) { return float(k * k); }, 12);
  for (size_t k = 0; k < order2.size(); ++k) EXPECT_NEAR(got2[k], order2[k], 1e-4) << k;

  // Default bf16 factors round the forecast: 1.001 + 2k predicts 7.0, 11.0, ...
  const auto bf = taylor_values(
      "taylorseer", [](int k) { return 1.001f + 2.0f * k; }, 12);
  EXPECT_FLOAT_EQ(bf[3], 7.0f);
  EXPECT_FLOAT_EQ(bf[5], 11.0f);
  EXPECT_FLOAT_EQ(bf[4], 1.001f + 8.0f);  // computed calls return the real output
}

// ---------------------------------------------------------------- §13.2 MagCache

TEST(MagCacheTrace, SchedulesOfTheSpec) {
  EXPECT_EQ(decisions("magcache:ratios=flux1", 28), "CCCCCCsCsCsssCsssCsssCssCsCC");
  EXPECT_EQ(decisions("magcache:ratios=flux1", 50),
            "CCCCCCCCCCsCsCsCsCsCsssCsssCsssCsssCsssCssCsCsCCCC");
  EXPECT_EQ(decisions("magcache:ratios=flux1", 20), "CCCCsCsCsssCsssCssCC");
  EXPECT_EQ(decisions("magcache:ratios=flux1", 4), "CsCC");
  EXPECT_EQ(decisions("magcache:ratios=flux1,threshold=0.1", 28), "CCCCCCsCssCsssCsssCsssCssCsC");
  EXPECT_EQ(decisions("magcache:ratios=flux1,threshold=0.24", 28), "CCCCCCsssCsssCsssCsssCsssCss");
  EXPECT_EQ(decisions("magcache:ratios=flux1,threshold=0.24,max_skip=5", 28),
            "CCCCCCsssCsssssCsssssCssssCs");
  EXPECT_EQ(decisions("magcache:ratios=flux1,threshold=0.24,max_skip=5,retention=0.1", 28),
            "CCCssCsssCsssssCsssssCssssCs");
}

TEST(MagCacheTrace, SkippedStepIsInputPlusLastResidualAndTheTextPassesThrough) {
  Stack s;
  s.value = [](int, int sub, int call) { return sub == 0 ? 10.0f + call : 0.0f; };
  Composite p = policy("magcache:ratios=flux1", s);
  std::vector<float> in(12, 0.5f);
  s.run(p, step(0, 4), 0, in);                       // C: residual 10
  const auto skipped = s.run(p, step(1, 4), 1, in);  // s
  EXPECT_EQ(p.parts()[0]->stats().decisions, "Cs");
  EXPECT_FLOAT_EQ(skipped.target[0], 0.5f + 10.0f);
}

TEST(MagCacheTrace, CalibrationPrintsTheRatiosAsDiffusersDoes) {
  Stack s;  // residual norms 5, 7, 9, 11: ratios 1, 7/5, 9/7, 11/9
  s.value = [](int, int sub, int call) { return sub == 0 ? 5.0f + 2.0f * call : 0.0f; };
  Composite p = policy("magcache:calibrate=1", s);
  for (int k = 0; k < 4; ++k) s.run(p, step(k, 4), k, std::vector<float>(12));
  EXPECT_EQ(p.parts()[0]->stats().decisions, "CCCC");
  EXPECT_EQ(p.report(),
            "\n[MagCache] Calibration Complete. Copy these values to "
            "MagCacheConfig(mag_ratios=...):\n"
            "[1.0, 1.399999976158142, 1.2857142686843872, 1.2222222089767456]\n\n");
}

TEST(MagCacheTrace, RatiosAreRequiredWithAnExplanation) {
  try {
    decisions("magcache", 1);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("calibrate=1"), std::string::npos) << e.what();
  }
}

TEST(MagCacheTrace, RepeatsAfterNumStepsCalls) {  // the auto-reset
  Composite p = policy("magcache:ratios=flux1", Stack{});
  for (int k = 0; k < 56; ++k) Stack{}.run(p, step(k % 28, 28), k, std::vector<float>(12));
  EXPECT_EQ(p.parts()[0]->stats().decisions,
            "CCCCCCsCsCsssCsssCsssCssCsCCCCCCCCsCsCsssCsssCsssCssCsCC");
}

// ---------------------------------------------------------------- §13.3 FirstBlockCache

TEST(FirstBlockCacheTrace, DecisionsOfTheSpec) {
  const std::vector<float> r = {1.0f, 1.02f, 1.04f, 1.06f, 1.2f, 1.21f, 1.22f, 1.0f};
  Stack s;
  s.blocks = 3;
  s.value = [&](int b, int sub, int call) {
    if (sub == 1) return 0.0f;
    return b == 0 ? r[static_cast<size_t>(call)] : 2.0f + b + 0.1f * call;
  };
  Composite p = policy("fbcache", s);
  std::vector<Stack::Call> calls;
  for (int k = 0; k < 8; ++k) calls.push_back(s.run(p, step(k, 8), k, std::vector<float>(12)));
  EXPECT_EQ(p.parts()[0]->stats().decisions, "CssCCssC");
  // A skipped call: head output now + (tail - head) of the last full call (call 0): the other
  // blocks added 3 + 4 there.
  EXPECT_FLOAT_EQ(calls[1].target[0], 1.02f + 7.0f);
}

// A threshold exactly at the change skips (strict ">" to compute, §14).
TEST(FirstBlockCacheTrace, ChangeEqualToThresholdSkips) {
  Stack s;
  s.blocks = 2;
  s.value = [](int b, int sub, int call) {
    return b == 0 && sub == 0 ? (call == 0 ? 1.0f : 1.5f) : 0.0f;
  };
  EXPECT_EQ(decisions("fbcache:threshold=0.5", 2, s), "Cs");
  EXPECT_EQ(decisions("fbcache:threshold=0.49", 2, s), "CC");
}

// ---------------------------------------------------------------- DBCache

TEST(DBCacheTrace, FrontMeasuresMiddleSkipsBackComputes) {
  Stack s;
  s.blocks = 4;
  s.value = [](int b, int sub, int call) {
    if (sub == 1) return 0.0f;
    return b == 0 ? 1.0f + 0.01f * call : 10.0f * b + call;
  };
  Composite p = policy("dbcache:fn=1,bn=1,threshold=0.05,warmup=2", s);
  std::vector<Stack::Call> calls;
  for (int k = 0; k < 5; ++k) calls.push_back(s.run(p, step(k, 5), k, std::vector<float>(12)));
  // Calls 0, 1 warm up; call 2 (change 0.01/1.01 against call 1) skips; so do 3 and 4 (change
  // against call 1's residual: 0.02/1.01, 0.03/1.01).
  EXPECT_EQ(p.parts()[0]->stats().decisions, "CCsss");
  // Skipped call 2: front now (1.02) + middle residual of call 1 (blocks 1, 2: 11 + 21) + the
  // back block computed now (30 + 2).
  EXPECT_FLOAT_EQ(calls[2].target[0], 1.02f + 32.0f + 32.0f);
  EXPECT_EQ(p.parts()[0]->stats().blocks_skipped, 6);  // 2 middle blocks x 3 calls
  EXPECT_EQ(decisions("dbcache:fn=1,bn=1,threshold=0.05,warmup=2,max_continuous=1", 5, s), "CCsCs");
  EXPECT_THROW(decisions("dbcache:fn=3,bn=1", 1, s), Error);
}

// ---------------------------------------------------------------- TeaCache

TEST(TeaCacheTrace, AccumulatesTheRescaledProbeChange) {
  Stack s;
  s.blocks = 2;
  s.value = [](int, int sub, int call) { return sub == 0 ? 1.0f : 0.0f; };
  // The probe is the target input: 1, 1.01, 1.02, ... (relative change ~0.01: f = 0.2313).
  Composite p = policy("teacache:threshold=0.5", s);
  for (int k = 0; k < 6; ++k) s.run(p, step(k, 6), k, std::vector<float>(12, 1.0f + 0.01f * k));
  // 0: first step; 1: acc 0.231 < 0.5 skip; 2: 0.46 skip; 3: 0.69 compute (reset); 4: skip;
  // 5: last step computes.
  EXPECT_EQ(p.parts()[0]->stats().decisions, "CssCsC");
  EXPECT_THROW(decisions("teacache:model=nothing", 1, s), Error);
}

// calibrate=1: never skips; from each branch's second call on, one pair per call: x the probe's
// relative L1 change, y the model output's (seen through observe_output).
TEST(TeaCacheTrace, CalibrationRecordsTheProbeAndOutputChanges) {
  Stack s;
  Composite p = policy("teacache:calibrate=1", s);
  const std::vector<float> outputs = {2.0f, 3.0f, 3.3f, 3.0f};
  for (int k = 0; k < 4; ++k) {
    for (int b = 0; b < 2; ++b) {
      const StepContext c = step(k, 4, 500, b, true);
      // Probe 1 + 0.1 k (branch 1: twice that); output outputs[k] (branch 1: its negative).
      s.run(p, c, k, std::vector<float>(12, (1.0f + 0.1f * k) * (b + 1)));
      const std::vector<float> v(6, b == 0 ? outputs[k] : -outputs[k]);
      p.observe_output(c, v.data(), static_cast<int64_t>(v.size()));
    }
  }
  EXPECT_EQ(p.parts()[0]->stats().decisions, "CCCCCCCC");
  const std::vector<StepCacheSeries> m = p.measured();
  ASSERT_EQ(m.size(), 4u);
  const std::vector<double> x = {0.1 / 1.0, 0.1 / 1.1, 0.1 / 1.2};
  const std::vector<double> y = {1.0 / 2.0, 0.3 / 3.0, 0.3 / 3.3};
  for (int b = 0; b < 2; ++b) {
    const StepCacheSeries& sx = m[2 * static_cast<size_t>(b)];
    const StepCacheSeries& sy = m[2 * static_cast<size_t>(b) + 1];
    EXPECT_EQ(sx.name, "teacache.x");
    EXPECT_EQ(sy.name, "teacache.y");
    EXPECT_EQ(sx.branch, b);
    ASSERT_EQ(sx.values.size(), 3u);
    ASSERT_EQ(sy.values.size(), 3u);
    for (size_t i = 0; i < 3; ++i) {  // float inputs: relative 1e-6
      EXPECT_NEAR(sx.values[i], x[i], 1e-6) << b << " " << i;
      EXPECT_NEAR(sy.values[i], y[i], 1e-6) << b << " " << i;
    }
  }
  EXPECT_NE(p.report().find("[TeaCache] Calibration: 3 pairs"), std::string::npos) << p.report();
  // No coefficients are needed to calibrate, even for a model that publishes none.
  Stack bare;
  cache::Topology t = bare.topology();
  t.tables.clear();
  EXPECT_NO_THROW(cache::make_policies({"teacache:calibrate=1"}, t));
  EXPECT_THROW(cache::make_policies({"teacache"}, t), Error);
}

// ---------------------------------------------------------------- FORA

TEST(ForaTrace, RefreshesOnTheFirstStepAndWhenTheRemainingIndexDividesTheInterval) {
  EXPECT_EQ(decisions("fora", 10), "CrrCrrCrrC");
  EXPECT_EQ(decisions("fora:interval=2", 7), "CrCrCrC");
  Stack s;
  s.value = [](int, int sub, int call) { return sub == 0 ? 1.0f + call : 0.0f; };
  Composite p = policy("fora", s);
  std::vector<float> attn;
  for (int k = 0; k < 4; ++k) attn.push_back(s.run(p, step(k, 4), k, std::vector<float>(12)).attn0);
  EXPECT_EQ(attn, (std::vector<float>{1, 1, 1, 4}));  // i = 3 (first), 2, 1, 0 (refresh)
}

// ---------------------------------------------------------------- §13.4 PAB

TEST(PyramidAttentionBroadcastTrace, DecisionsOfTheSpec) {
  const std::vector<float> t = {999, 950, 900, 850, 800, 799, 700, 600,
                                500, 400, 300, 200, 101, 100, 50,  0};
  EXPECT_EQ(decisions("pab", 16, Stack{}, t), "CCCCCrCrCrCrCCCC");
  EXPECT_EQ(decisions("pab:skip=4", 16, Stack{}, t), "CCCCCrrrCrrrCCCC");
}

// ---------------------------------------------------------------- §13.5 FasterCache

struct CfgTrace {
  std::string batch, attention;
};

CfgTrace faster_cache_trace(bool cfg) {
  std::vector<float> t;
  for (int k = 0; k < 25; ++k) t.push_back(999.0f - 40.0f * k);
  t.push_back(0.0f);
  Stack s;
  s.value = [](int, int sub, int call) { return sub == 0 ? 1.0f + call : 0.0f; };
  Composite p = policy("fastercache", s);
  CfgTrace out;
  const int n = static_cast<int>(t.size());
  std::vector<float> cond(12), uncond(12);
  for (int k = 0; k < n; ++k) {
    const StepContext c = step(k, n, t[static_cast<size_t>(k)], 0, cfg);
    cond = s.run(p, c, k, std::vector<float>(12)).target;
    if (!cfg) continue;
    const StepContext u = step(k, n, t[static_cast<size_t>(k)], 1, true);
    p.set_step(u);
    const bool ran = p.run_branch(u);
    out.batch += ran ? '2' : '1';
    if (ran) {
      uncond = s.run(p, u, k, std::vector<float>(12, 0.25f)).target;
      p.observe_branches(u, cond.data(), uncond.data(), 1, 4, 3, 2, 2);
    } else {
      p.fill_branch(u, cond.data(), uncond.data(), 1, 4, 3, 2, 2);
    }
  }
  out.attention = p.parts()[0]->stats().decisions;
  return out;
}

TEST(FasterCacheTrace, DecisionsOfTheSpec) {
  const CfgTrace batched = faster_cache_trace(true);
  EXPECT_EQ(batched.batch, "22222222212111121111211112");
  EXPECT_EQ(batched.attention, "CCCCCCCCCaCaCaCCCaCaCaCaCC");
  EXPECT_EQ(faster_cache_trace(false).attention, "CCCCCCCCCaCaCaCaCaCaCaCaCa");  // distilled
}

TEST(FasterCacheTrace, SkippedUnconditionalIsCondPlusTheLastDifference) {
  // With both alphas 1 the frequency split recombines: u = c + (u_ref - c_ref) (§7.2).
  Stack s;
  Composite p = policy("fastercache:alpha_low=1,alpha_high=1", s);
  std::vector<float> c_ref = test::randn(4 * 6 * 3, 1), u_ref = test::randn(4 * 6 * 3, 2),
                     c = test::randn(4 * 6 * 3, 3), u(c.size());
  const StepContext ctx = step(1, 10, 500, 1, true);
  p.set_step(ctx);
  p.observe_branches(ctx, c_ref.data(), u_ref.data(), 1, 24, 3, 4, 6);
  ASSERT_FALSE(p.run_branch(ctx));
  p.fill_branch(ctx, c.data(), u.data(), 1, 24, 3, 4, 6);
  for (size_t i = 0; i < u.size(); ++i) EXPECT_NEAR(u[i], c[i] + u_ref[i] - c_ref[i], 1e-5) << i;
}

TEST(Spectral, LowFrequencyDiscAndRoundTrip) {
  // 10x10: radius 2 around the centre after fftshift; frequency (0, 0) is inside.
  const auto m = cache::low_frequency_mask(10, 10);
  EXPECT_EQ(m[0], 1);
  EXPECT_EQ(m[2], 1);                                // (0, 2): distance 2
  EXPECT_EQ(m[3], 0);                                // (0, 3)
  EXPECT_EQ(m[static_cast<size_t>(9 * 10 + 9)], 1);  // (-1, -1)
  const auto x = test::randn(10 * 7 * 2, 5);
  std::vector<float> back(x.size(), 0.0f);
  cache::add_inverse_dft2(cache::dft2(x.data(), 10, 7, 2), back.data());
  for (size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(back[i], x[i], 1e-5);
}

// ---------------------------------------------------------------- registry and options

TEST(StepCacheRegistry, UnknownPolicyAndOptionAreNamed) {
  try {
    decisions("nosuch", 1);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("unknown cache policy 'nosuch'"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("taylorseer"), std::string::npos);
  }
  try {
    decisions("fbcache:treshold=0.1", 1);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("has no option 'treshold'"), std::string::npos);
  }
  EXPECT_THROW(decisions("fbcache:threshold=abc", 1), Error);
}

// The registered policy names, in registry order.
std::vector<std::string> registered_names() {
  std::vector<std::string> out;
  for (const cache::PolicyInfo& p : cache::registered_policies()) out.push_back(p.name);
  return out;
}

// The policies specs ("name:key=value,...") name.
std::set<std::string> policies_of(const std::vector<std::string>& specs) {
  std::set<std::string> out;
  for (const std::string& s : specs) out.insert(s.substr(0, s.find(':')));
  return out;
}

// Every registered policy is named by the specs (the registry's size is not written down: a
// policy added to or dropped from the registry shows up here, against the specs the model tests
// run).
void expect_every_policy(const std::vector<std::string>& specs) {
  const std::vector<std::string> names = registered_names();
  EXPECT_EQ(policies_of(specs), std::set<std::string>(names.begin(), names.end()));
}

TEST(StepCacheRegistry, PublicListingIsTheRegistry) {
  const std::vector<std::string> names = registered_names();
  ASSERT_FALSE(names.empty());
  EXPECT_EQ(std::set<std::string>(names.begin(), names.end()).size(), names.size())
      << "a policy registered twice";
  const std::vector<StepCachePolicy> listed = step_cache_policies();
  ASSERT_EQ(listed.size(), names.size());
  for (size_t i = 0; i < names.size(); ++i) {
    EXPECT_EQ(listed[i].name, names[i]);
    EXPECT_EQ(listed[i].summary, cache::registered_policies()[i].summary) << names[i];
    EXPECT_FALSE(listed[i].summary.empty()) << names[i];
    EXPECT_EQ(listed[i].summary.find('\n'), std::string::npos) << names[i];  // one line each
  }
}

// `flowkv caches` lists kv, then every registered policy once, in registry order, each name on
// its own line and its summary indented on the next. The command line's path comes in
// FLOWKV_CLI (ctest sets it, tests/CMakeLists.txt); without it the test is skipped.
TEST(StepCacheCli, CachesListsEveryRegisteredPolicy) {
  const char* cli = std::getenv("FLOWKV_CLI");
  if (cli == nullptr || *cli == '\0') GTEST_SKIP() << "FLOWKV_CLI not set";
  FILE* pipe = popen(("'" + std::string(cli) + "' caches").c_str(), "r");
  ASSERT_NE(pipe, nullptr) << cli;
  std::string out;
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, pipe)) > 0;) out.append(buf, n);
  ASSERT_EQ(pclose(pipe), 0) << out;

  std::vector<std::string> lines;
  std::istringstream in(out);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  std::vector<std::string> names, summaries;
  for (size_t i = 0; i + 1 < lines.size(); ++i) {
    if (!lines[i].empty() && lines[i][0] != ' ' && lines[i + 1].rfind("  ", 0) == 0) {
      names.push_back(lines[i]);
      summaries.push_back(lines[i + 1].substr(2));
    }
  }
  std::vector<std::string> want = {"kv"};
  const std::vector<std::string> registered = registered_names();
  want.insert(want.end(), registered.begin(), registered.end());
  EXPECT_EQ(names, want) << out;
  ASSERT_EQ(summaries.size(), names.size());
  for (size_t i = 0; i < registered.size() && i + 1 < summaries.size(); ++i)
    EXPECT_EQ(summaries[i + 1], cache::registered_policies()[i].summary) << registered[i];
}

// ---------------------------------------------------------------- isolation

const std::vector<std::string> kFiring = {
    "fbcache:threshold=0.5",
    "dbcache:fn=1,bn=1,threshold=0.5,warmup=1",
    "teacache:threshold=0.5",
    "magcache:ratios=flux1,threshold=0.5",
    "taylorseer:interval=2,before=1",
    "fora:interval=2",
    "pab:lo=-1,hi=2000",
};

// The conditional branch's outputs do not depend on what the unconditional branch saw.
TEST(StepCacheIsolation, BranchesNeverShareState) {
  Stack s;
  s.blocks = 4;
  for (const std::string& spec : kFiring) {
    auto run = [&](bool with_uncond) {
      s.value = [](int b, int sub, int call) { return 0.1f * b + 0.2f * sub + 0.01f * call; };
      Composite p = policy(spec, s);
      std::vector<float> out;
      for (int k = 0; k < 8; ++k) {
        const auto c = s.run(p, step(k, 8, 500, 0, with_uncond), k, std::vector<float>(12, 1.0f));
        out.insert(out.end(), c.target.begin(), c.target.end());
        if (with_uncond) s.run(p, step(k, 8, 500, 1, true), k, std::vector<float>(12, -7.0f * k));
      }
      return std::make_pair(out, p.parts()[0]->stats().decisions);
    };
    const auto alone = run(false), paired = run(true);
    EXPECT_EQ(alone.first, paired.first) << spec;
    std::string cond_decisions;
    for (size_t i = 0; i < paired.second.size(); i += 2) cond_decisions += paired.second[i];
    EXPECT_EQ(alone.second, cond_decisions) << spec;
    EXPECT_NE(alone.second.find_first_not_of('C'), std::string::npos) << spec << " never fired";
  }
}

// ---------------------------------------------------------------- inside the models

using test::kModelFiring;

// FLUX.2 Klein at the "tiny" widths with the "small" model's depth (2 double + 6 single
// blocks): deep enough for DBCache's front, middle and back blocks at a small fraction of the
// "small" model's compute (the policies' decisions need the block count, not the width).
struct DeepTinyKlein : test::KleinFixture {
  DeepTinyKlein() : KleinFixture(DType::kF32) {
    flux2::Config small;
    EXPECT_TRUE(flux2::builtin_config("small", &small));
    cfg.num_layers = small.num_layers;
    cfg.num_single_layers = small.num_single_layers;
    flux2::LoadOptions o;
    o.auto_dtype = false;
    o.compute = DType::kF32;
    model = flux2::Model::from_source(
        flux2::WeightSource(flux2::random_weights(cfg, 9, DType::kF32)), cfg, o);
  }
  int blocks() const { return cfg.num_layers + cfg.num_single_layers; }
};

const std::vector<std::string> kNeverFiring = {
    "fbcache:threshold=0",   "dbcache:fn=1,threshold=0,warmup=0",
    "teacache:threshold=0",  "magcache:ratios=flux1,max_skip=0",
    "taylorseer:interval=1", "fora:interval=1",
    "pab:lo=2000,hi=3000",   "fastercache:attn_lo=2000,attn_hi=3000,uncond_lo=2000,uncond_hi=3000",
    "seacache:threshold=0",  "meancache:budget=1000"};

TEST(StepCacheInModels, PoliciesThatNeverFireAreBitIdenticalToNoPolicy) {
  expect_every_policy(kNeverFiring);
  const test::KleinFixture f(DType::kF32);
  const auto plain = klein_run(f, KVMode::kCached, 5, {});
  for (const std::string& spec : kNeverFiring) {
    std::vector<StepCacheStats> st;
    EXPECT_TRUE(same_bits(plain, klein_run(f, KVMode::kCached, 5, {spec}, &st))) << spec;
    ASSERT_EQ(st.size(), 1u);
    EXPECT_EQ(st[0].blocks_skipped + st[0].sublayers_reused, 0) << spec;
  }
}

// Blocks skipped or sublayers reused on the text and target streams leave the references' K/V
// exact: cached + policy equals recompute + policy bit for bit.
TEST(StepCacheInModels, EveryPolicyComposesWithTheKleinReferenceCache) {
  const DeepTinyKlein f;
  std::vector<std::string> specs = kModelFiring;
  specs.push_back("dbcache:fn=2,bn=1,threshold=10,warmup=1");
  specs.push_back("fastercache");  // no CFG in Klein: attention extrapolation only
  expect_every_policy(specs);
  for (const std::string& s : specs) {
    std::vector<StepCacheStats> st;
    const auto cached = klein_run(f, KVMode::kCached, 8, {s}, &st);
    const auto recompute = klein_run(f, KVMode::kRecompute, 8, {s});
    EXPECT_TRUE(same_bits(cached, recompute)) << s;
    EXPECT_GT(st[0].blocks_skipped + st[0].sublayers_reused, 0) << s << ": " << st[0].decisions;
  }
  // Two policies at once, with the exact cache.
  std::vector<StepCacheStats> st;
  const auto both = klein_run(f, KVMode::kCached, 8,
                              {"taylorseer:interval=2,before=1", "pab:lo=-1,hi=2000"}, &st);
  EXPECT_TRUE(same_bits(both, klein_run(f, KVMode::kRecompute, 8,
                                        {"taylorseer:interval=2,before=1", "pab:lo=-1,hi=2000"})));
  ASSERT_EQ(st.size(), 2u);
}

TEST(StepCacheInModels, TextKvApproximationComposesWithAStepCache) {
  const test::KleinFixture f(DType::kF32);
  Arena arena;
  test::LoopRequest r = f.request(KVMode::kCached, 3);
  r.opts.text_kv_approx = true;
  r.opts.step_caches = {"fora:interval=2"};
  // The prefill call computes (it stores the text K/V); later calls read them.
  std::vector<StepCacheStats> st;
  EXPECT_NO_THROW(st = test::run(arena, f.model, r).step_caches);
  EXPECT_EQ(st.at(0).decisions, "CrC");
}

TEST(StepCacheInModels, EveryPolicyComposesWithTheQwen21PrefixCache) {
  const test::Qwen21Fixture f(DType::kF32, 2);
  std::vector<std::string> specs = kModelFiring;
  specs.push_back("fastercache:uncond_hi=2000,attn_hi=2000");
  expect_every_policy(specs);
  for (const std::string& s : specs) {
    std::vector<StepCacheStats> st;
    const auto cached = qwen21_run(f, true, true, 8, {s}, &st);
    const auto uncached = qwen21_run(f, false, true, 8, {s});
    EXPECT_TRUE(same_bits(cached, uncached)) << s;
    EXPECT_GT(st[0].blocks_skipped + st[0].sublayers_reused + st[0].branches_skipped, 0)
        << s << ": " << st[0].decisions;
  }
  const auto plain = qwen21_run(f, true, true, 4, {});  // the same for every spec: run once
  for (const std::string& spec : kNeverFiring) {
    EXPECT_TRUE(same_bits(plain, qwen21_run(f, true, true, 4, {spec}))) << spec;
  }
}

// Each hooked sublayer is asked once per call: the schedules inside the models are the ones of
// the scripted stack (and counts are blocks x calls).
TEST(StepCacheInModels, DecisionsFollowTheScheduleInsideBothModels) {
  const DeepTinyKlein k;
  std::vector<StepCacheStats> st;
  klein_run(k, KVMode::kCached, 8, {"taylorseer", "pab:lo=-1,hi=2000", "fora:interval=2"}, &st);
  ASSERT_EQ(st.size(), 3u);
  EXPECT_EQ(st[0].decisions, "CCCpCppp");
  EXPECT_EQ(k.blocks(), 8);
  EXPECT_EQ(st[0].sublayers_reused, 4 * k.blocks());  // 4 forecast calls x 8 blocks
  EXPECT_EQ(st[1].decisions, "CrCrCrCr");
  EXPECT_EQ(st[2].decisions, "CCrCrCrC");

  const test::Qwen21Fixture q(DType::kF32, 1);
  qwen21_run(q, true, true, 8, {"taylorseer", "pab:lo=-1,hi=2000", "fora:interval=2"}, &st);
  ASSERT_EQ(st.size(), 3u);
  EXPECT_EQ(st[0].decisions, "CCCCCCppCCpppppp");  // cond, uncond per step
  EXPECT_EQ(st[0].sublayers_reused, 2 * 4 * q.cfg.num_layers);
  EXPECT_EQ(st[1].decisions, "CCrrCCrrCCrrCCrr");
  EXPECT_EQ(st[2].decisions, "CCCCrrCCrrCCrrCC");
}

// Calibration inside a model with CFG: nothing skipped (bit-identical to no policy), and per
// branch steps - 1 finite TeaCache pairs and one MagCache ratio per step.
TEST(StepCacheInModels, CalibrationNeverSkipsAndMeasuresEveryBranch) {
  const test::Qwen21Fixture f(DType::kF32, 1);
  constexpr int kSteps = 4;
  Arena arena;
  test::LoopRequest r = f.request(true, true, kSteps, /*batch_cfg=*/false);
  r.opts.step_caches = {"teacache:calibrate=1", "magcache:calibrate=1"};
  std::vector<std::vector<float>> outputs[2];  // each branch's velocity, step by step
  r.observe = [&](int, const float* cond, const float* uncond, const float*, const float*) {
    const size_t n = f.noise.size();
    outputs[0].emplace_back(cond, cond + n);
    outputs[1].emplace_back(uncond, uncond + n);
  };
  const auto res = test::run(arena, f.model, r);
  EXPECT_TRUE(same_bits(qwen21_run(f, true, true, kSteps, {}), res.latents));
  const std::vector<StepCacheStats>& st = res.step_caches;
  ASSERT_EQ(st.size(), 2u);
  std::map<std::string, int> seen;
  for (const StepCacheStats& s : st) {
    EXPECT_EQ(s.decisions, std::string(2 * kSteps, 'C')) << s.name;
    EXPECT_EQ(s.blocks_skipped, 0) << s.name;
    for (const StepCacheSeries& m : s.measured) {
      seen[m.name + "." + std::to_string(m.branch)]++;
      EXPECT_EQ(m.values.size(), m.name == "magcache.ratios" ? kSteps : kSteps - 1) << m.name;
      for (double v : m.values) EXPECT_TRUE(std::isfinite(v) && v >= 0) << m.name << " " << v;
      if (m.name != "teacache.y") continue;
      // y: mean |v_k - v_{k-1}| / mean |v_{k-1}| of the branch's model output.
      const auto& v = outputs[m.branch];
      ASSERT_EQ(v.size(), static_cast<size_t>(kSteps));
      for (size_t k = 1; k < v.size() && k - 1 < m.values.size(); ++k) {
        double num = 0, den = 0;
        for (size_t i = 0; i < v[k].size(); ++i) {
          num += std::abs(double(v[k][i]) - v[k - 1][i]);
          den += std::abs(double(v[k - 1][i]));
        }
        EXPECT_DOUBLE_EQ(m.values[k - 1], num / den) << m.branch << " step " << k;
      }
    }
  }
  const std::map<std::string, int> want = {{"magcache.ratios.0", 1}, {"magcache.ratios.1", 1},
                                           {"teacache.x.0", 1},      {"teacache.x.1", 1},
                                           {"teacache.y.0", 1},      {"teacache.y.1", 1}};
  EXPECT_EQ(seen, want);
}

// Two requests in one process: the second never sees the first's state.
TEST(StepCacheIsolation, RequestsNeverShareState) {
  const test::KleinFixture f(DType::kF32);
  test::KleinFixture g(DType::kF32);
  for (float& v : g.noise) v = -v;
  for (const std::string& spec : kFiring) {
    const auto a = klein_run(f, KVMode::kCached, 6, {spec});
    klein_run(g, KVMode::kCached, 6, {spec});
    EXPECT_TRUE(same_bits(a, klein_run(f, KVMode::kCached, 6, {spec}))) << spec;
  }
}

}  // namespace
}  // namespace flowkv
