// The Qwen3-VL image processor: RGB images to the vision tower's pixel_values and grid_thw, as
// transformers 5.24's Qwen2VLImageProcessorPil computes them (what Qwen3VLProcessor loads
// without torchvision, the pinned reference):
//   smart_resize to multiples of patch_size * merge_size within [min_pixels, max_pixels],
//   PIL bicubic resize, rescale (float64 product rounded to float32), normalize in float32,
//   then patches in merge-block order, each frame repeated temporal_patch_size times.
// With torchvision installed, transformers picks its torchvision backend instead, which resizes
// with torch's bicubic: the pixels differ whenever smart_resize changes the size (never for a
// Qwen-Image-2.1 condition image, which the pipeline already resized to multiples of 32).
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "flowkv/tensor.h"
#include "io/image.h"
#include "io/json.h"

namespace flowkv::qwen3_vl {

struct ImageProcessorConfig {
  // Defaults are Qwen2VLImageProcessorPil's class defaults (a missing field takes them); the
  // released Qwen3-VL preprocessor_config.json sets patch 16, min 65,536, max 16,777,216 and
  // mean = std = 0.5.
  int64_t patch_size = 14;
  int64_t temporal_patch_size = 2;
  int64_t merge_size = 2;
  int64_t min_pixels = 56 * 56;         // size.shortest_edge (or a top-level min_pixels)
  int64_t max_pixels = 28 * 28 * 1280;  // size.longest_edge (or a top-level max_pixels)
  bool do_resize = true;
  bool do_rescale = true;
  bool do_normalize = true;
  double rescale_factor = 1.0 / 255.0;
  std::array<double, 3> image_mean = {0.48145466, 0.4578275, 0.40821073};  // OPENAI_CLIP_MEAN
  std::array<double, 3> image_std = {0.26862954, 0.26130258, 0.27577711};  // OPENAI_CLIP_STD

  int64_t factor() const { return patch_size * merge_size; }
  // Values of one flattened patch: 3 * temporal_patch_size * patch_size^2.
  int64_t patch_dim() const { return 3 * temporal_patch_size * patch_size * patch_size; }

  // Reads preprocessor_config.json's object (`src` names it in errors). Refused by name:
  // resample other than 3 (bicubic), a zero std, min_pixels > max_pixels, an
  // image_processor_type that is not a Qwen2-VL image processor.
  static ImageProcessorConfig from_json(const Json& j, const std::string& src);
  // A preprocessor_config.json file.
  static ImageProcessorConfig read(const std::string& path);
  void validate(const std::string& src) const;
};

// transformers' smart_resize (Python's round, half to even), as {height, width}. An aspect
// ratio above 200 is an Error, as the reference raises; so is a result the reference would
// turn into an empty grid, or one beyond flowkv's image limits.
std::array<int64_t, 2> smart_resize(int64_t height, int64_t width, int64_t factor,
                                    int64_t min_pixels, int64_t max_pixels);

// The grid {t, h, w} (t = 1 for an image) of a width x height image, in patches.
std::array<int64_t, 3> image_grid(const ImageProcessorConfig& cfg, int64_t width, int64_t height);
// The number of <|image_pad|> tokens the processor gives that image: t * h * w / merge_size^2.
// Pure arithmetic: the predictor uses it without pixels.
int64_t image_token_count(const ImageProcessorConfig& cfg, int64_t width, int64_t height);

struct ProcessedImages {
  Tensor pixel_values;  // [sum of t*h*w, 3 * T * P * P] f32, images in order
  std::vector<std::array<int64_t, 3>> grid_thw;
};

// The processor on a list of RGB images (Qwen3VLProcessor's images= argument).
ProcessedImages process_images(const ImageProcessorConfig& cfg, std::span<const Image> images);

}  // namespace flowkv::qwen3_vl
