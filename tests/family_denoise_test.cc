// The per-family loop of the cache promises, through the public API only: for every registered
// family and every built-in model, the exact cache is bit-identical to recomputing, every
// step-cache policy composes with it bit for bit, and a policy's state never leaks between
// requests or CFG branches. A new family gets these tests by registering.
#include <gtest/gtest.h>

#include <cctype>
#include <cstring>
#include <map>
#include <memory>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "family_cases.h"
#include "flowkv/model.h"
#include "flowkv/step_cache.h"

namespace flowkv {
namespace {

using Case = test::FamilyCase;
using test::all_builtins;

using test::same_bits;

// Every policy, at settings that fire on these models (FasterCache: its CFG-branch skipping and
// its attention extrapolation in range).
const std::vector<std::string> kFiring = [] {
  std::vector<std::string> v = test::kModelFiring;
  v.push_back("fastercache:uncond_hi=2000,attn_hi=2000");
  return v;
}();

class FamilyDenoise : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    // One model per built-in for the whole suite: weights are immutable and shared by requests.
    static std::map<std::string, std::shared_ptr<const Model>> loaded;
    auto& m = loaded[GetParam().builtin];
    if (!m) m = std::make_shared<const Model>(Model::builtin(GetParam().builtin, 5));
    model_ = m;
    const FamilyInfo& f = model_->family();
    ExampleShape s;
    s.text_tokens = 8;
    s.height = s.width = 4;  // 16 tokens: a multiple of every family's grid_multiple
    if (f.takes_images) s.references = {{2, 2}, {2, 4}};
    s.cfg = f.true_cfg;
    s.seed = 3;
    in_ = example_inputs(*model_, s);
  }
  DenoiseResult run(KVMode mode, std::vector<std::string> caches, int steps = 6,
                    const DenoiseInputs* in = nullptr) const {
    DenoiseOptions o;
    o.steps = steps;
    o.mode = mode;
    o.step_caches = std::move(caches);
    return denoise(*model_, in ? *in : in_, o);
  }
  std::shared_ptr<const Model> model_;
  DenoiseInputs in_;
};

TEST_P(FamilyDenoise, CachedEqualsRecomputedBitForBit) {
  const DenoiseResult cached = run(KVMode::kCached, {});
  const DenoiseResult recomputed = run(KVMode::kRecompute, {});
  // A family without an exact cache (Qwen-Image) keeps nothing; the two modes still agree.
  if (model_->family().exact_cache.empty()) {
    EXPECT_EQ(cached.kv_bytes, 0);
  } else {
    EXPECT_GT(cached.kv_bytes, 0);
  }
  EXPECT_EQ(recomputed.kv_bytes, 0);
  EXPECT_EQ(kv_bytes_needed(*model_, in_, {}), cached.kv_bytes);
  EXPECT_TRUE(same_bits(cached.latents, recomputed.latents)) << GetParam().builtin;
}

TEST_P(FamilyDenoise, EveryPolicyComposesWithTheExactCacheBitForBit) {
  ASSERT_EQ(kFiring.size(), step_cache_policies().size()) << "a policy without a setting here";
  for (const std::string& spec : kFiring) {
    const DenoiseResult cached = run(KVMode::kCached, {spec});
    const DenoiseResult recomputed = run(KVMode::kRecompute, {spec});
    ASSERT_EQ(cached.step_caches.size(), 1u);
    EXPECT_TRUE(same_bits(cached.latents, recomputed.latents))
        << GetParam().builtin << " " << spec << ": " << cached.step_caches[0].decisions;
    EXPECT_EQ(cached.step_caches[0].decisions, recomputed.step_caches[0].decisions) << spec;
  }
}

// A second request between two identical ones changes nothing: no state outlives a request.
TEST_P(FamilyDenoise, PolicyStateNeverLeaksBetweenRequests) {
  DenoiseInputs other = in_;
  other.noise = Tensor::zeros(in_.noise.shape());
  for (int64_t i = 0; i < other.noise.numel(); ++i) other.noise.f32()[i] = -in_.noise.f32()[i];
  for (const std::string& spec : kFiring) {
    const DenoiseResult a = run(KVMode::kCached, {spec}, 4);
    (void)run(KVMode::kCached, {spec}, 4, &other);
    EXPECT_TRUE(same_bits(a.latents, run(KVMode::kCached, {spec}, 4).latents)) << spec;
  }
}

// With the negative prompt equal to the prompt, both branches see the same inputs: if each
// keeps its own state, the guided velocity u + s (c - u) is exactly u = c, and the result is
// the run without guidance. A policy that mixed the branches' states would break this.
TEST_P(FamilyDenoise, PolicyStateNeverLeaksBetweenBranches) {
  if (!model_->family().true_cfg) GTEST_SKIP() << "no unconditional branch in this family";
  DenoiseInputs twin = in_, single = in_;
  twin.negative = twin.prompt;
  single.negative = PromptEmbeds{};
  for (const std::string& spec : kFiring) {
    if (spec.rfind("fastercache", 0) == 0) continue;  // it skips a branch by design
    const DenoiseResult guided = run(KVMode::kCached, {spec}, 4, &twin);
    const DenoiseResult plain = run(KVMode::kCached, {spec}, 4, &single);
    EXPECT_TRUE(guided.cfg);
    EXPECT_TRUE(same_bits(guided.latents, plain.latents)) << spec;
  }
}

INSTANTIATE_TEST_SUITE_P(Builtins, FamilyDenoise, ::testing::ValuesIn(all_builtins()),
                         [](const auto& i) { return test::case_name(i.param); });

}  // namespace
}  // namespace flowkv
