// Qwen2.5-VL vision tower weight names: the one table (transformers' Qwen2_5_VisionTransformer
// keys under a prefix: "visual." in checkpoints transformers 4.x saved, such as Qwen-Image's
// text_encoder/, "model.visual." in those 5.x saves).
#pragma once

#include <string>
#include <vector>

#include "io/checkpoint.h"
#include "models/qwen25_vl/vision_config.h"

namespace flowkv::qwen25_vl {

inline constexpr const char* kVisionPrefix = "model.visual.";  // transformers 5.x
inline constexpr const char* kVisionPrefixV4 = "visual.";      // transformers 4.x

enum class GlobalW { kPatchEmbedW, kCount };  // the Conv3d has no bias
enum class BlockW {
  kNorm1W,
  kQkvW,
  kQkvB,
  kProjW,
  kProjB,
  kNorm2W,
  kGateW,
  kGateB,
  kUpW,
  kUpB,
  kDownW,
  kDownB,
  kCount
};
enum class MergerW { kLnQW, kFc1W, kFc1B, kFc2W, kFc2B, kCount };

std::string weight_name(const std::string& prefix, GlobalW w);
std::string weight_name(const std::string& prefix, int64_t block, BlockW w);
std::string weight_name(const std::string& prefix, MergerW w);
Shape weight_shape(const VisionConfig& c, GlobalW w);
Shape weight_shape(const VisionConfig& c, BlockW w);
Shape weight_shape(const VisionConfig& c, MergerW w);

// Every tensor of the vision tower under `prefix`.
std::vector<ExpectedTensor> vision_weight_table(const VisionConfig& c, const std::string& prefix);

// The prefix the checkpoint keeps the tower under: kVisionPrefix or kVisionPrefixV4, whichever
// holds its patch embedding; an Error naming both (and the file) when neither does.
std::string detect_vision_prefix(const CheckpointScan& scan);

int64_t vision_parameter_count(const VisionConfig& c);

}  // namespace flowkv::qwen25_vl
