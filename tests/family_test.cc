// The family registry through the public API: every registered family's built-in models load,
// run one forward, export to a folder that is detected and loads back to the same model, and
// predict; a family is found by name, alias, built-in, released shape and checkpoint. A new
// family gets these tests by registering (the cases come from registered_families()).
#include <gtest/gtest.h>

#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "family_cases.h"
#include "flowkv/error.h"
#include "flowkv/inspect.h"
#include "flowkv/model.h"
#include "flowkv/predict.h"
#include "flowkv/step_cache.h"
#include "temp_files.h"

namespace flowkv {
namespace {

using Case = test::FamilyCase;
using test::all_builtins;
using test::same_bits;

// A small request every family takes: 4x4 tokens (a multiple of every grid_multiple).
DenoiseInputs small_inputs(const Model& m, uint64_t seed) {
  return example_inputs(m, {.text_tokens = 8, .height = 4, .width = 4, .seed = seed});
}

// The forward, or nullopt (with the reason) where the family has none yet.
std::optional<Tensor> forward_or_reason(const Model& m, const DenoiseInputs& in,
                                        std::string* reason) {
  try {
    return forward(m, in);
  } catch (const Error& e) {
    if (std::string(e.what()).find("not available yet") == std::string::npos) throw;
    *reason = e.what();
    return std::nullopt;
  }
}

class FamilyBuiltin : public ::testing::TestWithParam<Case> {};

TEST_P(FamilyBuiltin, LoadsThroughTheRegistry) {
  const Model m = Model::builtin(GetParam().builtin, 1);
  EXPECT_EQ(m.family().name, GetParam().family);
  EXPECT_EQ(detect_family(GetParam().builtin).name, GetParam().family);
  EXPECT_FALSE(m.variant().empty());
  EXPECT_EQ(m.compute_dtype(), "F32");
  EXPECT_GT(m.in_channels(), 0);
  EXPECT_GT(m.text_channels(), 0);
}

TEST_P(FamilyBuiltin, ForwardIsShapedFiniteAndDeterministic) {
  const Model m = Model::builtin(GetParam().builtin, 1);
  const DenoiseInputs in = small_inputs(m, 2);
  std::string why;
  const std::optional<Tensor> out = forward_or_reason(m, in, &why);
  if (!out) GTEST_SKIP() << GetParam().family << ": " << why;
  ASSERT_EQ(out->ndim(), 3);
  EXPECT_EQ(out->dim(0), 1);
  EXPECT_EQ(out->dim(1), 16);
  for (int64_t i = 0; i < out->numel(); ++i) ASSERT_TRUE(std::isfinite(out->f32()[i])) << i;
  EXPECT_TRUE(same_bits(*out, forward(m, in)));
  // Other inputs, another output.
  EXPECT_FALSE(same_bits(*out, forward(m, small_inputs(m, 3))));
}

TEST_P(FamilyBuiltin, ExportedFolderIsDetectedAndLoadsBackTheSameModel) {
  const test::TempDir dir;
  const std::string path = dir.file("model");
  export_builtin(GetParam().builtin, 7, "f32", path);
  EXPECT_EQ(detect_family(path).name, GetParam().family);
  const InspectReport r = inspect(path);
  EXPECT_TRUE(r.ok()) << format_report(r);
  const Model loaded = Model::load(path);
  const Model built = Model::builtin(GetParam().builtin, 7);
  EXPECT_EQ(loaded.family().name, GetParam().family);
  EXPECT_EQ(loaded.config_json(), built.config_json());
  const DenoiseInputs in = small_inputs(built, 4);
  std::string why;
  const std::optional<Tensor> out = forward_or_reason(built, in, &why);
  if (!out) GTEST_SKIP() << GetParam().family << ": " << why;
  EXPECT_TRUE(same_bits(*out, forward(loaded, in)));
}

TEST_P(FamilyBuiltin, PredictsItsCacheFromTheLoadedModel) {
  const Model m = Model::builtin(GetParam().builtin, 1);
  const FamilyInfo& f = m.family();
  const KVPrediction p = predict(
      m, 8, f.takes_images ? std::vector<int64_t>{16} : std::vector<int64_t>{}, 16, 4, f.true_cfg);
  EXPECT_EQ(p.steps, 4);
  EXPECT_EQ(p.branches, f.true_cfg ? 2 : 1);
  EXPECT_GT(p.layers, 0);
  if (f.exact_cache.empty()) {  // a family without one (Qwen-Image): nothing kept, nothing saved
    EXPECT_EQ(p.kv_bytes, 0);
    EXPECT_EQ(p.speedup, 1.0);
    EXPECT_GT(p.uncached_step_flops, 0);
    return;
  }
  EXPECT_GT(p.kv_bytes, 0);  // the image's (or the text's) K/V at least
  EXPECT_GT(p.speedup, 1.0);
}

TEST_P(FamilyBuiltin, StepCachesAreCheckedAgainstTheModel) {
  const Model m = Model::builtin(GetParam().builtin, 1);
  // The tables TeaCache and MagCache read come with the model.
  EXPECT_NO_THROW(check_step_caches({"teacache", "magcache:ratios=flux1"}, m));
  // Block counts: any model could take these without one; this one cannot.
  EXPECT_NO_THROW(check_step_caches({"dbcache:fn=500,bn=500"}));
  EXPECT_THROW(check_step_caches({"dbcache:fn=500,bn=500"}, m), Error);
  EXPECT_THROW(check_step_caches({"magcache:ratios=nosuch"}, m), Error);
}

INSTANTIATE_TEST_SUITE_P(Registered, FamilyBuiltin, ::testing::ValuesIn(all_builtins()),
                         [](const auto& i) { return test::case_name(i.param); });

TEST(FamilyRegistry, FindsFamiliesByNameAliasAndReleasedShape) {
  const std::vector<FamilyInfo> all = registered_families();
  ASSERT_FALSE(all.empty());
  std::vector<std::string> released;
  for (const FamilyInfo& f : all) {
    EXPECT_EQ(family_info(f.name).name, f.name);
    for (const std::string& a : f.aliases) EXPECT_EQ(family_info(a).name, f.name) << a;
    for (const std::string& r : f.released) {
      EXPECT_EQ(detect_family(r).name, f.name) << r;
      released.push_back(r);
    }
    EXPECT_TRUE(f.builtins.empty() || !f.default_builtin.empty()) << f.name;
  }
  EXPECT_EQ(released_model_names(), released);
  EXPECT_EQ(family_info("klein").name, "flux2");  // bench --family klein, as before
  test::expect_error([] { family_info("nosuch"); }, {"nosuch", "flux2", "qwen21"});
  test::expect_error([] { detect_family("nosuch"); }, {"nosuch", "klein-9b-kv", "qwen21-tiny"});
}

TEST(FamilyRegistry, DetectsCheckpointsByTheirConfig) {
  const std::string g = FLOWKV_GOLDEN_DIR;
  EXPECT_EQ(detect_family(g + "/flux2/multi_guidance/transformer").name, "flux2");
  EXPECT_EQ(detect_family(g + "/flux2/multi_guidance/transformer/config.json").name, "flux2");
  EXPECT_EQ(detect_family(g + "/qwen_image21/refs/transformer").name, "qwen21");
  EXPECT_EQ(detect_family(g + "/qwen_image/t2i/transformer").name, "qwen-image");
}

// Qwen-Image runs (tests/qwen_image_pipeline_test.cc checks it against diffusers) and has no
// exact cache: its prediction saves nothing, and the report says which rule breaks.
TEST(FamilyRegistry, QwenImageRunsWithoutAnExactCache) {
  const std::string path = std::string(FLOWKV_GOLDEN_DIR) + "/qwen_image/t2i/transformer";
  EXPECT_TRUE(inspect(path).ok());
  EXPECT_EQ(Model::load(path).family().name, "qwen-image");
  PredictRequest r;
  r.model = "qwen-image";
  const KVPrediction p = predict(r);
  EXPECT_EQ(p.kv_bytes, 0);
  EXPECT_DOUBLE_EQ(p.speedup, 1.0);
  EXPECT_NE(cacheability_report("qwen-image", 8, {16}, 16).find("target: no"), std::string::npos);
}

// FLOWKV_CLI (ctest sets it, tests/CMakeLists.txt); without it: skipped.
TEST(FamilyCli, BenchListsEveryBenchableFamily) {
  const char* cli = std::getenv("FLOWKV_CLI");
  if (cli == nullptr || *cli == '\0') GTEST_SKIP() << "FLOWKV_CLI not set";
  FILE* pipe = popen(("'" + std::string(cli) + "' bench --help").c_str(), "r");
  ASSERT_NE(pipe, nullptr) << cli;
  std::string out;
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, pipe)) > 0;) out.append(buf, n);
  ASSERT_EQ(pclose(pipe), 0) << out;
  for (const FamilyInfo& f : registered_families()) {
    const bool benchable = !f.exact_cache.empty() && !f.builtins.empty();
    EXPECT_EQ(out.find("--family " + f.name + " ") != std::string::npos ||
                  out.find("--family " + f.name + ":") != std::string::npos,
              benchable)
        << f.name << "\n"
        << out;
  }
}

}  // namespace
}  // namespace flowkv
