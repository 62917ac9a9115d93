// Level 6 of the test ladder for Qwen-Image: the tiny QwenImagePipeline and
// QwenImageEditPlusPipeline of python/ref/dump_qwen_image_pipeline.py (diffusers 0.42.1,
// transformers 5.24.0, f32) from a prompt, a negative prompt, pictures and a seed to diffusers'
// PNG: text to image with and without true CFG, Edit-Plus with two pictures of different sizes,
// Edit-2511 (zero_cond_t), and FirstBlockCache's decisions step for step. The prompt stage and
// the noise are checked alone against the tensors dumped between stages, then generate() end to
// end against diffusers' pixels.
#include <gtest/gtest.h>

#include <filesystem>

#include "core/arena.h"
#include "flowkv/error.h"
#include "flowkv/generate.h"
#include "flowkv/inspect.h"
#include "flowkv/pipeline.h"
#include "golden_util.h"
#include "io/image.h"
#include "io/json.h"
#include "models/qwen25_vl/prompt_encoder.h"
#include "pipeline/condition_image.h"
#include "temp_files.h"
#include "test_util.h"

namespace flowkv {
namespace {

using test::golden;

std::string dir() {
  return golden("qwen_image_pipeline");
}
Json meta() {
  return read_json_file(dir() + "/meta.json");
}
std::map<std::string, Tensor> stages(const std::string& c) {
  return test::load_tensors(dir() + "/" + c + "/stages.safetensors");
}

// The folder each case runs: text to image, Edit-Plus, Edit-Plus with the 2511 transformer.
std::string folder_of(const std::string& c) {
  if (c.rfind("t2i", 0) == 0) return dir() + "/pipeline_t2i";
  return dir() + (c == "edit_2511" ? "/pipeline_2511" : "/pipeline");
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
  const int pictures = k["images"].get<int>();
  if (pictures == 2) r.references = {dir() + "/pic_a.png", dir() + "/pic_b.png"};
  if (pictures == 1) r.references = {dir() + "/pic_b.png"};
  r.width = k["width"].get<int64_t>();
  r.height = k["height"].get<int64_t>();
  r.steps = k["steps"].get<int>();
  r.seed = m["seed"].get<uint64_t>();
  if (k.contains("fbcache")) {
    r.step_caches = {"fbcache:threshold=" +
                     std::to_string(k["fbcache"]["threshold"].get<double>())};
  }
  return r;
}

void expect_close(const Tensor& got, const Tensor& ref, double tol, const std::string& what) {
  ASSERT_EQ(got.numel(), ref.numel()) << what;
  const test::ErrorStats e = test::compare(got.f32(), ref.f32(), ref.numel());
  EXPECT_LE(e.rel(), tol) << what << ": max abs " << e.max_abs << ", max |ref| " << e.max_ref;
}

// Stage "prompt" alone: both branches of text to image (the tokenizer) and of Edit-Plus (the
// processor, the two pictures' 384^2 copies through the vision tower) against diffusers'.
TEST(QwenImagePipeline, PromptEmbeddingsMatchBothBranches) {
  const Json m = meta();
  const std::string p = dir() + "/pipeline";
  for (const bool edit : {false, true}) {
    const auto st = stages(edit ? "edit_plus" : "t2i_cfg");
    const auto enc = qwen25_vl::PromptEncoder::load(p + "/text_encoder",
                                                    p + (edit ? "/processor" : "/tokenizer"),
                                                    edit ? p + "/processor" : "");
    std::vector<Image> pictures;
    if (edit) {
      for (const char* f : {"/pic_a.png", "/pic_b.png"}) {
        const Image im = load_image(dir() + f, PixelFormat::kRGB);
        const auto [w, h] = qwen21_dimensions(384, im.width, im.height, f);
        pictures.push_back(resize_lanczos(im, w, h));
      }
    }
    for (const auto& [branch, text] :
         {std::pair<std::string, std::string>{"prompt", m["prompt"].get<std::string>()},
          {"negative", m["negative_prompt"].get<std::string>()}}) {
      Arena arena;
      const qwen25_vl::PromptEncoding e =
          enc.encode(ExecContext{&arena}, text, pictures, edit ? 0 : 512);
      expect_close(e.embeds, st.at(branch + "_embeds"), 1e-5,
                   std::string(edit ? "edit-plus " : "t2i ") + branch);
    }
  }
}

// A released-shape pipeline of zero weights (sparse files) opens, its components fit, and a
// request plans as the real one would: the predictor's and admission's view at 1024^2.
TEST(QwenImagePipeline, ZeroExportPlansARealSizeRequest) {
  test::TempDir tmp;
  const std::string d = (tmp.path() / "qi").string();
  export_zero_weights("qwen-image-edit-plus-pipeline", "bf16", d);
  for (const char* sub : {"/tokenizer", "/processor"}) {  // the user's tokenizer files
    std::filesystem::copy_file(dir() + "/pipeline/tokenizer/tokenizer.json",
                               d + sub + "/tokenizer.json");
  }
  GenerateRequest r = request("edit_plus");
  r.width = r.height = 0;
  const GenerateLayout l = generate_layout(d, r);
  EXPECT_EQ(l.width, 1440);  // the last picture's aspect ratio (2:1) at 1024^2 pixels
  EXPECT_EQ(l.height, 736);
  EXPECT_EQ(l.target_tokens, (1440 / 16) * (736 / 16));
  ASSERT_EQ(l.image_tokens.size(), 2u);
  EXPECT_GT(l.text_tokens, 2 * 196);  // each picture's 384^2 copy is 196 vision tokens
}

class QwenImageGenerate : public ::testing::TestWithParam<std::string> {};

// The whole pipeline: diffusers' pixels within +-1, the stages in order, FirstBlockCache's
// decisions call for call.
TEST_P(QwenImageGenerate, PixelsMatchDiffusers) {
  const std::string c = GetParam();
  const GenerateRequest r = request(c);
  const GenerateResult res = generate(folder_of(c), r);
  const Image want = load_image(dir() + "/" + c + "/output.png", PixelFormat::kRGB);
  ASSERT_EQ(res.width, want.width);
  ASSERT_EQ(res.height, want.height);
  ASSERT_EQ(res.channels, 3);
  const test::PixelDiff d = test::diff_pixels(res.pixels, want.pixels);
  std::printf("%s: %lld of %zu channel values differ from diffusers, max %d\n", c.c_str(),
              static_cast<long long>(d.differ), res.pixels.size(), d.worst);
  EXPECT_LE(d.worst, 1);
  std::vector<std::string> names;
  for (const StageReport& s : res.stages) names.push_back(s.name);
  const std::vector<std::string> want_names =
      r.references.empty() ? std::vector<std::string>{"prompt", "denoise", "decode"}
                           : std::vector<std::string>{"prompt", "references", "denoise", "decode"};
  EXPECT_EQ(names, want_names);
  EXPECT_NE(res.parameters.find("Seed: 42"), std::string::npos);
  const Json k = meta()["cases"][c];
  if (k.contains("fbcache")) {
    ASSERT_EQ(res.step_caches.size(), 1u);
    EXPECT_EQ(res.step_caches[0].decisions, k["fbcache"]["calls"].get<std::string>());
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, QwenImageGenerate,
                         ::testing::Values("t2i", "t2i_cfg", "t2i_fbcache", "edit_plus",
                                           "edit_2511"));

// The layout counts the prompt's rows, the pictures' latent tokens (1024^2 copies) and the
// target before any weight is read.
TEST(QwenImagePipeline, LayoutCountsTokens) {
  const GenerateRequest r = request("edit_plus");
  const GenerateLayout l = generate_layout(folder_of("edit_plus"), r);
  const auto st = stages("edit_plus");
  EXPECT_EQ(l.text_tokens, st.at("prompt_embeds").dim(1));
  EXPECT_EQ(l.negative_text_tokens, st.at("negative_embeds").dim(1));
  ASSERT_EQ(l.image_tokens.size(), 2u);
  // calculate_dimensions(1024^2, 80 / 72) = 1088 x 960; (1024^2, 100 / 50) = 1440 x 736.
  EXPECT_EQ(l.image_tokens[0], (1088 / 16) * (960 / 16));
  EXPECT_EQ(l.image_tokens[1], (1440 / 16) * (736 / 16));
  EXPECT_EQ(l.target_tokens, st.at("noise").dim(1));
  EXPECT_TRUE(l.cfg);
}

// Without a negative prompt a scale changes nothing; with one, the default scale is 4 (the
// pipeline's true_cfg_scale), so a request that gives none runs guidance as diffusers does.
TEST(QwenImagePipeline, DefaultCfgScaleIsThePipelines) {
  GenerateRequest r = request("t2i_cfg");
  r.cfg_scale = 0;  // the pipeline's default
  const GenerateResult a = generate(folder_of("t2i_cfg"), r);
  const Image want = load_image(dir() + "/t2i_cfg/output.png", PixelFormat::kRGB);
  EXPECT_LE(test::diff_pixels(a.pixels, want.pixels).worst, 1);
  EXPECT_NE(a.parameters.find("CFG scale: 4"), std::string::npos) << a.parameters;
}

TEST(QwenImagePipeline, BadRequestsAreClearErrors) {
  auto expect_error = [](const std::string& folder, const GenerateRequest& r,
                         const std::string& needle) {
    try {
      (void)generate_layout(folder, r);
      ADD_FAILURE() << "no error for " << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  // More pictures than Edit-Plus takes.
  GenerateRequest r = request("edit_plus");
  r.references = {dir() + "/pic_a.png", dir() + "/pic_b.png", dir() + "/pic_a.png",
                  dir() + "/pic_b.png"};
  expect_error(folder_of("edit_plus"), r, "1 to 3");
  // No picture for an edit; a picture for text to image.
  r = request("edit_plus");
  r.references.clear();
  expect_error(folder_of("edit_plus"), r, "edits 1 to 3 pictures");
  r = request("t2i");
  r.references = {dir() + "/pic_a.png"};
  expect_error(folder_of("t2i"), r, "takes no pictures");
  // A picture too thin for one latent token at 1024^2 pixels.
  test::TempDir tmp;
  const std::string thin = (tmp.path() / "thin.png").string();
  save_png(thin, Image::blank(8000, 2, "thin"));
  r = request("edit_2511");
  r.references = {thin};
  expect_error(folder_of("edit_2511"), r, "aspect ratio");
  // An output smaller than one latent token.
  r = request("t2i");
  r.width = 8;
  expect_error(folder_of("t2i"), r, "one latent token");
  // max_sequence_length over the pipeline's limit.
  r = request("t2i");
  r.max_sequence_length = 2000;
  expect_error(folder_of("t2i"), r, "max_sequence_length");
}

// A component that does not fit is refused before any weight loads.
TEST(QwenImagePipeline, MismatchedComponentsAreRefused) {
  test::TempDir tmp;
  const std::filesystem::path copy = tmp.path() / "pipeline";
  std::filesystem::copy(dir() + "/pipeline", copy, std::filesystem::copy_options::recursive);
  const std::string tc = (copy / "transformer/config.json").string();
  Json cfg = read_json_file(tc);
  cfg["joint_attention_dim"] = 48;
  test::write_file(tc, cfg.dump(2));
  try {
    (void)Pipeline::open(copy.string());
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("joint_attention_dim"), std::string::npos) << e.what();
  }
}

// A llama.cpp GGUF of the language model as the text encoder (how ComfyUI users hold it): text to
// image runs; Edit-Plus, which needs the vision tower llama.cpp keeps elsewhere, is refused when
// the folder opens, naming the fix.
TEST(QwenImagePipeline, LlamaCppTextEncoderServesTextToImageOnly) {
  test::TempDir tmp;
  namespace fs = std::filesystem;
  for (const char* name : {"pipeline", "pipeline_t2i"}) {
    const fs::path copy = tmp.path() / name;
    fs::create_directories(copy);
    for (const auto& e : fs::directory_iterator(dir() + "/pipeline")) {
      if (e.path().filename() != "text_encoder")
        fs::create_directory_symlink(fs::canonical(e.path()), copy / e.path().filename());
    }
    fs::create_directories(copy / "text_encoder");
    fs::copy_file(dir() + "/pipeline/text_encoder/config.json", copy / "text_encoder/config.json");
    fs::copy_file(golden("qwen25_vl_gguf/text_encoder-f16.gguf"),
                  copy / "text_encoder/text_encoder-f16.gguf");
  }
  fs::remove(tmp.path() / "pipeline_t2i/model_index.json");
  fs::copy_file(dir() + "/pipeline_t2i/model_index.json",
                tmp.path() / "pipeline_t2i/model_index.json");
  try {
    (void)Pipeline::open((tmp.path() / "pipeline").string());
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no vision tower"), std::string::npos) << e.what();
  }
  const GenerateResult res = generate((tmp.path() / "pipeline_t2i").string(), request("t2i"));
  const Image want = load_image(dir() + "/t2i/output.png", PixelFormat::kRGB);
  const test::PixelDiff d = test::diff_pixels(res.pixels, want.pixels);
  std::printf("t2i with an f16 llama.cpp text encoder: max %d off diffusers' f32\n", d.worst);
  EXPECT_LE(d.worst, 8);
}

TEST(QwenImagePipeline, InspectListsTheComponents) {
  const InspectReport r = inspect(dir() + "/pipeline");
  EXPECT_EQ(r.pipeline_class, "QwenImageEditPlusPipeline");
  EXPECT_TRUE(r.problems.empty()) << r.problems.front();
}

}  // namespace
}  // namespace flowkv
