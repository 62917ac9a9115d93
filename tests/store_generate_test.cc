// The reference store through generate(): a hit gives the same bytes as a miss and as no store,
// for FLUX.2 Klein KV (references' K/V, their latents, the prompt) and Qwen-Image-2.1 (each CFG
// branch's prefix K/V, the condition latents, both prompts); keys tell apart the same images in
// a different order; cancellation stops within a step and leaves the store usable; previews
// arrive where asked and change nothing.
#include <gtest/gtest.h>

#include <atomic>
#include <string>
#include <vector>

#include "flowkv/generate.h"
#include "flowkv/store.h"
#include "golden_util.h"

namespace flowkv {
namespace {

using test::golden;

std::string klein() {
  return golden("klein_pipeline/kv") + "/pipeline";
}
std::string qwen21() {
  return golden("qwen21_pipeline") + "/pipeline";
}

GenerateRequest klein_request(std::vector<std::string> refs) {
  GenerateRequest r;
  r.prompt = "a red fox in the snow";
  r.references = std::move(refs);
  r.width = 64, r.height = 48;
  r.steps = 3;
  r.seed = 7;
  return r;
}

GenerateRequest qwen21_request() {
  GenerateRequest r;
  r.prompt = "a capybara wearing a hat";
  r.negative_prompt = "blurry";
  r.has_negative_prompt = true;
  r.cfg_scale = 4;
  r.references = {golden("qwen21_pipeline") + "/cond_rgba.png",
                  golden("qwen21_pipeline") + "/cond_rgb.png"};
  r.resolution = 64;
  r.steps = 2;
  r.seed = 3;
  return r;
}

GenerateControl with_store(std::shared_ptr<ReferenceStore> s) {
  GenerateControl c;
  c.store = std::move(s);
  return c;
}

TEST(StoreGenerate, KleinHitIsBitIdenticalToMissAndToNoStore) {
  const GenerateRequest r = klein_request({golden("klein_pipeline") + "/reference.png"});
  const GenerateResult plain = generate(klein(), r);
  auto store = std::make_shared<ReferenceStore>();
  const GenerateResult miss = generate(klein(), r, {}, with_store(store));
  const GenerateResult hit = generate(klein(), r, {}, with_store(store));
  EXPECT_EQ(miss.pixels, plain.pixels);
  EXPECT_EQ(hit.pixels, plain.pixels);
  // prompt, one reference's latents, the references' K/V
  EXPECT_EQ(miss.store_misses, 3);
  EXPECT_EQ(miss.store_hits, 0);
  EXPECT_EQ(hit.store_hits, 3);
  EXPECT_EQ(hit.store_misses, 0);
  EXPECT_EQ(hit.store_keys, miss.store_keys);
  const StoreStats s = store->stats();
  EXPECT_EQ(s.kinds.at("kv").hits, 1);
  EXPECT_EQ(s.kinds.at("latents").hits, 1);
  EXPECT_EQ(s.kinds.at("prompt").hits, 1);
  EXPECT_EQ(s.pinned, 0);  // nothing held once the requests are done
  // The detail says where things came from.
  EXPECT_NE(hit.stages.at(2).detail.find("K/V"), std::string::npos);
}

TEST(StoreGenerate, KleinSameImagesInAnotherOrderAreAnotherEntry) {
  const std::string a = golden("klein_pipeline") + "/reference.png";
  const std::string b = golden("qwen21_pipeline") + "/cond_rgb.png";
  auto store = std::make_shared<ReferenceStore>();
  const GenerateResult ab = generate(klein(), klein_request({a, b}), {}, with_store(store));
  const GenerateResult ba = generate(klein(), klein_request({b, a}), {}, with_store(store));
  // The latents are shared (same pixels), the K/V set is not (other offsets).
  EXPECT_EQ(ba.store_hits, 3);    // prompt, two latents
  EXPECT_EQ(ba.store_misses, 1);  // the K/V of [b, a]
  EXPECT_EQ(ba.pixels, generate(klein(), klein_request({b, a})).pixels);
  EXPECT_NE(ab.pixels, ba.pixels);
  EXPECT_NE(ab.store_keys.back(), ba.store_keys.back());
}

TEST(StoreGenerate, KleinAnotherPromptReusesTheReferences) {
  const GenerateRequest r = klein_request({golden("klein_pipeline") + "/reference.png"});
  auto store = std::make_shared<ReferenceStore>();
  (void)generate(klein(), r, {}, with_store(store));
  GenerateRequest r2 = r;
  r2.prompt = "a blue fox on the beach";
  std::vector<StepEvent> events;
  GenerateControl c = with_store(store);
  c.on_step = [&](const StepEvent& e) { events.push_back(e); };
  const GenerateResult got = generate(klein(), r2, {}, c);
  EXPECT_EQ(got.pixels, generate(klein(), r2).pixels);
  EXPECT_EQ(got.store_hits, 2);  // latents and K/V; the prompt is new
  ASSERT_EQ(events.size(), 3u);
  for (const StepEvent& e : events) {
    EXPECT_TRUE(e.from_store);
    EXPECT_TRUE(e.conditioning_cached);  // the first step too
  }
}

TEST(StoreGenerate, Qwen21HitIsBitIdenticalWithBothCfgBranches) {
  const GenerateRequest r = qwen21_request();
  const GenerateResult plain = generate(qwen21(), r);
  auto store = std::make_shared<ReferenceStore>();
  const GenerateResult miss = generate(qwen21(), r, {}, with_store(store));
  const GenerateResult hit = generate(qwen21(), r, {}, with_store(store));
  EXPECT_EQ(miss.pixels, plain.pixels);
  EXPECT_EQ(hit.pixels, plain.pixels);
  EXPECT_EQ(hit.store_hits, miss.store_misses);
  EXPECT_EQ(hit.store_misses, 0);
  EXPECT_GE(store->stats().kinds.at("kv").hits, 1);
  // Without the exact cache there is no K/V entry, and the output is still the same.
  GenerateRequest u = r;
  u.kv_cache = false;
  const GenerateResult uncached = generate(qwen21(), u, {}, with_store(store));
  EXPECT_EQ(uncached.pixels, plain.pixels);
}

TEST(StoreGenerate, CancellationStopsWithinAStepAndTheStoreStaysUsable) {
  const GenerateRequest r = klein_request({golden("klein_pipeline") + "/reference.png"});
  auto store = std::make_shared<ReferenceStore>();
  std::atomic<int> steps{0};
  GenerateControl c = with_store(store);
  c.on_step = [&](const StepEvent&) { ++steps; };
  c.cancelled = [&] { return steps.load() >= 1; };
  EXPECT_THROW(generate(klein(), r, {}, c), Cancelled);
  EXPECT_EQ(steps.load(), 1);
  EXPECT_EQ(store->stats().pinned, 0);
  const GenerateResult after = generate(klein(), r, {}, with_store(store));
  EXPECT_EQ(after.pixels, generate(klein(), r).pixels);
  // Cancelled before anything started.
  GenerateControl early;
  early.cancelled = [] { return true; };
  EXPECT_THROW(generate(klein(), r, {}, early), Cancelled);
}

TEST(StoreGenerate, PreviewsArriveWhereAskedAndChangeNothing) {
  GenerateRequest r = klein_request({golden("klein_pipeline") + "/reference.png"});
  r.steps = 4;
  std::vector<int> at;
  GenerateControl c;
  c.previews = 2;
  c.on_preview = [&](int index, const StepEvent& e, const GenerateResult& p) {
    EXPECT_EQ(index, static_cast<int>(at.size()));
    EXPECT_EQ(p.width, 64);
    EXPECT_EQ(p.height, 48);
    EXPECT_EQ(p.pixels.size(), size_t{64 * 48 * 3});
    at.push_back(e.step);
  };
  const GenerateResult got = generate(klein(), r, {}, c);
  EXPECT_EQ(at, (std::vector<int>{1, 2}));
  EXPECT_EQ(got.pixels, generate(klein(), r).pixels);
}

}  // namespace
}  // namespace flowkv
