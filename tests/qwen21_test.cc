// Qwen-Image-2.1's prefix cache: the denoise loop against QwenImage21Pipeline (CFG, fixed
// sigma grid), cached vs uncached bit-identical over many steps, the cacheability rules, the
// budget, and the published cost figures.
#include <gtest/gtest.h>

#include <set>

#include "cache/hooks.h"
#include "cache/kv_memory.h"
#include "cost/cost_model.h"
#include "families/qwen21/impl.h"
#include "fixtures.h"
#include "flowkv/error.h"
#include "flowkv/qwen_image.h"
#include "golden_util.h"
#include "models/common/random_weights.h"
#include "models/qwen_image/builtin.h"
#include "models/qwen_image/model21.h"
#include "sched/scheduler_config.h"
#include "segments/layout.h"

namespace flowkv {
namespace {

using test::LoopRequest;

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
  LoopRequest r;
  r.in.prompt = {in.at("prompt_embeds"), bytes_of(in.at("image_pad_mask")),
                 in.at("prompt_embeds_mask")};
  if (cfg) {
    r.in.negative = {in.at("negative_prompt_embeds"), bytes_of(in.at("negative_image_pad_mask")),
                     in.at("negative_prompt_embeds_mask")};
    r.in.cfg_scale = meta.at("true_cfg_scale").get<float>();
  }
  const Tensor& shapes = in.at("img_shapes");
  const Tensor& cond = in.at("cond_latents");
  const int64_t C = m.config().in_channels;
  for (int64_t i = 0, off = 0; i + 1 < shapes.dim(0); ++i) {
    const int64_t h = static_cast<int64_t>(shapes.f32()[i * 3 + 1]),
                  w = static_cast<int64_t>(shapes.f32()[i * 3 + 2]);
    const std::vector<float> v(cond.f32() + off * C, cond.f32() + (off + h * w) * C);
    r.in.references.push_back({Tensor::from_vector(v, {1, h * w, C}), h, w});
    off += h * w;
  }
  const int64_t last = shapes.dim(0) - 1;
  const qwen::Grid target{static_cast<int64_t>(shapes.f32()[last * 3 + 1]),
                          static_cast<int64_t>(shapes.f32()[last * 3 + 2])};
  r.in.height = target.h;
  r.in.width = target.w;
  r.in.noise = in.at("latents");
  // The pipeline's scheduler config, every field, read as a folder's scheduler_config.json.
  const sched::FlowMatchConfig scheduler =
      sched::scheduler_config_from_json(meta.at("scheduler_config"), name + "/meta.json");
  r.opts.sigmas = meta.at("sigmas_passed").get<std::vector<double>>();
  r.opts.steps = static_cast<int>(r.opts.sigmas.size());
  std::map<std::string, Tensor> got;
  const int64_t n = target.tokens() * m.config().in_channels;
  const Shape shape{1, target.tokens(), m.config().in_channels};
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
  pipeline::LoopOptions loop = r.loop();
  loop.scheduler = scheduler;
  const auto res =
      pipeline::run_denoise({&arena}, *families::qwen21_adapter(m, r.in, r.opts), loop);
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
  const auto cached = test::run(arena, f.model, f.request(true, cfg, 6, batch_cfg));
  const auto uncached = test::run(arena, f.model, f.request(false, cfg, 6, batch_cfg));
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
  const int64_t one = test::planned_kv_bytes(f.model, f.request(true, false, 3));
  const int64_t two = test::planned_kv_bytes(f.model, f.request(true, true, 3));
  EXPECT_EQ(two, 2 * one);
  Arena arena;
  EXPECT_EQ(test::run(arena, f.model, f.request(true, true, 2, false)).kv_bytes, two);
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
  LoopRequest r = f.request(true, true, 3);
  const int64_t need = test::planned_kv_bytes(f.model, r);
  r.opts.kv_budget_bytes = need - 1;
  int steps = 0;
  r.opts.on_step = [&](int, int) { ++steps; };
  Arena arena;
  try {
    (void)test::run(arena, f.model, r);
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

// ---------------------------------------------------------------- the forward

// The fixture's sequence as the model takes it: [text, conditions..., target], the prefix (text
// and conditions: one memory) travelling by `prefix`.
qwen::Args21 args_of(const Fixture& f, const qwen::Model21& m, const float* timestep, float* out,
                     SegmentKV prefix = {}) {
  qwen::Args21 a;
  a.batch = f.B;
  const int64_t L = static_cast<int64_t>(f.slots.size()), C = f.cfg.in_channels;
  a.segments.push_back({.kind = SegmentKind::kText,
                        .name = "text",
                        .rows = f.text.data(),
                        .tokens = L,
                        .slots = f.slots.data(),
                        .valid = f.valid.data(),
                        .time = m.prefix_time(),
                        .kv = prefix});
  int64_t n_cond = 0, off = 0;
  for (const auto& g : f.conds) n_cond += g.tokens();
  for (size_t i = 0; i < f.conds.size(); ++i) {
    a.segments.push_back({.kind = SegmentKind::kReference,
                          .name = "condition " + std::to_string(i + 1),
                          .rows = f.cond.data() + off * C,
                          .tokens = f.conds[i].tokens(),
                          .batch_rows = n_cond,
                          .grid = f.conds[i],
                          .time = m.prefix_time(),
                          .kv = {.route = prefix.route}});
    off += f.conds[i].tokens();
  }
  a.segments.push_back({.kind = SegmentKind::kTarget,
                        .name = "target",
                        .rows = f.noise.data(),
                        .tokens = f.target.tokens(),
                        .grid = f.target});
  a.timestep = timestep;
  a.out = out;
  return a;
}

// The same sequence as the public call takes it.
Qwen21Call call_of(const Fixture& f, const Tensor& timestep) {
  const LoopRequest r = f.request(false, false, 1);
  Qwen21Call call;
  call.img = r.in.noise;
  call.height = r.in.height, call.width = r.in.width;
  call.txt = r.in.prompt.embeds;
  call.txt_slots = r.in.prompt.slots;
  call.txt_mask = r.in.prompt.mask;
  call.conditions = r.in.references;
  call.timestep = timestep;
  return call;
}

TEST(Qwen21Forward, PublicForwardEqualsTheModelForwardBitForBit) {
  const Fixture f(DType::kF32, 2);
  const QwenImage21Transformer t = QwenImage21Transformer::builtin("qwen21-tiny", 3, "f32");
  const qwen::Model21& m = t.impl().model;
  const Tensor ts = Tensor::from_vector({0.7f, 0.4f}, {2});
  ForwardProfile profile;
  const Tensor got = t.forward(call_of(f, ts), &profile);
  ASSERT_EQ(got.shape(), (Shape{f.B, f.target.tokens(), m.config().out_features()}));
  EXPECT_GT(profile.linear_flops, 0);
  std::vector<float> want(static_cast<size_t>(got.numel()));
  Arena arena;
  m.forward({&arena}, args_of(f, m, ts.f32(), want.data()));
  EXPECT_TRUE(test::bit_equal(got.f32(), want.data(), got.numel()));
}

TEST(Qwen21Forward, BadShapesAreNamed) {
  const Fixture f(DType::kF32, 1);
  const QwenImage21Transformer t = QwenImage21Transformer::builtin("qwen21-tiny", 3, "f32");
  const Tensor ts = Tensor::from_vector({0.7f, 0.4f}, {2});
  auto expect_error = [&](const std::function<void(Qwen21Call&)>& spoil, const std::string& what) {
    Qwen21Call call = call_of(f, ts);
    spoil(call);
    try {
      (void)t.forward(call);
      ADD_FAILURE() << "accepted: " << what;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  const int64_t C = f.cfg.in_channels;
  expect_error([&](Qwen21Call& c) { c.img = Tensor::zeros({2, 24, C + 1}); }, "img is");
  expect_error([&](Qwen21Call& c) { c.width = 5; }, "img is");
  expect_error([&](Qwen21Call& c) { c.height = 0; }, "target grid");
  expect_error(
      [&](Qwen21Call& c) {
        c.txt = Tensor::zeros({1, 9, f.cfg.context_in_dim});
      },
      "txt is");
  expect_error([&](Qwen21Call& c) { c.txt_slots.pop_back(); }, "txt_slots");
  expect_error([&](Qwen21Call& c) { c.txt_mask = Tensor::zeros({2, 3}); }, "txt_mask");
  expect_error(
      [&](Qwen21Call& c) {
        c.conditions[0].latents = Tensor::zeros({2, 8, C - 1});
      },
      "conditions[0]");
  expect_error([&](Qwen21Call& c) { c.timestep = Tensor::from_vector({0.5f}, {1}); }, "timestep");
  expect_error([&](Qwen21Call& c) { c.timestep = Tensor(); }, "timestep");
  // Slots that do not fit the condition images: the layout names both counts.
  expect_error([&](Qwen21Call& c) { c.conditions.clear(); }, "image slots");
}

// ---------------------------------------------------------------- the lazy prefix

// Step-cache hooks that follow a script: skip the blocks in `skip`, reuse the attention
// sublayer of the blocks in `reuse_attn` (its output filled with a constant), run the rest.
struct ScriptedHooks : cache::BlockHooks {
  std::set<int> skip, reuse_attn;
  cache::BlockAction before_block(int block, cache::Streams&) override {
    return skip.count(block) ? cache::BlockAction::kSkip : cache::BlockAction::kRun;
  }
  bool reuse(int block, cache::Sublayer which) override {
    return which == cache::Sublayer::kAttention && reuse_attn.count(block) > 0;
  }
  void fetch(int, cache::Sublayer, cache::Streams& out) override {
    for (const cache::Stream& s : out.s) {
      for (int64_t b = 0; b < out.batch; ++b) {
        for (int64_t t = 0; t < s.seq; ++t) std::fill_n(s.x.row(s.row(b) + t), s.x.cols, 0.01f);
      }
    }
  }
};

// The prefix is computed only where a target block reads it (or its K/V are stored): a call
// with every block skipped does the work of the call that splices the prefix from memory, and
// partly skipped calls give the bits of the prefix computed in every block.
TEST(Qwen21Forward, PrefixIsComputedOnlyWhereTheTargetReadsIt) {
  const Fixture f(DType::kF32, 2);
  const qwen::Model21& m = f.model;
  const int64_t P =
      qwen::build_layout21(static_cast<int64_t>(f.slots.size()), f.slots.data(), f.conds, f.target)
          .P;
  const std::vector<float> ts = {0.7f, 0.4f};
  const size_t n = static_cast<size_t>(f.B * f.target.tokens() * m.config().out_features());
  auto run = [&](cache::BlockHooks* hooks, SegmentKV prefix, Profile* profile) {
    std::vector<float> out(n);
    qwen::Args21 a = args_of(f, m, ts.data(), out.data(), prefix);
    a.hooks = hooks;
    Arena arena;
    m.forward({&arena, KernelPath::kFast, nullptr, profile}, a);
    return out;
  };
  KVMemory mem(m.kv_layers(), f.B, P, m.kv_width(), m.kv_dtype());
  (void)run(nullptr, {.route = KVRoute::kComputeAndStore, .store = &mem}, nullptr);
  ScriptedHooks all;
  all.skip = {0, 1};
  Profile live, spliced;
  const auto a = run(&all, {}, &live);
  const auto b = run(&all, {.route = KVRoute::kSplice, .memory = &mem}, &spliced);
  EXPECT_TRUE(test::bit_equal(a.data(), b.data(), static_cast<int64_t>(n)));
  EXPECT_EQ(live.linear.flops, spliced.linear.flops);
  EXPECT_EQ(live.attention.calls, spliced.attention.calls);
  const std::vector<std::pair<std::set<int>, std::set<int>>> scripts = {
      {{0}, {}}, {{1}, {}}, {{}, {0}}, {{}, {1}}, {{0}, {1}}};
  for (const auto& [skip, reuse] : scripts) {
    ScriptedHooks h;
    h.skip = skip, h.reuse_attn = reuse;
    KVMemory every_mem(m.kv_layers(), f.B, P, m.kv_width(), m.kv_dtype());
    const auto every = run(&h, {.route = KVRoute::kComputeAndStore, .store = &every_mem}, nullptr);
    const auto lazy = run(&h, {}, nullptr);
    EXPECT_TRUE(test::bit_equal(every.data(), lazy.data(), static_cast<int64_t>(n)))
        << "skip " << skip.size() << " reuse " << reuse.size();
  }
}

}  // namespace
}  // namespace flowkv
