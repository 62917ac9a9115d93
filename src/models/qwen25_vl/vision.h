// The Qwen2.5-VL vision tower (transformers' Qwen2_5_VisionTransformerPretrainedModel, as
// Qwen2_5_VLModel.get_image_features runs it): the image side of the Qwen-Image prompt encoder.
// pixel_values (from qwen3_vl/image_processor.h, Qwen2VLImageProcessor with patch 14) -> Conv3d
// patch embedding (no bias) -> rows regrouped by attention window (get_window_index) -> `depth`
// blocks (RMSNorm, attention with the 2D axial rotary embedding within each window, or within
// each image frame for the fullatt_block_indexes blocks, RMSNorm, SwiGLU MLP with biases) ->
// the patch merger (RMSNorm, m x m shuffle, Linear-GELU-Linear) -> merged tokens back in image
// order. Tokens arrive in the processor's merge-block order, so every merge_size^2 consecutive
// rows are one merged token; the window regrouping moves whole merged tokens.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "core/exec_context.h"
#include "flowkv/tensor.h"
#include "io/checkpoint.h"
#include "models/common/vit.h"
#include "models/qwen25_vl/vision_config.h"

namespace flowkv::qwen25_vl {

using VisionLoadOptions = vit::VisionLoadOptions;

class VisionTower {
 public:
  // From a scan (a text_encoder/ folder holding the whole Qwen2_5_VLForConditionalGeneration):
  // the tensors under `prefix` (kVisionPrefix or kVisionPrefixV4, see detect_vision_prefix) are
  // checked against the name table (the language model's are left alone), then loaded.
  static VisionTower load(const CheckpointScan& scan, const VisionConfig& cfg,
                          const std::string& prefix, const VisionLoadOptions& opts = {});
  // A text_encoder/ folder (config.json with vision_config, and its safetensors; the prefix is
  // detected), or a pipeline folder holding text_encoder/, or a GGUF `flowkv quantize` wrote
  // from one (source.h). A llama.cpp GGUF (no vision tower) is an Error saying so.
  static VisionTower load(const std::string& path, const VisionLoadOptions& opts = {});

  const VisionConfig& config() const;
  DType compute_dtype() const;
  int64_t weight_bytes() const;

  // pixel_values [N, C*T*P*P] f32 and each image's {t, h, w} grid (sum of t*h*w = N; h and w
  // multiples of spatial_merge_size). Returns [N / merge^2, out_hidden_size] f32, images in
  // order. Traces "patch_embed" (processor order), "rope.cos" / "rope.sin" ([N, head_dim],
  // processor order), "blocks.<i>" (window order, as transformers' blocks see them) and
  // "embeds".
  Tensor forward(const ExecContext& ctx, const Tensor& pixel_values,
                 std::span<const Grid> grids) const;

  struct Weights;

 private:
  std::shared_ptr<const Weights> w_;
};

}  // namespace flowkv::qwen25_vl
