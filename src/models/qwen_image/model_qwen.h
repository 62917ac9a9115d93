// Qwen-Image (diffusers QwenImageTransformer2DModel): 60 dual-stream blocks x 3072 with GELU
// MLPs and biases, full bidirectional attention over [text, images]; the Edit-Plus layout puts
// reference images after the target in the image stream. Every token reads the target, so
// nothing here can be cached exactly.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/exec_context.h"
#include "models/qwen_image/config.h"
#include "models/qwen_image/layout21.h"
#include "ops/linear.h"

namespace flowkv::qwen {

struct ArgsQwenImage {
  int64_t batch = 1;
  const float* text = nullptr;  // [B, L, joint_attention_dim]
  int64_t text_len = 0;
  const uint8_t* text_valid = nullptr;  // [B, L] or nullptr
  const float* img = nullptr;           // [B, sum h*w, in_channels]: target first, then references
  std::vector<Grid> img_grids;          // packed grids (tokens), target first
  const float* timestep = nullptr;      // [B] in [0, 1]
  float* out = nullptr;                 // [B, sum h*w, out_features]
};

class ModelQwenImage {
 public:
  static ModelQwenImage load(const std::string& path, DType compute = DType::kF32);
  const ConfigQwenImage& config() const;
  void forward(const ExecContext& ctx, const ArgsQwenImage& a) const;

  struct Weights;

 private:
  std::shared_ptr<const Weights> w_;
};

}  // namespace flowkv::qwen
