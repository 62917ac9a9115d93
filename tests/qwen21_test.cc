// Qwen-Image-2.1's prefix cache: the denoise loop against QwenImage21Pipeline (CFG, fixed
// sigma grid), cached vs uncached bit-identical over many steps, the cacheability rules, the
// budget, and the published cost figures.
#include <gtest/gtest.h>

#include "cost/cost_model.h"
#include "fixtures.h"
#include "flowkv/error.h"
#include "golden_util.h"
#include "models/common/random_weights.h"
#include "models/qwen_image/builtin.h"
#include "models/qwen_image/model21.h"
#include "pipeline/qwen21.h"
#include "segments/layout.h"

namespace flowkv {
namespace {

using pipeline::Qwen21Request;

std::vector<uint8_t> bytes_of(const Tensor& t) {
  std::vector<uint8_t> v;
  for (int64_t i = 0; i < t.numel(); ++i) v.push_back(t.f32()[i] != 0);
  return v;
}

// ---------------------------------------------------------------- diffusers pipeline parity

void run_pipeline_case(const std::string& name, bool cfg) {
  const test::GoldenCase c("qwen_image21/" + name);
  const auto& in = c.in;
  const auto& dump = c.dump;
  const Json& meta = c.meta;
  qwen::LoadOptions21 o;
  o.auto_dtype = false;
  const qwen::Model21 m = qwen::Model21::load(test::golden("qwen_image21/refs/transformer"), o);
  Qwen21Request r;
  const std::vector<uint8_t> slots = bytes_of(in.at("image_pad_mask")),
                             valid = bytes_of(in.at("prompt_embeds_mask"));
  r.prompt = {in.at("prompt_embeds").f32(), in.at("prompt_embeds").dim(1), slots.data(),
              valid.data()};
  std::vector<uint8_t> nslots, nvalid;
  if (cfg) {
    nslots = bytes_of(in.at("negative_image_pad_mask"));
    nvalid = bytes_of(in.at("negative_prompt_embeds_mask"));
    r.negative = {in.at("negative_prompt_embeds").f32(), in.at("negative_prompt_embeds").dim(1),
                  nslots.data(), nvalid.data()};
    r.cfg_scale = meta.at("true_cfg_scale").get<float>();
  }
  const Tensor& shapes = in.at("img_shapes");
  for (int64_t i = 0; i + 1 < shapes.dim(0); ++i) {
    r.cond_grids.push_back({static_cast<int64_t>(shapes.f32()[i * 3 + 1]),
                            static_cast<int64_t>(shapes.f32()[i * 3 + 2])});
  }
  const int64_t last = shapes.dim(0) - 1;
  r.target = {static_cast<int64_t>(shapes.f32()[last * 3 + 1]),
              static_cast<int64_t>(shapes.f32()[last * 3 + 2])};
  r.cond = in.at("cond_latents").f32();
  r.noise = in.at("latents").f32();
  const auto cfg_json = meta.at("scheduler_config");
  r.scheduler.use_dynamic_shifting = cfg_json.at("use_dynamic_shifting").get<bool>();
  r.scheduler.shift = cfg_json.at("shift").get<double>();
  r.scheduler.shift_terminal =
      cfg_json.at("shift_terminal").is_null() ? 0.0 : cfg_json.at("shift_terminal").get<double>();
  r.sigmas = meta.at("sigmas_passed").get<std::vector<double>>();
  std::map<std::string, Tensor> got;
  const int64_t n = r.target.tokens() * m.config().in_channels;
  const Shape shape{1, r.target.tokens(), m.config().in_channels};
  r.observe = [&](int k, const float* c, const float* u, const float* v, const float* x) {
    const std::string p = "step." + std::to_string(k) + ".";
    if (u) {
      got[p + "cond_output"] = Tensor::from_vector(std::vector<float>(c, c + n), shape);
      got[p + "uncond_output"] = Tensor::from_vector(std::vector<float>(u, u + n), shape);
    }
    got[p + "noise_pred"] = Tensor::from_vector(std::vector<float>(v, v + n), shape);
    got[p + "latents"] = Tensor::from_vector(std::vector<float>(x, x + n), shape);
  };
  Arena arena;
  const auto res = pipeline::run_qwen21({&arena}, m, r);
  EXPECT_NEAR(res.mu, meta.at("mu").get<double>(), 1e-12);
  EXPECT_EQ(res.cfg, cfg);
  for (int64_t i = 0; i < dump.at("sigmas").numel(); ++i)
    EXPECT_EQ(res.schedule.sigmas[i], dump.at("sigmas").f32()[i]) << i;
  for (size_t k = 0; k < res.schedule.timesteps.size(); ++k) {
    EXPECT_EQ(res.schedule.timesteps[k], dump.at("timesteps").f32()[k]);
    got["step." + std::to_string(k) + ".timestep"] =
        Tensor::from_vector({sched::model_timestep(res.schedule.timesteps[k], false)}, {1});
  }
  test::expect_matches_dump(got, dump, c.order, "step.", 1e-5);
}

TEST(Qwen21Pipeline, TwoStepCfgWithOneCachePerBranchMatchesDiffusers) {
  run_pipeline_case("pipeline_cfg", true);
}
TEST(Qwen21Pipeline, FixedSampleSigmasGridMatchesDiffusers) {
  run_pipeline_case("pipeline_sample_sigmas", false);
}

// ---------------------------------------------------------------- exactness

using Fixture = test::Qwen21Fixture;

void expect_bit_exact(DType dt, int refs, bool cfg, bool batch_cfg) {
  const Fixture f(dt, refs);
  Arena arena;
  const auto cached = pipeline::run_qwen21({&arena}, f.model, f.request(true, cfg, 6, batch_cfg));
  const auto uncached =
      pipeline::run_qwen21({&arena}, f.model, f.request(false, cfg, 6, batch_cfg));
  EXPECT_GT(cached.kv_bytes, 0);
  EXPECT_EQ(uncached.kv_bytes, 0);
  EXPECT_EQ(cached.batched_cfg, cfg && batch_cfg);
  EXPECT_TRUE(test::bit_equal(cached.latents.data(), uncached.latents.data(),
                              static_cast<int64_t>(cached.latents.size())))
      << dtype_name(dt) << " refs " << refs << " cfg " << cfg << " batched " << batch_cfg;
}

TEST(Qwen21Exactness, CachedEqualsUncachedBitForBitF32) {
  for (int refs : {0, 1, 2}) expect_bit_exact(DType::kF32, refs, false, false);
}
TEST(Qwen21Exactness, CachedEqualsUncachedBitForBitBf16) {
  for (int refs : {0, 2}) expect_bit_exact(DType::kBF16, refs, false, false);
}
TEST(Qwen21Exactness, CachedEqualsUncachedWithCfgBatchedAndSeparate) {
  expect_bit_exact(DType::kF32, 2, true, true);
  expect_bit_exact(DType::kF32, 2, true, false);
  expect_bit_exact(DType::kBF16, 1, true, true);
}

TEST(Qwen21Exactness, BranchesKeepSeparateCaches) {
  // CFG doubles the cache: one per branch, each holding its own prompt's prefix.
  const Fixture f(DType::kF32, 1);
  const int64_t one = pipeline::planned_kv_bytes(f.model, f.request(true, false, 3));
  const int64_t two = pipeline::planned_kv_bytes(f.model, f.request(true, true, 3));
  EXPECT_EQ(two, 2 * one);
  Arena arena;
  EXPECT_EQ(pipeline::run_qwen21({&arena}, f.model, f.request(true, true, 2, false)).kv_bytes, two);
}

// ---------------------------------------------------------------- rules, budget, cost

TEST(Qwen21Rules, PrefixIsCacheableOnlyUnderCausalCondition) {
  const std::vector<uint8_t> slots = {0, 0, 1, 1, 0, 0};
  const qwen::Layout21 l = qwen::build_layout21(6, slots.data(), {{2, 4}}, {4, 4});
  const TokenLayout with = qwen::token_layout21(l, true), without = qwen::token_layout21(l, false);
  const Cacheability a = check_cacheable(with), b = check_cacheable(without);
  for (size_t i = 0; i + 1 < with.segments.size(); ++i) {
    EXPECT_TRUE(a.cacheable[i]) << with.segments[i].name;
    EXPECT_FALSE(b.cacheable[i]) << without.segments[i].name;
  }
  EXPECT_FALSE(a.cacheable.back());  // the target
  EXPECT_NE(b.broken[0][0].find("current timestep"), std::string::npos);
}

TEST(Qwen21Rules, BudgetTooSmallIsRefusedBeforeTheRun) {
  const Fixture f(DType::kF32, 2);
  Qwen21Request r = f.request(true, true, 3);
  const int64_t need = pipeline::planned_kv_bytes(f.model, r);
  r.kv_budget_bytes = need - 1;
  int steps = 0;
  r.on_step = [&](int, int) { ++steps; };
  Arena arena;
  try {
    (void)pipeline::run_qwen21({&arena}, f.model, r);
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(std::to_string(need) + " bytes"), std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("one cache per CFG branch"), std::string::npos);
  }
  EXPECT_EQ(steps, 0);
}

TEST(Qwen21Cost, ReproducesThePublishedPrefixPayload) {
  // Qwen-Image-2.1 as released: 32 layers x 4096, a 4,246-token prefix (a 54 x 78 reference and
  // 34 text tokens) at 1024x1024: 2.073 GiB in bf16, doubled with CFG.
  qwen::Config21 c;
  const cost::ModelShape shape{c.dim(), c.num_layers, c.mlp_hidden(), 2};
  const double gib = double(1 << 30);
  EXPECT_NEAR(cost::kv_payload_bytes(shape, 4246) / gib, 2.073, 2.073e-3);
  EXPECT_NEAR(cost::kv_payload_bytes(shape, 4246, 2) / gib, 4.146, 4.146e-3);
  EXPECT_EQ(54 * 78 + 34, 4246);
}

}  // namespace
}  // namespace flowkv
