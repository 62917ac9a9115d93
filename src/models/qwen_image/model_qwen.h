// Qwen-Image (diffusers QwenImageTransformer2DModel): 60 dual-stream blocks x 3072 with GELU
// MLPs and biases, full bidirectional attention over [text, images]; the Edit-Plus layout puts
// reference images after the target in the image stream. Every token reads the target, so
// nothing here can be cached exactly. Under zero_cond_t (Edit-2511) the reference tokens of the
// image stream are modulated from t = 0, the target and the text from the step's time.
//
// Step caches see two dynamic streams, text and image (the target with the references after
// it: the hidden_states diffusers' hooks see).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "cache/hooks.h"
#include "core/exec_context.h"
#include "models/qwen_image/config.h"
#include "models/qwen_image/layout21.h"
#include "models/qwen_image/model21.h"
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
  // Approximate step caches (may skip blocks or reuse sublayer outputs); nullptr: every block.
  cache::BlockHooks* hooks = nullptr;
};

class ModelQwenImage {
 public:
  // Compute types as Qwen-Image-2.1's (LoadOptions21): BF16 when every weight is BF16, else
  // F32, or as asked; int8 linear layers on request.
  static ModelQwenImage load(const std::string& path, const LoadOptions21& opts = {});
  static ModelQwenImage from_tensors(const std::map<std::string, Tensor>& tensors,
                                     const ConfigQwenImage& c, const LoadOptions21& opts = {});
  const ConfigQwenImage& config() const;
  DType compute_dtype() const;
  void forward(const ExecContext& ctx, const ArgsQwenImage& a) const;
  // The num_layers dual-stream blocks, for step-cache policies.
  cache::Topology topology() const;

  struct Weights;

 private:
  std::shared_ptr<const Weights> w_;
};

}  // namespace flowkv::qwen
