// Level 6 of the test ladder, stage by stage: the tiny FLUX.2 Klein pipelines of
// python/ref/dump_klein_pipeline.py (diffusers 0.42.1 Flux2KleinKVPipeline and
// Flux2KleinPipeline, f32), each stage fed the dumped input of that stage and compared with the
// dumped output. Here: the denoising loop from the prompt embeddings, the reference latents and
// the seeded noise to the final latents, with the reference rule the pipeline folder names.
#include <gtest/gtest.h>

#include "flowkv/model.h"
#include "golden_util.h"
#include "io/pipeline_folder.h"
#include "temp_files.h"

namespace flowkv {
namespace {

using test::golden;

// max |got - ref| <= kTol * max |ref|: f32 through 3 steps of 3 blocks.
constexpr double kTol = 1e-5;

struct Case {
  std::string name;
  std::string pipeline_class;
};

DenoiseInputs inputs_of(const std::map<std::string, Tensor>& st) {
  DenoiseInputs in;
  in.prompt.embeds = st.at("prompt_embeds");
  in.noise = st.at("noise");
  in.height = 48 / 16, in.width = 64 / 16;  // meta.json: 48x64 pixels, /16 tokens
  in.references.push_back({st.at("reference_latents"), 64 / 16, 80 / 16});  // 64x80 pixels
  return in;
}

class KleinPipelineStages : public ::testing::TestWithParam<Case> {};

TEST_P(KleinPipelineStages, DenoiseFromDumpedInputsMatchesFinalLatents) {
  const Case& c = GetParam();
  const std::string dir = golden("klein_pipeline/" + c.name);
  const std::optional<PipelineFolder> p = find_pipeline_folder(dir + "/pipeline");
  ASSERT_TRUE(p);
  EXPECT_EQ(p->class_name, c.pipeline_class);
  EXPECT_EQ(p->component("transformer").class_name, "Flux2Transformer2DModel");
  // The transformer's own folder finds its pipeline too (it says which reference rule holds).
  ASSERT_TRUE(find_pipeline_folder(dir + "/pipeline/transformer/"));

  const auto st = test::load_tensors(dir + "/stages.safetensors");
  const Model m = Model::load(dir + "/pipeline", "f32");
  DenoiseOptions o;
  o.steps = 3;
  for (KVMode mode : {KVMode::kCached, KVMode::kRecompute}) {
    o.mode = mode;
    const Tensor got = denoise(m, inputs_of(st), o).latents;
    const Tensor& ref = st.at("final_latents");
    ASSERT_EQ(got.shape(), ref.shape());
    const test::ErrorStats e = test::compare(got.f32(), ref.f32(), ref.numel());
    EXPECT_LE(e.rel(), kTol) << c.name << (mode == KVMode::kCached ? " cached" : " recomputed")
                             << ": max abs " << e.max_abs << ", NMSE " << e.nmse();
  }
}

// The rule matters: Klein's transformer taken out of its pipeline folder runs under Klein KV's
// rules (what a bare transformer gets), which is not what Flux2KleinPipeline computes.
TEST(KleinPipelineRules, BareTransformerOfTheJointPipelineGetsKleinKVRules) {
  const std::string dir = golden("klein_pipeline/base");
  test::TempDir tmp;
  std::filesystem::copy(dir + "/pipeline/transformer", tmp.path() / "transformer");
  const auto st = test::load_tensors(dir + "/stages.safetensors");
  DenoiseOptions o;
  o.steps = 3;
  const Tensor got =
      denoise(Model::load((tmp.path() / "transformer").string(), "f32"), inputs_of(st), o).latents;
  const Tensor& ref = st.at("final_latents");
  // (The tiny random model reads its references weakly: the wrong rule is ~15x the tolerance.)
  EXPECT_GT(test::compare(got.f32(), ref.f32(), ref.numel()).rel(), 10 * kTol);
}

INSTANTIATE_TEST_SUITE_P(Golden, KleinPipelineStages,
                         ::testing::Values(Case{"kv", "Flux2KleinKVPipeline"},
                                           Case{"base", "Flux2KleinPipeline"}),
                         [](const auto& i) { return i.param.name; });

// The pipeline index is input: a malformed one is an error naming the file and the field.
TEST(PipelineFolder, MalformedIndexIsAClearError) {
  test::TempDir dir;
  auto write = [&](const std::string& text) {
    std::FILE* f = std::fopen((dir.path() / "model_index.json").c_str(), "wb");
    std::fputs(text.c_str(), f);
    std::fclose(f);
  };
  write("[1, 2]");
  test::expect_error([&] { find_pipeline_folder(dir.path().string()); },
                     {"model_index.json", "not a JSON object"});
  write(R"({"vae": ["diffusers", "AutoencoderKLFlux2"]})");
  test::expect_error([&] { find_pipeline_folder(dir.path().string()); }, {"_class_name"});
  write(R"({"_class_name": "X", "vae": ["diffusers"]})");
  test::expect_error([&] { find_pipeline_folder(dir.path().string()); }, {"'vae'", "[library"});
  write(R"({"_class_name": "X", "../x": ["a", "b"]})");
  test::expect_error([&] { find_pipeline_folder(dir.path().string()); }, {"not a folder name"});
  write(
      R"({"_class_name": "X", "vae": ["diffusers", "AutoencoderKLFlux2"], "safety": [null, null]})");
  const auto p = find_pipeline_folder(dir.path().string());
  ASSERT_TRUE(p);
  EXPECT_EQ(p->components.size(), 1u);
  test::expect_error([&] { p->component("transformer"); }, {"no 'transformer' component"});
}

}  // namespace
}  // namespace flowkv
