// The Qwen3-VL vision tower's configuration: the "vision_config" object of a
// Qwen3VLForConditionalGeneration config.json (transformers' Qwen3VLVisionConfig), the image side
// of the Qwen-Image-2.1 prompt encoder.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "io/json.h"

namespace flowkv::qwen3_vl {

struct VisionConfig {
  // Defaults are transformers' Qwen3VLVisionConfig defaults (a missing field takes them).
  int64_t depth = 27;
  int64_t hidden_size = 1152;
  int64_t intermediate_size = 4304;
  int64_t num_heads = 16;
  int64_t in_channels = 3;
  int64_t patch_size = 16;
  int64_t spatial_merge_size = 2;
  int64_t temporal_patch_size = 2;
  int64_t out_hidden_size = 3584;
  int64_t num_position_embeddings = 2304;
  std::vector<int64_t> deepstack_visual_indexes = {8, 16, 24};
  // "gelu_pytorch_tanh" (the released models) or "gelu" (erf): the blocks' MLP activation. The
  // patch mergers always use the erf GELU (nn.GELU()), whatever this says.
  std::string hidden_act = "gelu_pytorch_tanh";
  double rope_theta = 10000;  // rope_parameters.rope_theta (type "axial" only)

  int64_t head_dim() const { return hidden_size / num_heads; }
  int64_t merge_unit() const { return spatial_merge_size * spatial_merge_size; }
  // Values of one flattened patch: C * T * P * P (pixel_values' row width).
  int64_t patch_dim() const { return in_channels * temporal_patch_size * patch_size * patch_size; }
  // The merger's input width: hidden_size * merge^2.
  int64_t merged_hidden() const { return hidden_size * merge_unit(); }
  // Side of the square learned position grid: int(sqrt(num_position_embeddings)).
  int64_t grid_side() const;

  // Reads the vision_config object (`src` names it in errors). Fields flowkv does not implement
  // are refused by name: hidden_act other than gelu_pytorch_tanh / gelu, a RoPE type other than
  // "axial", a non-square position table, list-valued patch sizes.
  static VisionConfig from_json(const Json& j, const std::string& src);
  // The vision_config of a whole Qwen3VLForConditionalGeneration config.json (model_type
  // "qwen3_vl"); a missing vision_config takes every default, as transformers does.
  static VisionConfig from_model_config(const Json& j, const std::string& src);
  void validate(const std::string& src) const;
};

// FLOPs of one VisionTower::forward over these grids ({t, h, w} each): 2 per multiply-add of
// the patch embedding, the blocks' linears and the mergers, plus 4 * hidden per (query, key)
// pair of attention (each frame attends within itself). Pure arithmetic, for the cost model.
double vision_flops(const VisionConfig& c, const std::vector<std::array<int64_t, 3>>& grid_thw);

}  // namespace flowkv::qwen3_vl
