// The Qwen2.5-VL vision tower's configuration: the "vision_config" object of a
// Qwen2_5_VLForConditionalGeneration config.json (transformers' Qwen2_5_VLVisionConfig), the
// image side of the Qwen-Image (Qwen2.5-VL-7B) prompt encoder.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "io/json.h"
#include "models/common/vit.h"

namespace flowkv::qwen25_vl {

using Grid = vit::Grid;  // {t, h, w} in patches, as the image processor gives grid_thw

struct VisionConfig {
  // Defaults are transformers 5.24's Qwen2_5_VLVisionConfig class defaults (a missing field
  // takes them; note hidden_size 3584 there, while every released checkpoint says 1280).
  int64_t depth = 32;
  int64_t hidden_size = 3584;
  int64_t intermediate_size = 3420;
  int64_t num_heads = 16;
  int64_t in_channels = 3;
  int64_t patch_size = 14;
  int64_t spatial_merge_size = 2;
  int64_t temporal_patch_size = 2;
  int64_t window_size = 112;  // pixels: a window is window_size / merge / patch merged tokens
  int64_t out_hidden_size = 3584;
  std::vector<int64_t> fullatt_block_indexes = {7, 15, 23, 31};
  std::string hidden_act = "silu";  // the blocks' SwiGLU gate; only "silu" is implemented
  double rope_theta = 10000;        // rope_parameters.rope_theta (type "axial")

  int64_t head_dim() const { return hidden_size / num_heads; }
  int64_t merge_unit() const { return spatial_merge_size * spatial_merge_size; }
  // Values of one flattened patch: C * T * P * P (pixel_values' row width).
  int64_t patch_dim() const { return in_channels * temporal_patch_size * patch_size * patch_size; }
  // The merger's width after the m x m shuffle: hidden_size * merge^2.
  int64_t merged_hidden() const { return hidden_size * merge_unit(); }
  // Side of an attention window in merged tokens (transformers' vit_merger_window_size).
  int64_t merger_window() const { return window_size / spatial_merge_size / patch_size; }
  bool full_attention(int64_t block) const;

  // Reads the vision_config object (`src` names it in errors). Both layouts transformers writes
  // are read: 5.x (model_type "qwen2_5_vl_vision", rope_parameters) and 4.x (model_type
  // "qwen2_5_vl", in_chans / spatial_patch_size beside in_channels / patch_size, which the
  // reference ignores as flowkv does, no rope_parameters). Refused by name: hidden_act other than
  // silu, a RoPE type other than "axial", list-valued patch sizes, a window smaller than one
  // merged token, block indexes out of range.
  static VisionConfig from_json(const Json& j, const std::string& src);
  // The vision_config of a whole Qwen2_5_VLForConditionalGeneration config.json (model_type
  // "qwen2_5_vl"; text fields flat at the top as 4.x saves them or under text_config as 5.x
  // does: the vision side reads neither). A missing vision_config takes every default.
  static VisionConfig from_model_config(const Json& j, const std::string& src);
  void validate(const std::string& src) const;
};

// FLOPs of one VisionTower::forward over these grids: 2 per multiply-add of the patch embedding,
// the blocks' linears and the merger, plus 4 * hidden per (query, key) pair of attention (each
// window, or each frame in the full-attention blocks). Pure arithmetic, for the cost model.
double vision_flops(const VisionConfig& c, std::span<const Grid> grids);

// get_vision_window_index: the merged tokens of every image regrouped by attention window.
struct WindowLayout {
  // index[j] = the merged token (in processor order, over all images) at position j of the
  // window order; the tower's rows are permuted by it, merge_unit rows per merged token.
  std::vector<int64_t> index;
  // Window boundaries in patch rows of the window order, 0 first, no repeats (cu_window_seqlens).
  std::vector<int64_t> cu_window_seqlens;
  // Frame boundaries in patch rows (cu_seqlens of the full-attention blocks; a frame's rows stay
  // contiguous in the window order).
  std::vector<int64_t> cu_seqlens;
};
WindowLayout window_layout(const VisionConfig& c, std::span<const Grid> grids);

}  // namespace flowkv::qwen25_vl
