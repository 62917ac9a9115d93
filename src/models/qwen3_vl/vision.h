// The Qwen3-VL vision tower (transformers' Qwen3VLVisionModel, as
// Qwen3VLModel.get_image_features runs it): the image side of the Qwen-Image-2.1 prompt encoder.
// pixel_values (from image_processor.h) -> Conv3d patch embedding -> learned position embedding
// bilinearly resampled to each image's grid -> `depth` ViT blocks (LayerNorm, attention within
// each image (each frame) with the 2D axial rotary embedding, LayerNorm, MLP) -> the 2x2 patch
// merger; the deepstack mergers read the outputs of the blocks deepstack_visual_indexes names.
// Tokens are in the processor's merge-block order throughout, so every merge_size^2 consecutive
// rows are one merged token.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/exec_context.h"
#include "flowkv/tensor.h"
#include "io/checkpoint.h"
#include "models/common/vit.h"
#include "models/qwen3_vl/vision_config.h"

namespace flowkv::qwen3_vl {

// The prefix of the vision tower's tensors in a Qwen3VLForConditionalGeneration checkpoint.
inline constexpr const char* kVisionPrefix = "model.visual.";

using VisionLoadOptions = vit::VisionLoadOptions;

struct VisionOutput {
  Tensor embeds;                  // [N / merge^2, out_hidden_size] f32
  std::vector<Tensor> deepstack;  // one per deepstack_visual_indexes entry, same shape
};

class VisionTower {
 public:
  // From a scan (a text_encoder/ folder holding the whole Qwen3VLForConditionalGeneration):
  // the tensors under `prefix` are checked against the name table (the others, the language
  // model's, are left alone), then loaded.
  static VisionTower load(const CheckpointScan& scan, const VisionConfig& cfg,
                          const std::string& prefix = kVisionPrefix,
                          const VisionLoadOptions& opts = {});
  // A text_encoder/ folder (config.json with vision_config, and its safetensors), or a
  // pipeline folder holding text_encoder/.
  static VisionTower load(const std::string& path, const VisionLoadOptions& opts = {});

  const VisionConfig& config() const;
  DType compute_dtype() const;
  int64_t weight_bytes() const;

  // pixel_values [N, C*T*P*P] f32 and each image's {t, h, w} grid (sum of t*h*w = N; h and w
  // multiples of spatial_merge_size). Traces "patch_embed", "pos_embed", "blocks.<i>",
  // "deepstack.<j>" and "embeds".
  VisionOutput forward(const ExecContext& ctx, const Tensor& pixel_values,
                       const std::vector<std::array<int64_t, 3>>& grid_thw) const;

  struct Weights;

 private:
  std::shared_ptr<const Weights> w_;
};

}  // namespace flowkv::qwen3_vl
