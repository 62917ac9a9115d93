// The exact reference KV cache of FLUX.2 Klein 9B KV (test ladder level 4 and 6): the denoise
// loop against diffusers' Flux2KleinKVPipeline, cached vs recompute bit-identical, zero drift of
// the references' K/V across steps, no aliasing across layers, the cacheability rules, the
// budget, and the cost model against the published figures.
#include <gtest/gtest.h>

#include <cmath>

#include "cost/cost_model.h"
#include "families/flux2/cost.h"
#include "fixtures.h"
#include "flowkv/error.h"
#include "golden_util.h"
#include "models/flux2/builtin.h"
#include "models/flux2/layout.h"
#include "models/flux2/model.h"
#include "sched/flow_match.h"
#include "segments/layout.h"

namespace flowkv {
namespace {

using test::LoopRequest;

// ---------------------------------------------------------------- scheduler (spec §5.6-5.8)

TEST(Scheduler, WorkedExamplesOfTheSpec) {
  struct Row {
    int64_t seq;
    double mu;
    std::vector<float> sigmas;
  };
  for (const Row& row : {Row{4096, 2.2911798941, {1.0f, 0.96738404f, 0.90814394f, 0.76719993f}},
                         Row{1024, 2.0306897079, {1.0f, 0.95808536f, 0.88398188f, 0.71749657f}}}) {
    const double mu = sched::empirical_mu(row.seq, 4);
    EXPECT_NEAR(mu, row.mu, 1e-9);
    const sched::Schedule s =
        sched::set_timesteps(sched::flux2_scheduler_config(), sched::linspace_sigmas(4), mu);
    ASSERT_EQ(s.sigmas.size(), 5u);
    for (int i = 0; i < 4; ++i) EXPECT_FLOAT_EQ(s.sigmas[i], row.sigmas[i]) << i;
    EXPECT_EQ(s.sigmas[4], 0.0f);
  }
  EXPECT_NEAR(sched::empirical_mu(4080, 4), 2.2898231744, 1e-9);
  EXPECT_NEAR(sched::empirical_mu(4096, 50), 2.0233511571, 1e-9);
}

TEST(Scheduler, Bf16TimestepRoundingOfTheSpec) {
  // t_model = bf16(bf16(bf16(t)/1000)*1000) for 1024^2, 4 steps (spec §5.7).
  const float ts[] = {1000.0f, 967.384f, 908.144f, 767.2f}, want[] = {1000, 968, 908, 768};
  for (int i = 0; i < 4; ++i) {
    const float model_in = sched::model_timestep(ts[i], /*bf16=*/true);
    EXPECT_EQ(round_bf16(round_bf16(model_in) * 1000.0f), want[i]) << ts[i];
  }
}

// ---------------------------------------------------------------- diffusers pipeline parity

TEST(KleinKvPipeline, TwoStepDenoiseMatchesDiffusers) {
  const test::GoldenCase c("flux2/klein_kv_pipeline");
  const std::string& dir = c.dir;
  const auto& in = c.in;
  const auto& dump = c.dump;
  const Json& meta = c.meta;
  flux2::LoadOptions o;
  o.auto_dtype = false;
  const flux2::Model m = flux2::Model::load(dir + "/transformer", o);

  const int64_t C = m.config().in_channels;
  LoopRequest r;
  r.in.prompt.embeds = in.at("prompt_embeds");
  r.in.noise = in.at("latents");
  r.in.height = r.in.width = 4;
  const float* ref = in.at("ref_latents").f32();
  int64_t off = 0;
  for (const Json& g : meta.at("ref_grids_hw")) {
    const int64_t h = g[0].get<int64_t>(), w = g[1].get<int64_t>();
    const std::vector<float> v(ref + off * C, ref + (off + h * w) * C);
    r.in.references.push_back({Tensor::from_vector(v, {1, h * w, C}), h, w});
    off += h * w;
  }
  r.opts.steps = meta.at("num_inference_steps").get<int>();
  std::map<std::string, Tensor> got;
  r.observe = [&](int k, const float* v, const float*, const float*, const float* x) {
    const std::string p = "step." + std::to_string(k) + ".";
    got[p + "model_output"] = Tensor::from_vector(std::vector<float>(v, v + 64), {1, 16, 4});
    got[p + "latents"] = Tensor::from_vector(std::vector<float>(x, x + 64), {1, 16, 4});
  };
  Arena arena;
  const auto res = test::run(arena, m, r);
  EXPECT_NEAR(res.mu, meta.at("mu").get<double>(), 1e-12);
  const Tensor& sig = dump.at("sigmas");
  ASSERT_EQ(sig.numel(), static_cast<int64_t>(res.schedule.sigmas.size()));
  for (int64_t i = 0; i < sig.numel(); ++i) EXPECT_EQ(res.schedule.sigmas[i], sig.f32()[i]) << i;
  for (int k = 0; k < r.opts.steps; ++k) {
    EXPECT_EQ(dump.at("timesteps").f32()[k], res.schedule.timesteps[k]);
    const float t = sched::model_timestep(res.schedule.timesteps[k], false);
    got["step." + std::to_string(k) + ".timestep"] = Tensor::from_vector({t}, {1});
  }
  test::expect_matches_dump(got, dump, c.order, "step.", 1e-5);
}

// ---------------------------------------------------------------- exactness

using Fixture = test::KleinFixture;

void expect_cached_equals_recompute(DType dtype) {
  const Fixture f(dtype);
  Arena arena;
  const auto cached = test::run(arena, f.model, f.request(KVMode::kCached, 6));
  const auto recompute = test::run(arena, f.model, f.request(KVMode::kRecompute, 6));
  ASSERT_EQ(cached.latents.size(), recompute.latents.size());
  EXPECT_TRUE(test::bit_equal(cached.latents.data(), recompute.latents.data(),
                              static_cast<int64_t>(cached.latents.size())))
      << dtype_name(dtype);
  EXPECT_GT(cached.kv_bytes, 0);
  EXPECT_EQ(recompute.kv_bytes, 0);
}

TEST(KleinKvExactness, CachedAndRecomputeAreBitIdenticalF32) {
  expect_cached_equals_recompute(DType::kF32);
}
TEST(KleinKvExactness, CachedAndRecomputeAreBitIdenticalBf16) {
  expect_cached_equals_recompute(DType::kBF16);
}

// The references' K/V recomputed at any step (any timestep, any target latents) equal the
// ones stored at step 0, bit for bit, in every layer; and no two layers hold the same K/V.
TEST(KleinKvExactness, ReferenceKvHasZeroDriftAndNoAliasing) {
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    const Fixture f(dtype);
    const flux2::Model& m = f.model;
    const int64_t R = 12 + 10, N = f.h * f.w;
    std::vector<float> ids(static_cast<size_t>(R * 4), 0.0f),
        img_ids(static_cast<size_t>(N * 4), 0.0f), txt_ids(static_cast<size_t>(f.L * 4), 0.0f),
        refs(static_cast<size_t>(f.B * R * f.cfg.in_channels));
    for (int64_t i = 0; i < R; ++i) ids[i * 4] = i < 12 ? 10 : 20, ids[i * 4 + 1] = float(i % 4);
    for (int64_t i = 0; i < N; ++i)
      img_ids[i * 4 + 1] = float(i / f.w), img_ids[i * 4 + 2] = float(i % f.w);
    flux2::fill_normal(refs.data(), refs.size(), 15);
    std::vector<float> out(static_cast<size_t>(f.B * N * f.cfg.out_features()));
    auto extract = [&](float t, uint64_t seed) {
      auto mem = std::make_unique<KVMemory>(m.kv_layers(), f.B, R, m.kv_width(), m.kv_dtype());
      std::vector<float> x(f.noise.size()), ts(static_cast<size_t>(f.B), t);
      flux2::fill_normal(x.data(), x.size(), seed);
      flux2::ForwardArgs a;
      a.batch = f.B;
      a.segments = {
          {.kind = SegmentKind::kText,
           .name = "text",
           .rows = f.text.data(),
           .tokens = f.L,
           .ids = txt_ids.data()},
          {.kind = SegmentKind::kReference,
           .name = "refs",
           .rows = refs.data(),
           .tokens = R,
           .ids = ids.data(),
           .time = {.fixed = true, .timestep = 0.0f},
           .kv = {.route = KVRoute::kComputeAndStore, .store = mem.get()}},
          {.kind = SegmentKind::kTarget,
           .name = "target",
           .rows = x.data(),
           .tokens = N,
           .ids = img_ids.data()},
      };
      a.timestep = ts.data();
      a.out = out.data();
      Arena arena;
      m.forward({&arena}, a);
      return mem;
    };
    const auto step0 = extract(0.97f, 100);
    for (auto [t, seed] : {std::pair{0.61f, 101ull}, std::pair{0.05f, 102ull}}) {
      const auto later = extract(t, seed);
      for (int64_t l = 0; l < m.kv_layers(); ++l) {
        const Tensor k0 = step0->keys(l), k1 = later->keys(l), v0 = step0->values(l),
                     v1 = later->values(l);
        ASSERT_TRUE(test::bit_equal(k0.f32(), k1.f32(), k0.numel())) << "K drift, layer " << l;
        ASSERT_TRUE(test::bit_equal(v0.f32(), v1.f32(), v0.numel())) << "V drift, layer " << l;
      }
    }
    for (int64_t a = 0; a < m.kv_layers(); ++a) {
      for (int64_t b = a + 1; b < m.kv_layers(); ++b) {
        const Tensor ka = step0->keys(a), kb = step0->keys(b);
        EXPECT_FALSE(test::bit_equal(ka.f32(), kb.f32(), ka.numel()))
            << "layers " << a << ", " << b;
        EXPECT_GT(test::compare(ka.f32(), kb.f32(), ka.numel()).max_abs, 1e-3);
      }
    }
  }
}

TEST(KleinKvExactness, WorkspaceStopsGrowingAfterThePrefillStep) {
  const Fixture f(DType::kF32);
  Arena arena;
  LoopRequest r = f.request(KVMode::kCached, 5);
  std::vector<int64_t> grows;
  r.opts.on_step = [&](int, int) { grows.push_back(arena.grow_count()); };
  (void)test::run(arena, f.model, r);
  ASSERT_EQ(grows.size(), 5u);
  for (size_t i = 1; i < grows.size(); ++i) EXPECT_EQ(grows[i], grows[0]) << "grew at step " << i;
}

// ---------------------------------------------------------------- rules and budget

TEST(KleinKvRules, OnlyReferencesAreCacheable) {
  const TokenLayout l = flux2::klein_kv_layout(512, {2816, 1024}, 4096);
  const Cacheability c = check_cacheable(l);
  EXPECT_FALSE(c.cacheable[0]);  // text
  EXPECT_TRUE(c.cacheable[1]);
  EXPECT_TRUE(c.cacheable[2]);
  EXPECT_FALSE(c.cacheable[3]);  // target
}

TEST(KleinKvRules, CachingTextExactlyIsRefusedNamingTheRules) {
  const Fixture f(DType::kF32);
  LoopRequest r = f.request(KVMode::kCached, 3);
  r.opts.cache_text = true;
  Arena arena;
  try {
    (void)test::run(arena, f.model, r);
    ADD_FAILURE() << "text was cached exactly";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("cannot cache 'text' exactly"), std::string::npos) << msg;
    EXPECT_NE(msg.find("current timestep"), std::string::npos) << msg;
    EXPECT_NE(msg.find("attends to 'target'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("text-kv-approx"), std::string::npos) << msg;
  }
  // The named approximation is allowed, marked approximate, and really differs.
  r.opts.cache_text = false;
  r.opts.text_kv_approx = true;
  const auto approx = test::run(arena, f.model, r);
  EXPECT_TRUE(approx.approximate);
  const auto exact = test::run(arena, f.model, f.request(KVMode::kCached, 3));
  EXPECT_GT(
      test::compare(approx.latents.data(), exact.latents.data(), exact.latents.size()).max_abs,
      1e-4);
}

TEST(KleinKvRules, BudgetTooSmallIsRefusedBeforeTheRun) {
  const Fixture f(DType::kF32);
  LoopRequest r = f.request(KVMode::kCached, 3);
  const int64_t need = test::planned_kv_bytes(f.model, r);
  EXPECT_EQ(need, 2 * f.model.kv_layers() * f.B * 22 * f.model.kv_width() * 4);
  r.opts.kv_budget_bytes = need - 1;
  int steps_run = 0;
  r.opts.on_step = [&](int, int) { ++steps_run; };
  Arena arena;
  try {
    (void)test::run(arena, f.model, r);
    ADD_FAILURE() << "over budget but ran";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(std::to_string(need) + " bytes"), std::string::npos)
        << e.what();
    // The library names its options; command-line flags are the CLI's to say.
    EXPECT_EQ(std::string(e.what()).find("--"), std::string::npos) << e.what();
  }
  EXPECT_EQ(steps_run, 0);
  r.opts.kv_budget_bytes = need;
  EXPECT_EQ(test::run(arena, f.model, r).kv_bytes, need);
}

// ---------------------------------------------------------------- cost model

TEST(CostModel, ReproducesThePublishedKlein9bFigures) {
  flux2::Config c;
  ASSERT_TRUE(flux2::released_config("klein-9b-kv", &c));
  const cost::ModelShape shape = flux2::cost_shape(c, 2);
  const int64_t ref = 64 * 44;  // one 1024x704 reference
  const TokenLayout one = flux2::klein_kv_layout(512, {ref}, 4096);
  const double uncached = cost::step_cost(shape, one, {false, false, false}).total();
  const double cached = cost::step_cost(shape, one, {false, true, false}).total();
  EXPECT_NEAR(uncached / 1e12, 125.7, 0.05);
  EXPECT_NEAR(cached / 1e12, 82.3, 0.05);
  const double gib = double(1 << 30);
  EXPECT_NEAR(cost::kv_payload_bytes(shape, ref) / gib, 1.375, 1.375e-3);
  EXPECT_NEAR(cost::kv_payload_bytes(shape, 3 * ref) / gib, 4.125, 4.125e-3);
  EXPECT_NEAR(cost::kv_payload_bytes(shape, 3 * ref, /*branches=*/2) / gib, 8.25, 8.25e-3);
  EXPECT_NEAR(cost::predicted_speedup(uncached, cached, 1), 1.0, 1e-12);
}

}  // namespace
}  // namespace flowkv
