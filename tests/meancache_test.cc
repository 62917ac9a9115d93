// MeanCache, the loop-level step cache: its update rule and schedules against the reference
// code's own run on a synthetic velocity field (tests/golden/meancache, python/ref/
// dump_meancache.py), every step computed is bit-identical to no policy, it composes with the
// exact caches bit for bit, the calibrate mode's measurements give a schedule the policy takes,
// the schedule search itself, and the knobs' errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "cache/policy.h"
#include "families/family.h"
#include "fixtures.h"
#include "flowkv/calibrate.h"
#include "flowkv/error.h"
#include "flowkv/step_cache.h"
#include "temp_files.h"
#include "test_util.h"

namespace flowkv {
namespace {

using test::klein_run;
using test::qwen21_run;
using test::same_bits;

using cache::Composite;
using cache::StepContext;
using Json = nlohmann::json;

cache::Topology synthetic_topology() {
  cache::Topology t;
  t.model = "synthetic";
  t.tables = families::flux1_tables();  // what FLUX.2 and Qwen-Image-2.1 publish
  t.blocks = {{"blocks.0", "joint"}};
  return t;
}

std::vector<float> floats(const Json& j) {
  std::vector<float> out;
  for (const Json& v : j) out.push_back(static_cast<float>(v.get<double>()));
  return out;
}

std::string joined(const std::vector<int>& v) {
  std::string s;
  for (int x : v) s += (s.empty() ? "" : "/") + std::to_string(x);
  return s;
}

const Json& golden() {
  static const Json j = [] {
    std::ifstream f(FLOWKV_GOLDEN_DIR "/meancache/trajectories.json");
    EXPECT_TRUE(f.good()) << "tests/golden/meancache/trajectories.json";
    return Json::parse(f);
  }();
  return j;
}

// The reference's schedule of a case as a spec: its computed steps and, per computed step, the
// span of the interval it starts (the reference's edge_order at that step).
std::string spec_of(const Json& c) {
  std::vector<int> steps, spans;
  const std::vector<bool> compute = c["compute"].get<std::vector<bool>>();
  const std::vector<int> edge = c["edge_order"].get<std::vector<int>>();
  for (size_t k = 0; k < compute.size(); ++k) {
    if (compute[k]) steps.push_back(static_cast<int>(k)), spans.push_back(edge[k]);
  }
  return "meancache:schedule=" + joined(steps) + ",spans=" + joined(spans) +
         (c["cache_jvp"].get<bool>() ? "" : ",jvp=0");
}

struct Replay {
  std::string decisions;
  std::vector<std::vector<float>> v, x;  // per step: the velocity consumed, the latents after
};

// The reference's loop on the synthetic field, the policy deciding which steps run the field:
// v = ((a x + b) + c tt) + (d tt) tt at the timestep the reference's call saw, then
// x += (sigma_next - sigma) v, all in float32 in the reference's order.
Replay replay(const Json& c, const std::string& spec) {
  Composite p(cache::make_policies({spec}, synthetic_topology()));
  const std::vector<float> a = floats(c["a"]), b = floats(c["b"]), cc = floats(c["c"]),
                           d = floats(c["d"]), sig = floats(c["sigmas"]);
  std::vector<float> x = floats(c["x0"]);
  const int n = c["steps"].get<int>();
  const int64_t m = static_cast<int64_t>(x.size());
  std::vector<float> v(x.size());
  Replay r;
  for (int k = 0; k < n; ++k) {
    StepContext sc;
    sc.step = k, sc.num_steps = n, sc.cfg = true;
    sc.sigma = sig[static_cast<size_t>(k)], sc.sigma_next = sig[static_cast<size_t>(k) + 1];
    p.set_step(sc);
    if (p.run_step(sc)) {
      const Json& t = c["model_timestep"][static_cast<size_t>(k)];
      EXPECT_FALSE(t.is_null()) << "step " << k << " computes here, not in the reference";
      const float tt = t.is_null() ? 0.0f : static_cast<float>(t.get<double>());
      for (size_t e = 0; e < x.size(); ++e) {
        const float ax = a[e] * x[e];
        const float ct = cc[e] * tt;
        const float dt = d[e] * tt;
        v[e] = ((ax + b[e]) + ct) + dt * tt;
      }
    } else {
      p.fill_velocity(sc, x.data(), v.data(), m);
    }
    p.observe_step(sc, x.data(), v.data(), m);
    const float step = sig[static_cast<size_t>(k) + 1] - sig[static_cast<size_t>(k)];
    for (size_t e = 0; e < x.size(); ++e) x[e] = x[e] + step * v[e];
    r.v.push_back(v);
    r.x.push_back(x);
  }
  r.decisions = p.parts()[0]->stats().decisions;
  return r;
}

std::string flags(const Json& c) {
  std::string s;
  for (bool f : c["compute"].get<std::vector<bool>>()) s += f ? 'C' : 's';
  return s;
}

// The largest |a - b| / max(1, |b|) over a step's values.
double worst(const std::vector<float>& a, const std::vector<float>& b) {
  double w = 0;
  for (size_t i = 0; i < a.size(); ++i)
    w = std::max(w, std::fabs(double(a[i]) - b[i]) / std::max(1.0, std::fabs(double(b[i]))));
  return w;
}

// ---------------------------------------------------------------- against the reference

TEST(MeanCacheReference, TrajectoriesMatchTheReferenceCodeStepForStep) {
  const Json& g = golden();
  ASSERT_EQ(g["meta"]["commit"], "2e12280abfa9be521ad65c300ac50ad51f426e21");
  ASSERT_EQ(g["cases"].size(), 6u);
  int bit_exact = 0;
  for (const Json& c : g["cases"]) {
    const std::string name = c["name"].get<std::string>();
    const Replay r = replay(c, spec_of(c));
    EXPECT_EQ(r.decisions, flags(c)) << name;
    ASSERT_EQ(r.x.size(), c["x"].size()) << name;
    bool exact = true;
    for (size_t k = 0; k < r.x.size(); ++k) {
      const std::vector<float> want_v = floats(c["v"][k]), want_x = floats(c["x"][k]);
      EXPECT_LE(worst(r.v[k], want_v), 1e-6) << name << " velocity of step " << k;
      EXPECT_LE(worst(r.x[k], want_x), 1e-6) << name << " latents after step " << k;
      exact = exact && r.v[k] == want_v && r.x[k] == want_x;
    }
    bit_exact += exact;
  }
  // The update is elementwise float32 in the reference's order: no rounding differs.
  EXPECT_EQ(bit_exact, 6);
}

// The tables the families publish are the reference's: by name, the same decisions and the
// same trajectory as the case's own schedule.
TEST(MeanCacheReference, PublishedSchedulesAreTheReferenceTables) {
  for (const Json& c : golden()["cases"]) {
    if (!c["cache_jvp"].get<bool>()) continue;
    const std::string file = c["file"].get<std::string>();
    const std::string model =
        file.find("2512") != std::string::npos ? "qwen-image-2512" : "qwen-image";
    const std::string spec =
        "meancache:schedule=" + model + "-b" + std::to_string(c["budget"].get<int>());
    const Replay named = replay(c, spec), listed = replay(c, spec_of(c));
    EXPECT_EQ(named.decisions, flags(c)) << spec;
    EXPECT_EQ(named.x.back(), listed.x.back()) << spec;
  }
  // Every published schedule is well formed for 50 steps (the policy checks it when made).
  const cache::Topology t = synthetic_topology();
  int named = 0;
  for (const auto& [key, values] : t.tables) {
    if (key.rfind("meancache.schedule.", 0) != 0) continue;
    named++;
    EXPECT_EQ(values.back(), 49) << key;
    EXPECT_NO_THROW(cache::make_policies({"meancache:schedule=" + key.substr(19)}, t)) << key;
  }
  EXPECT_EQ(named, 11);  // Qwen-Image 3, Qwen-Image-2512 3, Z-Image 5
}

// Span 1 (the reference's v_diff_mean) reduces to the last velocity up to rounding; jvp=0
// reuses it exactly.
TEST(MeanCacheReference, SpanOneIsTheLastVelocityAndJvpOffReusesIt) {
  const Json& c = golden()["cases"][2];
  const Replay off = replay(c, "meancache:schedule=0/7/14/21/28/35/42/49,jvp=0");
  const Replay one = replay(c, "meancache:schedule=0/7/14/21/28/35/42/49,span=1");
  EXPECT_EQ(off.decisions, "CssssssCssssssCssssssCssssssCssssssCssssssCssssssC");
  for (int k = 1; k < 7; ++k) {
    EXPECT_EQ(off.v[static_cast<size_t>(k)], off.v[0]) << k;
    EXPECT_LE(worst(one.v[static_cast<size_t>(k)], one.v[0]), 1e-5) << k;
  }
}

// ---------------------------------------------------------------- inside the models

TEST(MeanCacheInModels, EveryStepComputedIsBitIdenticalToNoPolicy) {
  const test::KleinFixture k(DType::kF32);
  const auto plain = klein_run(k, KVMode::kCached, 6, {});
  for (const char* spec : {"meancache:budget=6", "meancache:budget=100",
                           "meancache:schedule=0/1/2/3/4/5", "meancache:calibrate=1"}) {
    std::vector<StepCacheStats> st;
    EXPECT_TRUE(same_bits(plain, klein_run(k, KVMode::kCached, 6, {spec}, &st))) << spec;
    EXPECT_EQ(st.at(0).decisions, "CCCCCC") << spec;
    EXPECT_EQ(st[0].calls_skipped, 0) << spec;
  }
  const test::Qwen21Fixture q(DType::kF32, 2);
  const auto qplain = qwen21_run(q, true, true, 5, {});
  EXPECT_TRUE(same_bits(qplain, qwen21_run(q, true, true, 5, {"meancache:budget=5"})));
  EXPECT_TRUE(same_bits(qplain, qwen21_run(q, true, true, 5, {"meancache:calibrate=1"})));
}

// Skipped steps run no model call and leave the memories alone: cached + policy equals
// recomputed + policy bit for bit, for Klein's reference cache and Qwen-Image-2.1's prefix.
TEST(MeanCacheInModels, ComposesWithTheExactCachesBitForBit) {
  const test::KleinFixture k(DType::kF32);
  for (const char* spec : {"meancache:budget=3", "meancache:schedule=0/1/4/7,spans=0/3/1",
                           "meancache:budget=4,jvp=0"}) {
    std::vector<StepCacheStats> st;
    const auto cached = klein_run(k, KVMode::kCached, 8, {spec}, &st);
    EXPECT_TRUE(same_bits(cached, klein_run(k, KVMode::kRecompute, 8, {spec}))) << spec;
    EXPECT_GT(st.at(0).calls_skipped, 0) << spec;
    EXPECT_FALSE(same_bits(cached, klein_run(k, KVMode::kCached, 8, {}))) << spec;
  }
  const test::Qwen21Fixture q(DType::kF32, 2);
  std::vector<StepCacheStats> st;
  const auto cached = qwen21_run(q, true, true, 8, {"meancache:budget=3"}, &st);
  EXPECT_TRUE(same_bits(cached, qwen21_run(q, false, true, 8, {"meancache:budget=3"})));
  // 8 steps, budget 3: steps 0, 4 (3.5 rounded up) and 7; both branches of a skipped step.
  EXPECT_EQ(st.at(0).decisions, "CsssCssC");
  EXPECT_EQ(st[0].calls_skipped, 2 * 5);
  EXPECT_EQ(st[0].calls_full, 2 * 3);
  // With another policy: a skipped step is skipped for it too.
  std::vector<StepCacheStats> two;
  const auto both = qwen21_run(q, true, true, 8, {"meancache:budget=3", "fora:interval=2"}, &two);
  EXPECT_TRUE(
      same_bits(both, qwen21_run(q, false, true, 8, {"meancache:budget=3", "fora:interval=2"})));
  EXPECT_EQ(two.at(1).decisions.size(), 2u * 3);  // fora saw only the computed steps' calls
}

// What the loop hands the Euler step on a skipped step is the reference's average velocity of
// the velocities and latents it consumed before (checked from outside, on Qwen-Image-2.1 with CFG:
// the guided velocity is what is cached).
TEST(MeanCacheInModels, SkippedStepsConsumeTheAverageVelocity) {
  const test::Qwen21Fixture q(DType::kF32, 1);
  Arena arena;
  test::LoopRequest r = q.request(true, true, 6, /*batch_cfg=*/false);
  r.opts.step_caches = {"meancache:schedule=0/1/5,spans=0/2"};
  std::vector<std::vector<float>> v, x = {q.noise};
  std::vector<bool> ran;
  r.observe = [&](int, const float* cond, const float*, const float* vel, const float* lat) {
    v.emplace_back(vel, vel + q.noise.size());
    x.emplace_back(lat, lat + q.noise.size());
    ran.push_back(cond != nullptr);
  };
  const auto res = test::run(arena, q.model, r);
  EXPECT_EQ(ran, (std::vector<bool>{true, true, false, false, false, true}));
  const std::vector<float>& s = res.schedule.sigmas;
  for (int k = 2; k <= 4; ++k) {  // span 2: from step k - 2
    const size_t j = static_cast<size_t>(k - 2), l = static_cast<size_t>(k - 1),
                 kk = static_cast<size_t>(k);
    const float denom = static_cast<float>(s[kk]) - static_cast<float>(s[j]);
    const float dt = static_cast<float>(s[kk + 1]) - static_cast<float>(s[kk]);
    for (size_t e = 0; e < q.noise.size(); ++e) {
      const float mean = (x[kk][e] - x[j][e]) / denom;
      const float jvp = (v[j][e] - mean) / denom;
      const float step = jvp * dt;
      ASSERT_EQ(v[kk][e], v[l][e] - step) << "step " << k << " element " << e;
    }
  }
}

// ---------------------------------------------------------------- calibration and search

TEST(MeanCacheCalibration, MeasuresEveryIntervalAndItsScheduleRuns) {
  const test::Qwen21Fixture q(DType::kF32, 1);
  constexpr int kSteps = 8;
  Arena arena;
  test::LoopRequest r = q.request(true, true, kSteps, /*batch_cfg=*/false);
  r.opts.step_caches = {"meancache:calibrate=1,max_gap=5,max_span=3"};
  std::vector<std::vector<float>> v, x = {q.noise};
  r.observe = [&](int, const float*, const float*, const float* vel, const float* lat) {
    v.emplace_back(vel, vel + q.noise.size());
    x.emplace_back(lat, lat + q.noise.size());
  };
  const auto res = test::run(arena, q.model, r);
  ASSERT_EQ(res.step_caches.size(), 1u);
  EXPECT_EQ(res.step_caches[0].decisions, std::string(kSteps, 'C'));
  ASSERT_EQ(res.step_caches[0].measured.size(), 1u);
  const std::vector<double>& m = res.step_caches[0].measured[0].values;
  ASSERT_EQ(m.size(), 3u + kSteps * 5 * 3);
  EXPECT_EQ(m[0], kSteps);
  EXPECT_EQ(m[1], 5);
  EXPECT_EQ(m[2], 3);

  const StepCacheCalibration cal = fit_step_caches({res.step_caches});
  const MeanCacheCosts& c = cal.meancache;
  EXPECT_EQ(c.series, 1);
  for (int i = 0; i < kSteps; ++i) {
    for (int g = 1; g <= 5; ++g) {
      for (int K = 1; K <= 3; ++K) {
        if (i + g >= kSteps) {
          EXPECT_EQ(c.at(i, g, K), -1) << i << " " << g << " " << K;
        } else if (g == 1) {
          EXPECT_EQ(c.at(i, g, K), 0);
        } else {
          EXPECT_GT(c.at(i, g, K), 0) << i << " " << g << " " << K;
        }
      }
    }
  }
  // By hand: compute step 2, skip step 3 with span 2 (from step 1), compare at step 4.
  const std::vector<float>& s = res.schedule.sigmas;
  auto f = [](float d) { return d; };
  double num = 0, den = 0;
  for (size_t e = 0; e < q.noise.size(); ++e) {
    const float mean = (x[3][e] - x[1][e]) / (f(s[3]) - f(s[1]));
    const float jvp = (v[1][e] - mean) / (f(s[3]) - f(s[1]));
    const float step = jvp * (f(s[4]) - f(s[3]));
    const float v3 = v[2][e] - step;
    const float x4 = x[3][e] + (f(s[4]) - f(s[3])) * v3;
    num += std::fabs(double(x4) - x[4][e]);
    den += std::fabs(double(x[4][e]));
  }
  EXPECT_DOUBLE_EQ(c.at(2, 2, 2), num / den);

  const MeanCacheSchedule sched = search_meancache_schedule(c, 4, 2.0);
  ASSERT_EQ(sched.compute.size(), 4u);
  EXPECT_EQ(sched.compute.front(), 0);
  EXPECT_EQ(sched.compute.back(), kSteps - 1);
  std::vector<StepCacheStats> st;
  qwen21_run(q, true, true, kSteps, {sched.spec()}, &st);
  std::string want(kSteps, 's');
  for (int k : sched.compute) want[static_cast<size_t>(k)] = 'C';
  EXPECT_EQ(st.at(0).decisions, want) << sched.spec();
}

MeanCacheCosts costs_of(int steps, int gap, int span, double fill) {
  MeanCacheCosts c;
  c.steps = steps, c.max_gap = gap, c.max_span = span, c.series = 1;
  c.cost.assign(static_cast<size_t>(steps * gap * span), fill);
  for (int i = 0; i < steps; ++i) {
    for (int g = 1; g <= gap; ++g) {
      for (int k = 1; k <= span; ++k) {
        double& v = c.cost[(static_cast<size_t>(i) * gap + g - 1) * span + k - 1];
        v = i + g >= steps ? -1 : g == 1 ? 0 : v;
      }
    }
  }
  return c;
}
void set_cost(MeanCacheCosts& c, int i, int j, int span, double v) {
  c.cost[(static_cast<size_t>(i) * c.max_gap + (j - i) - 1) * c.max_span + span - 1] = v;
}

// gamma > 1 prefers two middling intervals to one large one (the peak suppression).
TEST(MeanCacheCalibration, SearchSuppressesPeaksAndPicksTheBestSpan) {
  MeanCacheCosts c = costs_of(5, 4, 2, 5.0);
  set_cost(c, 0, 2, 2, 0.5), set_cost(c, 2, 4, 1, 0.5);  // 0 -> 2 -> 4
  set_cost(c, 1, 4, 1, 0.9);                             // 0 -> 1 -> 4
  set_cost(c, 0, 3, 2, 0.95);                            // 0 -> 3 -> 4
  const MeanCacheSchedule flat = search_meancache_schedule(c, 3, 1.0);
  EXPECT_EQ(flat.compute, (std::vector<int>{0, 1, 4}));
  EXPECT_EQ(flat.spans, (std::vector<int>{0, 1, 0}));
  EXPECT_DOUBLE_EQ(flat.cost, 0.9);
  const MeanCacheSchedule peaked = search_meancache_schedule(c, 3, 2.0);
  EXPECT_EQ(peaked.compute, (std::vector<int>{0, 2, 4}));
  EXPECT_EQ(peaked.spans, (std::vector<int>{2, 1, 0}));
  EXPECT_DOUBLE_EQ(peaked.cost, 0.5);
  EXPECT_DOUBLE_EQ(peaked.peak, 0.5);
  EXPECT_EQ(peaked.spec(), "meancache:schedule=0/2/4,spans=2/1/0");
  EXPECT_EQ(search_meancache_schedule(c, 9, 2.0).compute, (std::vector<int>{0, 1, 2, 3, 4}));
  EXPECT_THROW(search_meancache_schedule(c, 1, 2.0), Error);
  MeanCacheCosts narrow = costs_of(10, 3, 1, 0.1);  // at most 2 skipped in a row
  try {
    search_meancache_schedule(narrow, 3, 2.0);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("max_gap"), std::string::npos) << e.what();
  }
  EXPECT_EQ(search_meancache_schedule(narrow, 5, 2.0).compute.size(), 5u);
}

// `flowkv calibrate --policy meancache` on the tiny Klein pipeline prints a schedule spec per
// budget that the policy takes. The command line comes in FLOWKV_CLI (ctest sets it).
TEST(MeanCacheCalibration, CalibrateCommandPrintsSchedulesThePolicyTakes) {
  const char* cli = std::getenv("FLOWKV_CLI");
  if (cli == nullptr || *cli == '\0') GTEST_SKIP() << "FLOWKV_CLI not set";
  test::TempDir dir;
  const std::string json = dir.file("fit.json");
  const std::string cmd = "'" + std::string(cli) +
                          "' calibrate --model '" FLOWKV_GOLDEN_DIR
                          "/klein_pipeline/kv/pipeline' -p 'a cat' -p 'a fox' --size 32x32 "
                          "--steps 6 --policy meancache --budget 3 --budget 4 --json '" +
                          json + "' 2>&1";
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
  EXPECT_NE(out.find("meancache: 2 series averaged"), std::string::npos) << out;
  EXPECT_EQ(out.find("teacache"), std::string::npos) << out;
  const cache::Topology t = synthetic_topology();
  for (size_t i = 0; i < specs.size(); ++i) {
    EXPECT_EQ(specs[i].rfind("meancache:schedule=0/", 0), 0u) << specs[i];
    auto made = cache::make_policies({specs[i]}, t);
    Composite p(std::move(made));
    std::string d;
    std::vector<float> x(4, 1.0f), v(4, 0.5f);
    for (int k = 0; k < 6; ++k) {
      StepContext sc;
      sc.step = k, sc.num_steps = 6, sc.sigma = 1.0f - k / 6.0f,
      sc.sigma_next = 1.0f - (k + 1) / 6.0f;
      p.set_step(sc);
      if (!p.run_step(sc)) p.fill_velocity(sc, x.data(), v.data(), 4);
      p.observe_step(sc, x.data(), v.data(), 4);
    }
    const std::string decisions = p.parts()[0]->stats().decisions;
    EXPECT_EQ(std::count(decisions.begin(), decisions.end(), 'C'), 3 + static_cast<long>(i))
        << specs[i] << " " << decisions;
  }
  std::ifstream f(json);
  const Json j = Json::parse(f);
  ASSERT_EQ(j["meancache"]["schedules"].size(), 2u);
  EXPECT_EQ(j["meancache"]["schedules"][0]["spec"], specs[0]);
  EXPECT_EQ(j["meancache"]["schedules"][1]["budget"], 4);
}

// ---------------------------------------------------------------- knobs

std::string error_of(const std::string& spec, int steps = 8) {
  try {
    Composite p(cache::make_policies({spec}, synthetic_topology()));
    StepContext sc;
    sc.num_steps = steps;
    p.set_step(sc);
    p.run_step(sc);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(MeanCacheKnobs, ErrorsNameTheProblem) {
  auto expect = [](const std::string& spec, const std::string& part, int steps = 8) {
    const std::string e = error_of(spec, steps);
    EXPECT_NE(e.find(part), std::string::npos) << spec << ": '" << e << "'";
  };
  expect("meancache:schedule=1/2/7", "starts with step 0");
  expect("meancache:schedule=0/3/2/7", "must ascend");
  expect("meancache:schedule=0/3/7,spans=0/1", "span 0 after step 0 but steps 1..2 are skipped");
  expect("meancache:schedule=0/3/7,spans=1", "1 spans for 3 computed steps");
  expect("meancache:schedule=0/3/7,spans=1/1/1/1", "4 spans for 3 computed steps");
  expect("meancache:schedule=0/2.5/7", "not an integer");
  expect("meancache:schedule=0/3/7,spans=1/17", "not an integer in [0, 16]");
  expect("meancache:schedule=0/3/7,budget=4", "budget=4 but the schedule computes 3 steps");
  expect("meancache:spans=1/2", "spans= goes with a schedule");
  expect("meancache:schedule=qwen-image-b10,spans=1", "brings its own spans");
  expect("meancache:schedule=flux-b3",
         "no schedule named 'flux-b3' (published: qwen-image-2512-b10");
  expect("meancache:calibrate=1,budget=3", "takes no schedule");
  expect("meancache:max_gap=4", "go with calibrate=1");
  expect("meancache:calibrate=1,max_gap=1", "max_gap=1 is outside [2, 100]");
  expect("meancache:span=0", "span=0 is outside [1, 16]");
  expect("meancache:budget=0", "budget=0 is outside [1, 100000]");
  expect("meancache:jvp=maybe", "is not true/false");
  expect("meancache:treshold=1", "has no option 'treshold'");
  // Checked when the request's step count is known.
  expect("meancache:schedule=0/3/7", "last computed step is 7 but this run has 28 steps", 28);
  expect("meancache:schedule=qwen-image-b10", "last computed step is 49 but this run has 8", 8);
  expect("meancache:budget=1", "the budget is at least 2");
  EXPECT_EQ(error_of("meancache:budget=1", 1), "");
  EXPECT_EQ(error_of("meancache:schedule=0/3/7"), "");
  EXPECT_EQ(error_of("meancache"), "");
  // Without a model (check_step_caches before one is loaded) a table name is left to the
  // request; everything else is checked.
  EXPECT_NO_THROW(check_step_caches({"meancache:schedule=qwen-image-b10"}));
  EXPECT_THROW(check_step_caches({"meancache:schedule=0/2/1"}), Error);
  EXPECT_THROW(check_step_caches({"meancache:calibrate=1,schedule=0/1"}), Error);
}

}  // namespace
}  // namespace flowkv
