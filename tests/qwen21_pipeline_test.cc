// Level 6 of the test ladder for Qwen-Image-2.1: the tiny QwenImage21Pipeline of
// python/ref/dump_qwen21_pipeline.py (diffusers 0.42.1, transformers 5.24.0, f32) from a prompt,
// a negative prompt, two condition images (RGBA and RGB) and a seed to diffusers' RGBA PNG, with
// and without the prefix KV cache, and a text-only case. Each stage is checked alone against the
// tensors dumped between stages, then generate() end to end against diffusers' pixels.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>

#include "core/arena.h"
#include "flowkv/error.h"
#include "flowkv/generate.h"
#include "flowkv/inspect.h"
#include "golden_util.h"
#include "io/image.h"
#include "io/json.h"
#include "models/qwen3_vl/prompt_encoder.h"
#include "models/qwen_image21_vae/image_processor.h"
#include "models/qwen_image21_vae/model.h"
#include "pipeline/condition_image.h"
#include "pipeline/reference_image.h"
#include "temp_files.h"
#include "test_util.h"

namespace flowkv {
namespace {

using test::golden;

std::string dir() {
  return golden("qwen21_pipeline");
}
Json meta() {
  return read_json_file(dir() + "/meta.json");
}
std::map<std::string, Tensor> stages(const std::string& c) {
  return test::load_tensors(dir() + "/" + c + "/stages.safetensors");
}
std::vector<std::string> condition_files() {
  return {dir() + "/cond_rgba.png", dir() + "/cond_rgb.png"};
}

void expect_bit_equal(const Tensor& got, const Tensor& ref, const std::string& what) {
  ASSERT_EQ(got.numel(), ref.numel()) << what;
  EXPECT_TRUE(test::bit_equal(got.f32(), ref.f32(), ref.numel())) << what;
}

TEST(Qwen21Pipeline, DimensionsAreCalculateDimensions) {
  // calculate_dimensions(1024^2, w / h) of the pipeline, computed by Python.
  EXPECT_EQ(qwen21_dimensions(1024, 1248, 864, "x"), std::make_pair(int64_t{1216}, int64_t{864}));
  EXPECT_EQ(qwen21_dimensions(1024, 1024, 1024, "x"), std::make_pair(int64_t{1024}, int64_t{1024}));
  EXPECT_EQ(qwen21_dimensions(64, 80, 72, "x"), std::make_pair(int64_t{64}, int64_t{64}));
  EXPECT_EQ(qwen21_dimensions(64, 100, 50, "x"), std::make_pair(int64_t{96}, int64_t{32}));
  // A side under 32 pixels: refused (PIL would be asked for a zero-sized image).
  EXPECT_THROW(qwen21_dimensions(64, 1000, 10, "wide.png"), Error);
}

TEST(Qwen21Pipeline, ConditionImagesAreTheVaeInput) {
  const auto st = stages("cfg_cached");
  const int64_t res = meta()["output_resolution"].get<int64_t>();
  const std::vector<std::string> files = condition_files();
  for (size_t k = 0; k < files.size(); ++k) {
    const Image img =
        qwen21_condition_image(load_image(files[k], PixelFormat::kRGBA), res, files[k]);
    EXPECT_EQ(img.channels, 4);
    expect_bit_equal(image_to_tensor(img), st.at("cond_pixels_" + std::to_string(k)),
                     "condition image " + std::to_string(k));
  }
}

TEST(Qwen21Pipeline, RgbaPngRoundTrips) {
  const Image a = load_image(condition_files()[0], PixelFormat::kRGBA);
  const Image back =
      decode_image(reinterpret_cast<const uint8_t*>(encode_png(a).data()), encode_png(a).size(),
                   "png", limits::kMaxImagePixels, PixelFormat::kRGBA);
  EXPECT_EQ(back.pixels, a.pixels);
  // RGB files read as RGBA are opaque.
  const Image b = load_image(condition_files()[1], PixelFormat::kRGBA);
  for (int64_t i = 0; i < b.width * b.height; ++i) ASSERT_EQ(b.pixels[4 * i + 3], 255);
}

void expect_close(const Tensor& got, const Tensor& ref, double tol, const std::string& what) {
  ASSERT_EQ(got.numel(), ref.numel()) << what;
  const test::ErrorStats e = test::compare(got.f32(), ref.f32(), ref.numel());
  EXPECT_LE(e.rel(), tol) << what << ": max abs " << e.max_abs << ", max |ref| " << e.max_ref;
}

std::string pipe() {
  return dir() + "/pipeline";
}

std::vector<Image> vl_images() {
  const int64_t res = meta()["output_resolution"].get<int64_t>();
  std::vector<Image> out;
  for (const std::string& f : condition_files()) {
    out.push_back(over_white(qwen21_condition_image(load_image(f, PixelFormat::kRGBA), res, f)));
  }
  return out;
}

// Stage "prompt": the Qwen3-VL prompt encoder with the two condition images, both branches.
TEST(Qwen21Pipeline, PromptEmbeddingsMatchBothBranches) {
  const auto st = stages("cfg_cached");
  const Json m = meta();
  const auto enc = qwen3_vl::PromptEncoder::load(pipe() + "/text_encoder", pipe() + "/processor");
  const std::vector<Image> imgs = vl_images();
  for (const auto& [branch, text] :
       {std::pair<std::string, std::string>{"prompt", m["prompt"].get<std::string>()},
        {"negative", m["negative_prompt"].get<std::string>()}}) {
    Arena arena;
    const qwen3_vl::PromptEncoding e = enc.encode(ExecContext{&arena}, text, imgs);
    expect_close(e.embeds, st.at(branch + "_embeds"), 1e-5, branch + " embeddings");
    const Tensor& mask = st.at(branch + "_pad_mask");
    ASSERT_EQ(static_cast<int64_t>(e.slots.size()), mask.numel()) << branch;
    for (int64_t i = 0; i < mask.numel(); ++i) {
      EXPECT_EQ(e.slots[static_cast<size_t>(i)], static_cast<int>(mask.f32()[i]))
          << branch << " row " << i;
    }
  }
}

// Stage "conditions": the VAE's normalised latents of each condition image.
TEST(Qwen21Pipeline, ConditionLatentsMatch) {
  const auto st = stages("cfg_cached");
  const int64_t res = meta()["output_resolution"].get<int64_t>();
  const qwen21_vae::Vae vae = qwen21_vae::Vae::load(pipe() + "/vae");
  const std::vector<std::string> files = condition_files();
  for (size_t k = 0; k < files.size(); ++k) {
    const Image img = qwen21_condition_image(load_image(files[k], PixelFormat::kRGBA), res, "c");
    const Tensor z = vae.encode(ExecContext{}, qwen21_vae::preprocess(img));
    expect_close(z, st.at("cond_latents_" + std::to_string(k)), 1e-5,
                 "condition latents " + std::to_string(k));
  }
}

GenerateRequest request(const std::string& c) {
  const Json m = meta();
  const Json& k = m["cases"][c];
  GenerateRequest r;
  r.prompt = m["prompt"].get<std::string>();
  if (!k["negative_prompt"].is_null()) {
    r.negative_prompt = k["negative_prompt"].get<std::string>();
    r.has_negative_prompt = true;
    r.cfg_scale = k["true_cfg_scale"].get<float>();
  }
  if (k["images"].get<int>() > 0) r.references = condition_files();
  if (!k["width"].is_null()) r.width = k["width"].get<int64_t>();
  if (!k["height"].is_null()) r.height = k["height"].get<int64_t>();
  r.resolution = m["output_resolution"].get<int64_t>();
  r.steps = m["steps"].get<int>();
  r.seed = m["seed"].get<uint64_t>();
  r.kv_cache = k["kv_cache"].get<bool>();
  return r;
}

// The whole pipeline: diffusers' RGBA pixels, with and without the prefix cache and without
// condition images.
class Qwen21Generate : public ::testing::TestWithParam<std::string> {};

TEST_P(Qwen21Generate, PixelsMatchDiffusers) {
  const std::string c = GetParam();
  const GenerateResult res = generate(pipe(), request(c));
  const Image want = load_image(dir() + "/" + c + "/output.png", PixelFormat::kRGBA);
  ASSERT_EQ(res.width, want.width);
  ASSERT_EQ(res.height, want.height);
  ASSERT_EQ(res.channels, 4);
  ASSERT_EQ(res.pixels.size(), want.pixels.size());
  const test::PixelDiff d = test::diff_pixels(res.pixels, want.pixels);
  std::printf("%s: %lld of %zu channel values differ from diffusers, max %d\n", c.c_str(),
              static_cast<long long>(d.differ), res.pixels.size(), d.worst);
  EXPECT_LE(d.worst, 1);  // the bar: within +-1 (measured: identical)
  // The stages, in order, each timed.
  std::vector<std::string> names;
  for (const StageReport& s : res.stages) names.push_back(s.name);
  const bool conds = !request(c).references.empty();
  const std::vector<std::string> want_names =
      conds ? std::vector<std::string>{"prompt", "conditions", "denoise", "decode"}
            : std::vector<std::string>{"prompt", "denoise", "decode"};
  EXPECT_EQ(names, want_names);
  EXPECT_NE(res.parameters.find("Seed: 42"), std::string::npos);
}

INSTANTIATE_TEST_SUITE_P(Cases, Qwen21Generate,
                         ::testing::Values("cfg_cached", "cfg_uncached", "t2i"));

// The exact prefix cache changes nothing: cached and uncached give the same bytes.
TEST(Qwen21Pipeline, PrefixCacheIsExact) {
  GenerateRequest r = request("cfg_cached");
  const GenerateResult a = generate(pipe(), r);
  r.kv_cache = false;
  const GenerateResult b = generate(pipe(), r);
  EXPECT_EQ(a.pixels, b.pixels);
}

TEST(Qwen21Pipeline, LayoutCountsTheProcessorsTokens) {
  const GenerateRequest r = request("cfg_cached");
  const GenerateLayout l = generate_layout(pipe(), r);
  const auto st = stages("cfg_cached");
  const Tensor& mask = st.at("prompt_pad_mask");
  int64_t slots = 0;
  for (int64_t i = 0; i < mask.numel(); ++i) slots += static_cast<int>(mask.f32()[i]);
  EXPECT_EQ(l.text_tokens, mask.numel() - slots);
  ASSERT_EQ(l.image_tokens.size(), 2u);
  EXPECT_EQ(l.image_tokens[0], 4 * 4);  // 64x64 pixels: 4x4 latent tokens
  EXPECT_EQ(l.image_tokens[1], 2 * 6);  // 96x32
  EXPECT_EQ(l.image_tokens[0] + l.image_tokens[1], 4 * slots);
  EXPECT_EQ(l.target_tokens, 2 * 6);
  EXPECT_TRUE(l.cfg);
  EXPECT_EQ(l.negative_text_tokens, st.at("negative_pad_mask").numel() - slots);
}

TEST(Qwen21Pipeline, BadRequestsAreClearErrors) {
  // A literal <|image_pad|> in the prompt: the processor refuses it (a ValueError in diffusers).
  GenerateRequest r = request("cfg_cached");
  r.prompt = "a <|image_pad|> here";
  EXPECT_THROW(generate(pipe(), r), Error);
  // Too extreme an aspect ratio for the resolution (a side rounds to 0 pixels).
  test::TempDir tmp;
  const std::string wide = (tmp.path() / "wide.png").string();
  save_png(wide, Image::blank(400, 10, "wide"));
  r = request("t2i");
  r.references = {wide};
  r.resolution = 64;  // 362 x 11 pixels: the height rounds to 0
  try {
    generate(pipe(), r);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("aspect ratio"), std::string::npos) << e.what();
  }
  // More condition images than a request takes: refused before any weight is read.
  r = request("t2i");
  r.references.assign(limits::kMaxReferences + 1, dir() + "/cond_rgb.png");
  EXPECT_THROW(generate(pipe(), r), Error);
  // A missing condition image file.
  r = request("t2i");
  r.references = {dir() + "/missing.png"};
  EXPECT_THROW(generate(pipe(), r), Error);
}

// model_index.json's sample_sigmas fix the schedule and its length, as in diffusers; a --steps
// that disagrees is refused before any work.
TEST(Qwen21Pipeline, SampleSigmasSetTheSteps) {
  test::TempDir tmp;
  const std::filesystem::path copy = tmp.path() / "pipeline";
  std::filesystem::copy(pipe(), copy, std::filesystem::copy_options::recursive);
  Json index = read_json_file((copy / "model_index.json").string());
  index["sample_sigmas"] = {1.0, 0.5};
  test::write_file((copy / "model_index.json").string(), index.dump(2));
  GenerateRequest r = request("t2i");
  r.steps = 0;
  const GenerateResult res = generate(copy.string(), r);
  EXPECT_NE(res.parameters.find("Steps: 2"), std::string::npos) << res.parameters;
  r.steps = 3;
  try {
    generate(copy.string(), r);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("sample_sigmas"), std::string::npos) << e.what();
  }
}

// The released processor's min_pixels (65,536) resizes a 64x64 condition image up again: its
// prompt slots would no longer cover its latents, so the request is refused before any weight.
TEST(Qwen21Pipeline, ProcessorResizingAConditionImageIsRefused) {
  test::TempDir tmp;
  const std::filesystem::path copy = tmp.path() / "pipeline";
  std::filesystem::copy(pipe(), copy, std::filesystem::copy_options::recursive);
  const std::string pc = (copy / "processor/preprocessor_config.json").string();
  Json cfg = read_json_file(pc);
  cfg["size"]["shortest_edge"] = 65536;
  test::write_file(pc, cfg.dump(2));
  GenerateRequest r = request("cfg_cached");
  r.references = {condition_files()[0]};
  try {
    generate(copy.string(), r);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("raise --resolution"), std::string::npos) << e.what();
  }
}

TEST(Qwen21Pipeline, InspectListsTheComponents) {
  const InspectReport r = inspect(pipe());
  EXPECT_EQ(r.pipeline_class, "QwenImage21Pipeline");
  EXPECT_TRUE(r.problems.empty()) << r.problems.front();
  std::vector<std::string> names;
  for (const ComponentReport& c : r.components) names.push_back(c.name);
  EXPECT_EQ(names, (std::vector<std::string>{"processor", "scheduler", "text_encoder",
                                             "transformer", "vae"}));
}

}  // namespace
}  // namespace flowkv
