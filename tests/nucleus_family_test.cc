// NucleusMoE-Image as a family, through the public API: the rules engine derives the text K/V
// cache from the declared layout, `predict` gives its FLOPs and bytes from the one cost model,
// the text K/V cache is bit-identical to recomputing (with CFG, batched and per branch, alone
// and under every step cache), and `flowkv quantize` writes the experts output-major so that a
// Q8_0 GGUF loads and runs close to the f32 folder.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "family_cases.h"
#include "flowkv/error.h"
#include "flowkv/inspect.h"
#include "flowkv/io.h"
#include "flowkv/model.h"
#include "flowkv/predict.h"
#include "flowkv/step_cache.h"
#include "io/checkpoint.h"
#include "temp_files.h"
#include "test_util.h"

namespace flowkv {
namespace {

using test::same_bits;

// The released shape at 1024^2 with a 160-row prompt, CFG, 50 steps: the text is cached (its
// K/V of 32 blocks x 4 KV heads x 128, bf16, per branch) and the step saves exactly the text's
// projections (encoder_proj 4096 -> 2048, add_k and add_v 2048 -> 512) of both branches.
TEST(NucleusFamily, PredictsTheTextKvCache) {
  const int64_t L = 160, N = 4096;
  const KVPrediction p = predict({.model = "nucleus-moe-image",
                                  .text_tokens = L,
                                  .target_tokens = N,
                                  .ref_tokens = {},
                                  .steps = 50,
                                  .cfg = true});
  EXPECT_EQ(p.layers, 32);
  EXPECT_EQ(p.branches, 2);
  EXPECT_EQ(p.kv_bytes, 2 * 32 * L * 512 * 2 * 2);
  ASSERT_EQ(p.segments.size(), 2u);
  EXPECT_EQ(p.segments[0].name, "text");
  EXPECT_TRUE(p.segments[0].cached);
  EXPECT_FALSE(p.segments[1].cached);
  const double text = 2.0 * 2.0 * double(L) * 32 * (4096.0 * 2048 + 2.0 * 2048 * 512);
  EXPECT_DOUBLE_EQ(p.segments[0].uncached_flops, text);
  EXPECT_DOUBLE_EQ(p.segments[0].cached_flops, 0.0);
  EXPECT_DOUBLE_EQ(p.uncached_step_flops - p.cached_step_flops, text);
  EXPECT_GT(p.speedup, 1.0);
  EXPECT_LT(p.speedup, 1.05);  // the text is a few percent of a step at this size
  // The image tokens: attention to [image | text] keys, q/out 2048^2, k/v 2048 x 512, and the
  // MLP (3 dense, 29 MoE layers: router, shared expert, ceil(cf N / 64) rows per expert).
  EXPECT_GT(p.segments[1].uncached_flops, 100.0 * text);
}

TEST(NucleusFamily, TakesNoPictures) {
  EXPECT_FALSE(family_info("nucleus").takes_images);
  EXPECT_THROW(predict({.model = "nucleus-moe-image", .ref_tokens = {256}}), Error);
  const Model m = Model::builtin("nucleus-tiny", 1);
  EXPECT_THROW(
      example_inputs(m, {.text_tokens = 8, .height = 4, .width = 4, .references = {{2, 2}}}),
      Error);
}

class NucleusDenoise : public ::testing::Test {
 protected:
  static const Model& model() {
    static const Model m = Model::builtin("nucleus-tiny", 5);
    return m;
  }
  static DenoiseInputs inputs(int64_t negative_rows) {
    DenoiseInputs in = example_inputs(
        model(),
        {.text_tokens = 8, .height = 4, .width = 6, .references = {}, .cfg = true, .seed = 3});
    // A padded prompt: its last two rows masked, as the pipeline pads to a multiple of 8.
    in.prompt.mask = Tensor::zeros({1, 8});
    for (int i = 0; i < 6; ++i) in.prompt.mask.f32()[i] = 1;
    if (negative_rows != 8) {
      in.negative.embeds =
          example_inputs(model(),
                         {.text_tokens = negative_rows, .height = 4, .width = 6, .seed = 9})
              .prompt.embeds;
    }
    return in;
  }
  static DenoiseResult run(const DenoiseInputs& in, KVMode mode, bool batch_cfg,
                           std::vector<std::string> caches = {}) {
    DenoiseOptions o;
    o.steps = 5;
    o.mode = mode;
    o.batch_cfg = batch_cfg;
    o.step_caches = std::move(caches);
    return denoise(model(), in, o);
  }
};

// Batched CFG (prompts of one length) and per-branch CFG (different lengths), each cached and
// recomputed: the cache never changes a bit, and keeps one memory per branch.
TEST_F(NucleusDenoise, TextKvCacheIsExactWithCfg) {
  for (const int64_t neg : {8, 16}) {
    const DenoiseInputs in = inputs(neg);
    for (const bool batch : {true, false}) {
      const DenoiseResult cached = run(in, KVMode::kCached, batch);
      const DenoiseResult plain = run(in, KVMode::kRecompute, batch);
      EXPECT_TRUE(cached.cfg);
      EXPECT_EQ(cached.batched_cfg, batch && neg == 8);
      EXPECT_TRUE(same_bits(cached.latents, plain.latents)) << neg << " " << batch;
      EXPECT_GT(cached.kv_bytes, 0);
      EXPECT_EQ(cached.kv_bytes, kv_bytes_needed(model(), in, {})) << neg;
      EXPECT_EQ(plain.kv_bytes, 0);
    }
  }
}

// Batched and per-branch CFG give the same latents (the same arithmetic per row).
TEST_F(NucleusDenoise, BatchedCfgEqualsPerBranch) {
  const DenoiseInputs in = inputs(8);
  EXPECT_TRUE(
      same_bits(run(in, KVMode::kCached, true).latents, run(in, KVMode::kCached, false).latents));
}

// Every step cache on top of the text K/V cache decides and computes exactly as without it.
TEST_F(NucleusDenoise, EveryPolicyComposesWithTheTextKvCache) {
  const DenoiseInputs in = inputs(16);
  for (const std::string& spec : test::kModelFiring) {
    const DenoiseResult cached = run(in, KVMode::kCached, true, {spec});
    const DenoiseResult plain = run(in, KVMode::kRecompute, true, {spec});
    EXPECT_TRUE(same_bits(cached.latents, plain.latents)) << spec;
    ASSERT_EQ(cached.step_caches.size(), 1u);
    EXPECT_EQ(cached.step_caches[0].decisions, plain.step_caches[0].decisions) << spec;
  }
}

// flowkv quantize: the experts are written output-major ([E, 2I, D], [E, D, I]) and quantized
// by rows; the Q8_0 file loads and runs close to the f32 folder it came from.
TEST(NucleusFamily, QuantizedGgufRunsCloseToTheFolder) {
  test::TempDir tmp;
  const std::string folder = (tmp.path() / "f32").string();
  const std::string gguf = (tmp.path() / "q8.gguf").string();
  export_builtin("nucleus-tiny", 7, "f32", folder);
  const QuantizeReport rep = quantize_checkpoint(folder, gguf, DType::kQ8_0, {});
  EXPECT_GT(rep.quantized, 0);
  const CheckpointScan stored = scan_checkpoint(folder), written = scan_checkpoint(gguf);
  int experts = 0;
  for (const auto& [name, info] : stored.tensors) {
    if (name.find(".img_mlp.experts.") == std::string::npos) continue;
    ++experts;
    const TensorInfo& q = written.tensors.at(name);
    ASSERT_EQ(info.shape.size(), 3u) << name;
    EXPECT_EQ(q.shape, (Shape{info.shape[0], info.shape[2], info.shape[1]})) << name;
    EXPECT_EQ(q.dtype, DType::kQ8_0) << name;
  }
  EXPECT_GT(experts, 0);
  const Model f = Model::load(folder), q = Model::load(gguf);
  const DenoiseInputs in = example_inputs(f, {.text_tokens = 8, .height = 4, .width = 4});
  const Tensor a = forward(f, in), b = forward(q, in);
  const test::ErrorStats e = test::compare(b.f32(), a.f32(), a.numel());
  std::printf("Q8_0 GGUF vs f32 folder: max abs %.3g of max %.3g\n", e.max_abs, e.max_ref);
  EXPECT_LT(e.rel(), 0.05);
}

}  // namespace
}  // namespace flowkv
