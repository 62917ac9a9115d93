// Level 6 of the test ladder for NucleusMoE-Image: the tiny NucleusMoEImagePipeline of
// python/ref/dump_nucleus_pipeline.py (diffusers 0.42.1, transformers 5.24.0, f32) from a
// prompt and a seed to diffusers' PNG: CFG on by default (guidance 4, negative ""), the same
// with diffusers' TextKVCacheConfig, and guidance 1 (no CFG). The prompt stage is checked alone
// against the tensors dumped between stages, the first step's velocities through the public
// denoise, then generate() end to end against diffusers' pixels; the text K/V cache against the
// uncached run and a store hit against a miss, bit for bit.
#include <gtest/gtest.h>

#include <filesystem>

#include "core/arena.h"
#include "core/random.h"
#include "flowkv/error.h"
#include "flowkv/generate.h"
#include "flowkv/pipeline.h"
#include "flowkv/predict.h"
#include "golden_util.h"
#include "io/image.h"
#include "io/json.h"
#include "models/qwen3_vl/nucleus_prompt.h"
#include "models/qwen_image_vae/image_processor.h"
#include "models/qwen_image_vae/model.h"
#include "temp_files.h"
#include "test_util.h"

namespace flowkv {
namespace {

using test::golden;

std::string dir() {
  return golden("nucleus_pipeline");
}
std::string pipe() {
  return dir() + "/pipeline";
}
Json meta() {
  return read_json_file(dir() + "/meta.json");
}
std::map<std::string, Tensor> stages(const std::string& c) {
  return test::load_tensors(dir() + "/" + c + "/stages.safetensors");
}

GenerateRequest request(const std::string& c) {
  const Json m = meta();
  const Json& k = m["cases"][c];
  GenerateRequest r;
  r.prompt = m["prompt"].get<std::string>();
  r.cfg_scale = k["guidance_scale"].get<float>();
  if (!k["negative_prompt"].is_null()) {
    r.negative_prompt = k["negative_prompt"].get<std::string>();
    r.has_negative_prompt = true;
  }
  r.width = k["width"].get<int64_t>();
  r.height = k["height"].get<int64_t>();
  r.steps = k["steps"].get<int>();
  r.seed = m["seed"].get<uint64_t>();
  r.kv_cache = k["text_kv_cache"].get<bool>();
  return r;
}

void expect_close(const Tensor& got, const Tensor& ref, double tol, const std::string& what) {
  ASSERT_EQ(got.numel(), ref.numel()) << what;
  const test::ErrorStats e = test::compare(got.f32(), ref.f32(), ref.numel());
  std::printf("%s: max abs %.3g, max |ref| %.3g\n", what.c_str(), e.max_abs, e.max_ref);
  EXPECT_LE(e.rel(), tol) << what << ": max abs " << e.max_abs << ", max |ref| " << e.max_ref;
}

// Stage "prompt" alone: both branches (the long system prompt, "" padded to a multiple of 8),
// hidden_states[-8] and the masks.
TEST(NucleusPipeline, PromptEmbeddingsMatchBothBranches) {
  const Json m = meta();
  const auto st = stages("cfg");
  const auto enc =
      qwen3_vl::NucleusPromptEncoder::load(pipe() + "/text_encoder", pipe() + "/processor");
  for (const auto& [branch, text] :
       {std::pair<std::string, std::string>{"prompt", m["prompt"].get<std::string>()},
        {"negative", ""}}) {
    Arena arena;
    const qwen3_vl::NucleusPromptEncoding e = enc.encode(ExecContext{&arena}, text, 1024);
    expect_close(e.embeds, st.at(branch + "_embeds"), 1e-5, branch);
    const Tensor want = st.at(branch + "_mask").to_f32();
    ASSERT_EQ(static_cast<int64_t>(e.mask.size()), want.numel()) << branch;
    for (int64_t i = 0; i < want.numel(); ++i)
      EXPECT_EQ(e.mask[static_cast<size_t>(i)] ? 1.0f : 0.0f, want.f32()[i]) << branch << i;
  }
}

// The whole pipeline: diffusers' pixels with CFG, with diffusers' text K/V cache, and without
// CFG.
class NucleusGenerate : public ::testing::TestWithParam<std::string> {};

TEST_P(NucleusGenerate, PixelsMatchDiffusers) {
  const std::string c = GetParam();
  const GenerateResult res = generate(pipe(), request(c));
  const Image want = load_image(dir() + "/" + c + "/output.png", PixelFormat::kRGB);
  ASSERT_EQ(res.width, want.width);
  ASSERT_EQ(res.height, want.height);
  ASSERT_EQ(res.channels, 3);
  ASSERT_EQ(res.pixels.size(), want.pixels.size());
  const test::PixelDiff d = test::diff_pixels(res.pixels, want.pixels);
  std::printf("%s: %lld of %zu channel values differ from diffusers, max %d\n", c.c_str(),
              static_cast<long long>(d.differ), res.pixels.size(), d.worst);
  EXPECT_LE(d.worst, 1);  // the bar: within +-1
  std::vector<std::string> names;
  for (const StageReport& s : res.stages) names.push_back(s.name);
  EXPECT_EQ(names, (std::vector<std::string>{"prompt", "denoise", "decode"}));
  EXPECT_NE(res.parameters.find("Seed: 42"), std::string::npos);
  EXPECT_NE(res.parameters.find(c == "nocfg" ? "CFG scale: off" : "CFG scale: 4"),
            std::string::npos)
      << res.parameters;
}

INSTANTIATE_TEST_SUITE_P(Cases, NucleusGenerate, ::testing::Values("cfg", "cfg_textkv", "nocfg"));

// CFG is on by default (guidance 4 with the negative prompt ""), as __call__'s defaults are.
TEST(NucleusPipeline, CfgIsOnByDefault) {
  GenerateRequest r = request("cfg");
  r.cfg_scale = 0;  // the pipeline's default
  r.has_negative_prompt = false;
  r.negative_prompt.clear();
  const GenerateResult res = generate(pipe(), r);
  const Image want = load_image(dir() + "/cfg/output.png", PixelFormat::kRGB);
  EXPECT_LE(test::diff_pixels(res.pixels, want.pixels).worst, 1);
}

// The text K/V cache changes nothing: cached and uncached give the same bytes; the denoise
// stage says what the cache held.
TEST(NucleusPipeline, TextKvCacheIsExact) {
  GenerateRequest r = request("cfg_textkv");
  const GenerateResult a = generate(pipe(), r);
  r.kv_cache = false;
  const GenerateResult b = generate(pipe(), r);
  EXPECT_EQ(a.pixels, b.pixels);
  EXPECT_NE(a.stages.at(1).detail.find("text K/V"), std::string::npos) << a.stages.at(1).detail;
  EXPECT_EQ(b.stages.at(1).detail.find("text K/V"), std::string::npos) << b.stages.at(1).detail;
}

// A store hit on the prompt and the text K/V gives the bytes of a miss and of no store.
TEST(NucleusPipeline, StoreHitIsBitIdenticalToMiss) {
  const GenerateRequest r = request("cfg_textkv");
  const GenerateResult plain = generate(pipe(), r);
  auto store = std::make_shared<ReferenceStore>();
  GenerateControl o;
  o.store = store;
  const GenerateResult miss = generate(pipe(), r, {}, o);
  const GenerateResult hit = generate(pipe(), r, {}, o);
  EXPECT_EQ(miss.pixels, plain.pixels);
  EXPECT_EQ(hit.pixels, plain.pixels);
  EXPECT_EQ(hit.store_misses, 0);
  EXPECT_EQ(hit.store_hits, miss.store_misses);
  EXPECT_GE(store->stats().kinds.at("kv").hits, 1);
}

// The disk tier keeps the prompts with their padding masks and the text K/V: a second store
// reading it gives the same bytes.
TEST(NucleusPipeline, DiskTierServesAnotherStore) {
  test::TempDir tmp;
  const std::string dir = (tmp.path() / "store").string();
  std::filesystem::create_directories(dir);
  const GenerateRequest r = request("cfg_textkv");
  const GenerateResult plain = generate(pipe(), r);
  {
    GenerateControl first;
    first.store = std::make_shared<ReferenceStore>(StoreOptions{.disk_dir = dir});
    (void)generate(pipe(), r, {}, first);
  }
  GenerateControl second;
  second.store = std::make_shared<ReferenceStore>(StoreOptions{.disk_dir = dir});
  const GenerateResult hit = generate(pipe(), r, {}, second);
  EXPECT_EQ(hit.store_misses, 0);
  EXPECT_GE(second.store->stats().disk_hits, 3);  // two prompts, and the text K/V
  EXPECT_EQ(hit.pixels, plain.pixels);
}

// The layout the predictor sees: the processor's token counts, padded to a multiple of 8.
TEST(NucleusPipeline, LayoutCountsThePaddedPrompt) {
  const auto st = stages("cfg");
  const GenerateLayout l = generate_layout(pipe(), request("cfg"));
  EXPECT_EQ(l.text_tokens, st.at("prompt_embeds").dim(1));
  EXPECT_EQ(l.negative_text_tokens, st.at("negative_embeds").dim(1));
  EXPECT_EQ(l.text_tokens % 8, 0);
  EXPECT_EQ(l.width, 96);
  EXPECT_EQ(l.height, 64);
  EXPECT_EQ(l.target_tokens, (96 / 16) * (64 / 16));
  EXPECT_TRUE(l.cfg);
}

TEST(NucleusPipeline, BadRequestsAreClearErrors) {
  GenerateRequest r = request("cfg");
  r.references = {golden("qwen_image_pipeline") + "/pic_a.png"};
  EXPECT_THROW(generate_layout(pipe(), r), Error);
  r = request("cfg");
  r.max_sequence_length = 4096;
  EXPECT_THROW(generate_layout(pipe(), r), Error);
}

// A released-shape pipeline of zero weights (sparse files) opens, its components fit, and a
// request plans as the real one would at 1024^2.
TEST(NucleusPipeline, ZeroExportPlansARealSizeRequest) {
  test::TempDir tmp;
  const std::string d = (tmp.path() / "nucleus").string();
  export_zero_weights("nucleus-moe-image-pipeline", "bf16", d);
  for (const char* f : {"/tokenizer.json", "/tokenizer_config.json", "/chat_template.jinja"}) {
    std::filesystem::copy_file(pipe() + "/processor" + f, d + "/processor" + f,
                               std::filesystem::copy_options::overwrite_existing);
  }
  GenerateRequest r = request("cfg");
  r.width = r.height = 0;
  const GenerateLayout l = generate_layout(d, r);
  EXPECT_EQ(l.width, 1024);
  EXPECT_EQ(l.height, 1024);
  EXPECT_EQ(l.target_tokens, 64 * 64);
  EXPECT_TRUE(l.cfg);
  const KVPrediction p = predict({.model = d + "/transformer",
                                  .text_tokens = l.text_tokens,
                                  .target_tokens = l.target_tokens,
                                  .ref_tokens = {},
                                  .steps = 50,
                                  .cfg = true});
  // Text K/V of 32 blocks, 4 KV heads x 128, bf16, for both branches.
  EXPECT_EQ(p.kv_bytes, 2 * 32 * 512 * 2 * l.text_tokens * 2);
  EXPECT_GT(p.speedup, 1.0);
}

}  // namespace
}  // namespace flowkv

namespace flowkv {
namespace {

// The first step's model outputs alone: the transformer on diffusers' prompt embeddings, masks
// and initial latents at t = 1 gives its conditional and unconditional predictions.
TEST(NucleusPipeline, FirstStepVelocitiesMatch) {
  const auto st = stages("cfg");
  const Model m = Model::load(pipe() + "/transformer");
  for (const char* branch : {"prompt", "negative"}) {
    DenoiseInputs in;
    in.prompt.embeds = st.at(std::string(branch) + "_embeds").to_f32();
    in.prompt.mask = st.at(std::string(branch) + "_mask").to_f32();
    in.noise = st.at("initial_latents").to_f32();
    in.height = 64 / 16;
    in.width = 96 / 16;
    const Tensor v = forward(m, in, {.sigma = st.at("step0_timestep").to_f32().f32()[0]});
    expect_close(v, st.at(std::string("step0_") + (branch[0] == 'p' ? "cond" : "uncond")), 1e-5,
                 std::string("step 0 ") + branch);
  }
}

}  // namespace
}  // namespace flowkv

namespace flowkv {
namespace {

// The denoising loop alone from diffusers' initial latents and prompt embeddings: the schedule,
// guidance with its norm rescale, the negated prediction and the Euler steps give diffusers'
// final latents.
TEST(NucleusPipeline, DenoiseLoopMatchesFinalLatents) {
  const Model m = Model::load(pipe() + "/transformer");
  for (const std::string c : {"nocfg", "cfg"}) {
    const auto st = stages(c);
    const auto cfg_st = stages("cfg");
    DenoiseInputs in;
    in.prompt.embeds = cfg_st.at("prompt_embeds").to_f32();
    in.prompt.mask = cfg_st.at("prompt_mask").to_f32();
    if (c == "cfg") {
      in.negative.embeds = cfg_st.at("negative_embeds").to_f32();
      in.negative.mask = cfg_st.at("negative_mask").to_f32();
      in.cfg_scale = 4.0f;
    }
    in.noise = st.at("initial_latents").to_f32();
    in.height = 64 / 16;
    in.width = 96 / 16;
    DenoiseOptions o;
    o.steps = 4;
    const DenoiseResult r = denoise(m, in, o);
    expect_close(r.latents, st.at("final_latents").to_f32(), 1e-5, c + " final latents");
  }
}

}  // namespace
}  // namespace flowkv

namespace flowkv {
namespace {

// Stage "decode" alone: diffusers' final latents through the Qwen-Image VAE give its picture.
TEST(NucleusPipeline, DecodeMatchesThePicture) {
  const auto st = stages("nocfg");
  const qwen_vae::Vae vae = qwen_vae::Vae::load(pipe() + "/vae");
  const Tensor z = qwen_vae::unpack(st.at("final_latents").to_f32(), 2 * 4, 2 * 6);
  const Image got = qwen_vae::postprocess(vae.decode(ExecContext{}, z, {})).at(0);
  const Tensor want = st.at("image").to_f32();  // [H, W, 3] in [0, 1]
  ASSERT_EQ(static_cast<int64_t>(got.pixels.size()), want.numel());
  int worst = 0;
  for (int64_t i = 0; i < want.numel(); ++i) {
    const int w = static_cast<int>(std::lround(want.f32()[i] * 255.0f));
    worst = std::max(worst, std::abs(w - static_cast<int>(got.pixels[static_cast<size_t>(i)])));
  }
  EXPECT_LE(worst, 1);
}

}  // namespace
}  // namespace flowkv

namespace flowkv {
namespace {

// The initial latents: torch.randn of [1, 1, 16, 2h, 2w] from the seed, packed 2x2.
TEST(NucleusPipeline, NoiseIsTorchsPacked) {
  const auto st = stages("nocfg");
  TorchGenerator g(meta()["seed"].get<uint64_t>());
  const Tensor z = randn_tensor(g, {1, 16, 8, 12});
  const Tensor want = st.at("initial_latents").to_f32();
  const Tensor got = qwen_vae::pack(z);
  ASSERT_EQ(got.numel(), want.numel());
  EXPECT_EQ(0, std::memcmp(got.f32(), want.f32(), static_cast<size_t>(want.numel()) * 4));
}

}  // namespace
}  // namespace flowkv
