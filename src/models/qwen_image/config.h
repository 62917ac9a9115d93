// Qwen-Image family configurations (config.json of diffusers' QwenImage21Transformer2DModel and
// QwenImageTransformer2DModel).
#pragma once

#include <string>
#include <vector>

#include "io/checkpoint.h"
#include "io/json.h"

namespace flowkv::qwen {

// Qwen-Image-2.1: 32 single-stream blocks x 4096, block-causal attention over
// [text with condition images spliced in, target], one shared modulation.
struct Config21 {
  int64_t patch_size = 1;
  int64_t in_channels = 64;
  int64_t out_channels = 64;
  int64_t num_layers = 32;
  int64_t attention_head_dim = 128;
  int64_t num_attention_heads = 32;
  int64_t context_in_dim = 4096;
  int64_t mlp_ratio = 3;
  std::vector<int64_t> axes_dims_rope = {16, 56, 56};
  double eps = 1e-6;
  bool causal_condition = true;

  int64_t dim() const { return num_attention_heads * attention_head_dim; }
  int64_t mlp_hidden() const { return dim() * mlp_ratio; }
  int64_t out_features() const { return patch_size * patch_size * out_channels; }
  static Config21 from_json(const Json& j, const std::string& source);
  Json to_json() const;
};

// Qwen-Image (and the Edit / Edit-Plus models): 60 dual-stream blocks x 3072, GELU MLPs, biases.
struct ConfigQwenImage {
  int64_t patch_size = 2;
  int64_t in_channels = 64;
  int64_t out_channels = 16;
  int64_t num_layers = 60;
  int64_t attention_head_dim = 128;
  int64_t num_attention_heads = 24;
  int64_t joint_attention_dim = 3584;
  std::vector<int64_t> axes_dims_rope = {16, 56, 56};
  bool zero_cond_t = false;  // Edit-2511: references modulated from t = 0
  double eps = 1e-6;

  int64_t dim() const { return num_attention_heads * attention_head_dim; }
  int64_t mlp_hidden() const { return 4 * dim(); }
  int64_t out_features() const { return patch_size * patch_size * out_channels; }
  static ConfigQwenImage from_json(const Json& j, const std::string& source);
  Json to_json() const;
};

// Configs of checkpoints that carry none (GGUF conversions): sizes from the tensors' shapes,
// validated like a config.json. What shapes cannot tell takes the released value: Qwen-Image-2.1
// causal_condition=true, Qwen-Image zero_cond_t=false, RoPE axes 16/56/56 (head dim 128 only;
// another head dim is an Error asking for a config). `source` names the files in errors.
Config21 infer_config21(const std::map<std::string, TensorInfo>& tensors,
                        const std::string& source);
ConfigQwenImage infer_config_qwen_image(const std::map<std::string, TensorInfo>& tensors,
                                        const std::string& source);
// True when the tensors are this model's (the names only its files hold).
bool holds_qwen21(const std::map<std::string, TensorInfo>& tensors);
bool holds_qwen_image(const std::map<std::string, TensorInfo>& tensors);
// A scanned checkpoint's config: its config.json, else inferred from the tensors (*inferred
// says which, when given).
Config21 config21_of(const CheckpointScan& scan, bool* inferred = nullptr);
ConfigQwenImage config_qwen_image_of(const CheckpointScan& scan, bool* inferred = nullptr);

// "QwenImage21Transformer2DModel", "QwenImageTransformer2DModel", or "" when unknown.
std::string class_name(const Json& config);

}  // namespace flowkv::qwen
