// Qwen3-VL vision tower weight names: the one table (transformers' Qwen3VLVisionModel keys under
// a prefix, "model.visual." in a Qwen3VLForConditionalGeneration checkpoint).
#pragma once

#include <string>
#include <vector>

#include "io/checkpoint.h"
#include "models/qwen3_vl/vision_config.h"

namespace flowkv::qwen3_vl {

enum class GlobalW { kPatchEmbedW, kPatchEmbedB, kPosEmbed, kCount };
enum class BlockW {
  kNorm1W,
  kNorm1B,
  kQkvW,
  kQkvB,
  kProjW,
  kProjB,
  kNorm2W,
  kNorm2B,
  kFc1W,
  kFc1B,
  kFc2W,
  kFc2B,
  kCount
};
enum class MergerW { kNormW, kNormB, kFc1W, kFc1B, kFc2W, kFc2B, kCount };

std::string weight_name(const std::string& prefix, GlobalW w);
std::string weight_name(const std::string& prefix, int64_t block, BlockW w);
// merger < 0: the final merger ("merger."); else deepstack_merger_list.<merger>.
std::string weight_name(const std::string& prefix, int64_t merger, MergerW w);
Shape weight_shape(const VisionConfig& c, GlobalW w);
Shape weight_shape(const VisionConfig& c, BlockW w);
// The deepstack mergers normalise after the 2x2 shuffle (width hidden * merge^2), the final
// merger before it (width hidden).
Shape weight_shape(const VisionConfig& c, bool postshuffle, MergerW w);

// Every tensor of the vision tower under `prefix`.
std::vector<ExpectedTensor> vision_weight_table(const VisionConfig& c, const std::string& prefix);

int64_t vision_parameter_count(const VisionConfig& c);

}  // namespace flowkv::qwen3_vl
