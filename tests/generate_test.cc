// Level 6 of the test ladder: the tiny FLUX.2 Klein pipelines of
// python/ref/dump_klein_pipeline.py (diffusers 0.42.1 Flux2KleinKVPipeline and
// Flux2KleinPipeline, f32) from a prompt string, a reference PNG and a seed to the output PNG.
// Each stage is checked alone against the dumped tensor between stages (so a mismatch names its
// stage), then generate() end to end against diffusers' pixels.
#include <gtest/gtest.h>

#include <filesystem>

#include "core/arena.h"
#include "core/random.h"
#include "flowkv/generate.h"
#include "flowkv/inspect.h"
#include "golden_util.h"
#include "io/image.h"
#include "models/flux2_vae/model.h"
#include "models/qwen3/model.h"
#include "pipeline/reference_image.h"
#include "temp_files.h"
#include "text/tokenizer.h"

namespace flowkv {
namespace {

using test::golden;

struct Case {
  std::string name;
};

class KleinPipeline : public ::testing::TestWithParam<Case> {
 protected:
  std::string dir() const { return golden("klein_pipeline/" + GetParam().name); }
  std::string pipe() const { return dir() + "/pipeline"; }
  Json meta() const { return read_json_file(dir() + "/meta.json"); }
  std::map<std::string, Tensor> stages() const {
    return test::load_tensors(dir() + "/stages.safetensors");
  }
  GenerateRequest request() const {
    const Json m = meta();
    GenerateRequest r;
    r.prompt = m["prompt"].get<std::string>();
    r.references = {golden("klein_pipeline/reference.png")};
    r.width = m["width"].get<int64_t>();
    r.height = m["height"].get<int64_t>();
    r.steps = m["steps"].get<int>();
    r.seed = m["seed"].get<uint64_t>();
    return r;
  }
};

void expect_close(const Tensor& got, const Tensor& ref, double tol, const std::string& what) {
  ASSERT_EQ(got.shape(), ref.shape()) << what;
  const test::ErrorStats e = test::compare(got.f32(), ref.f32(), ref.numel());
  EXPECT_LE(e.rel(), tol) << what << ": max abs " << e.max_abs << ", max |ref| " << e.max_ref;
}

TEST_P(KleinPipeline, TokensMatchTheTokenizer) {
  const auto st = stages();
  const text::Tokenizer tok = text::Tokenizer::from_json_file(pipe() + "/tokenizer/tokenizer.json");
  const text::PromptTokens t = text::klein_prompt_tokens(tok, request().prompt, 512);
  const Tensor& ids = st.at("input_ids");
  const Tensor& mask = st.at("attention_mask");
  ASSERT_EQ(static_cast<int64_t>(t.ids.size()), ids.numel());
  for (int64_t i = 0; i < ids.numel(); ++i) {
    ASSERT_EQ(t.ids[static_cast<size_t>(i)], static_cast<int32_t>(ids.f32()[i])) << "token " << i;
    ASSERT_EQ(t.mask[static_cast<size_t>(i)], static_cast<int32_t>(mask.f32()[i])) << "mask " << i;
  }
  EXPECT_FALSE(t.truncated);
}

TEST_P(KleinPipeline, PromptEmbeddingsMatchTheTextEncoder) {
  const auto st = stages();
  const Tensor& ids = st.at("input_ids");
  const Tensor& mask = st.at("attention_mask");
  std::vector<int32_t> i32(static_cast<size_t>(ids.numel())), m32(i32.size());
  for (size_t i = 0; i < i32.size(); ++i) {
    i32[i] = static_cast<int32_t>(ids.f32()[i]);
    m32[i] = static_cast<int32_t>(mask.f32()[i]);
  }
  qwen3::LoadOptions lo;
  lo.last_hidden_state = 27;
  const qwen3::Encoder enc = qwen3::Encoder::load(pipe() + "/text_encoder", lo);
  Arena arena;
  const Tensor e =
      qwen3::klein_prompt_embeds(ExecContext{&arena}, enc, {.ids = i32, .mask = m32, .batch = 1});
  expect_close(e, st.at("prompt_embeds"), 1e-5, "prompt embeddings");
}

TEST_P(KleinPipeline, ReferenceAndNoiseMatchThePipeline) {
  const auto st = stages();
  const std::string ref = golden("klein_pipeline/reference.png");
  const Tensor pixels = image_to_tensor(flux2_reference_image(load_image(ref), ref));
  expect_close(pixels, st.at("reference_pixels"), 0, "reference pixels");
  const flux2_vae::Vae vae = flux2_vae::Vae::load(pipe() + "/vae");
  const Tensor z = vae.encode(ExecContext{}, pixels);
  expect_close(flux2_vae::pack(z), st.at("reference_latents"), 1e-5, "reference latents");
  TorchGenerator g(request().seed);
  const Tensor& noise = st.at("noise");  // [1, h*w, C], drawn as [1, C, h, w]
  const Tensor drawn = randn_tensor(g, {1, noise.dim(2), 48 / 16, 64 / 16});
  expect_close(flux2_vae::pack(drawn), noise, 0, "noise");
}

TEST_P(KleinPipeline, DecodeMatchesThePipeline) {
  const auto st = stages();
  const flux2_vae::Vae vae = flux2_vae::Vae::load(pipe() + "/vae");
  const Tensor& fin = st.at("final_latents");  // [1, h*w, C]
  const Tensor rgb = vae.decode(ExecContext{}, flux2_vae::unpack(fin, 48 / 16, 64 / 16));
  expect_close(rgb, st.at("decoded"), 1e-5, "decoded pixels");
  const Image out = tensor_to_image(st.at("decoded"));
  const Image want = load_image(dir() + "/output.png");
  EXPECT_EQ(out.pixels, want.pixels) << "diffusers' postprocess of its own decoded tensor";
}

// End to end: the picture diffusers made, within +-1 per channel, with the parameters in it.
TEST_P(KleinPipeline, GenerateMatchesDiffusersPixels) {
  const GenerateRequest req = request();
  std::vector<std::string> seen;
  GenerateProgress p;
  p.end = [&](const StageReport& r) { seen.push_back(r.name); };
  const GenerateResult res = generate(pipe(), req, p);
  EXPECT_EQ(seen, (std::vector<std::string>{"prompt", "references", "denoise", "decode"}));
  const Image want = load_image(dir() + "/output.png");
  ASSERT_EQ(res.width, want.width);
  ASSERT_EQ(res.height, want.height);
  const test::PixelDiff d = test::diff_pixels(res.pixels, want.pixels);
  EXPECT_LE(d.worst, 1) << d.differ << " channel values differ";
  std::printf("  %s: %lld of %zu channel values differ from diffusers' (max %d)\n",
              GetParam().name.c_str(), static_cast<long long>(d.differ), want.pixels.size(),
              d.worst);
  test::TempDir tmp;
  const std::string out = (tmp.path() / "out.png").string();
  save_png(out, res);
  EXPECT_EQ(read_png_parameters(out), res.parameters);
  EXPECT_NE(res.parameters.find("Seed: 42"), std::string::npos) << res.parameters;
}

// inspect on a pipeline folder: every component, its class and bytes, and that they fit.
TEST_P(KleinPipeline, InspectListsEveryComponent) {
  const InspectReport r = inspect(pipe());
  EXPECT_TRUE(r.ok()) << format_report(r);
  EXPECT_EQ(r.family, "FLUX.2");
  ASSERT_EQ(r.components.size(), 5u);
  std::map<std::string, std::string> classes;
  for (const ComponentReport& c : r.components) classes[c.name] = c.class_name;
  EXPECT_EQ(classes["text_encoder"], "Qwen3ForCausalLM");
  EXPECT_EQ(classes["vae"], "AutoencoderKLFlux2");
  for (const ComponentReport& c : r.components) {
    if (c.name == "text_encoder" || c.name == "vae" || c.name == "transformer") {
      EXPECT_GT(c.parameters, 0) << c.name;
      EXPECT_GT(c.bytes_by_dtype.at("F32"), 0) << c.name;
    }
  }
  EXPECT_NE(format_report(r).find("pipeline:"), std::string::npos);
}

INSTANTIATE_TEST_SUITE_P(Golden, KleinPipeline, ::testing::Values(Case{"kv"}, Case{"base"}),
                         [](const auto& i) { return i.param.name; });

// What a user gets wrong: each a flowkv::Error that says what to do, before any work is done.
TEST(GenerateErrors, BadInputsAreClearErrors) {
  const std::string kv = golden("klein_pipeline/kv/pipeline");
  GenerateRequest r;
  r.prompt = "a fox";
  test::expect_error([&] { generate(golden("flux2/multi_guidance/transformer"), r); },
                     {"not a diffusers pipeline folder", "model_index.json"});
  r.references = {golden("klein_pipeline/kv/meta.json")};
  test::expect_error([&] { generate(kv, r); }, {"meta.json"});
  r.references = {"/nonexistent/ref.png"};
  test::expect_error([&] { generate(kv, r); }, {"/nonexistent/ref.png"});
}

// A pipeline whose components do not fit together is refused before anything loads.
TEST(GenerateErrors, MismatchedComponentsAreNamed) {
  test::TempDir tmp;
  const std::filesystem::path p = tmp.path() / "pipe";
  std::filesystem::copy(golden("klein_pipeline/kv/pipeline"), p,
                        std::filesystem::copy_options::recursive);
  Json te = read_json_file((p / "text_encoder/config.json").string());
  te["hidden_size"] = 24;
  te["head_dim"] = 12;
  std::FILE* f = std::fopen((p / "text_encoder/config.json").c_str(), "wb");
  std::fputs(te.dump().c_str(), f);
  std::fclose(f);
  GenerateRequest r;
  r.prompt = "a fox";
  test::expect_error([&] { generate(p.string(), r); },
                     {"joint_attention_dim", "mismatched components"});
  const InspectReport rep = inspect(p.string());
  EXPECT_EQ(rep.pipeline_class, "Flux2KleinKVPipeline");
  ASSERT_FALSE(rep.ok());
  EXPECT_NE(rep.problems.back().find("joint_attention_dim"), std::string::npos)
      << format_report(rep);
  std::filesystem::remove_all(p / "vae");
  test::expect_error([&] { generate(p.string(), r); }, {"vae"});
}

}  // namespace
}  // namespace flowkv
