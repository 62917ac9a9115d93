// NucleusMoE-Image transformer configuration (config.json of diffusers 0.42.1
// NucleusMoEImageTransformer2DModel; missing keys take the class defaults of its __init__).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "io/json.h"

namespace flowkv::nucleus {

struct Config {
  int64_t patch_size = 2;
  int64_t in_channels = 64;   // packed latent channels per token (img_in's input width)
  int64_t out_channels = 64;  // None (or 0) in config.json: in_channels
  int64_t num_layers = 24;
  int64_t attention_head_dim = 128;
  int64_t num_attention_heads = 16;
  int64_t num_key_value_heads = 16;  // None: num_attention_heads (plain multi-head attention)
  int64_t joint_attention_dim = 3584;
  std::vector<int64_t> axes_dims_rope = {16, 56, 56};
  double mlp_ratio = 4.0;
  bool moe_enabled = true;
  // Which layers are dense (see is_moe): "leave_first_three_and_last_block_dense",
  // "leave_first_three_blocks_dense", "leave_first_block_dense", "all_moe", "all_dense".
  std::string dense_moe_strategy = "leave_first_three_and_last_block_dense";
  int64_t num_experts = 128;
  int64_t moe_intermediate_dim = 1344;
  // One capacity factor per layer (config.json: a list of num_layers values or one scalar for
  // every layer); dense layers ignore theirs.
  std::vector<double> capacity_factors = std::vector<double>(24, 8.0);
  bool use_sigmoid = false;
  double route_scale = 2.5;
  double eps = 1e-6;  // every norm of the model (fixed in the reference)

  int64_t dim() const { return num_attention_heads * attention_head_dim; }
  int64_t kv_dim() const { return num_key_value_heads * attention_head_dim; }
  // The dense layers' SwiGLU inner width, as the block builds its FeedForward:
  // int(dim * mlp_ratio * 2 / 3) // 128 * 128.
  int64_t dense_inner() const;
  int64_t out_features() const { return patch_size * patch_size * out_channels; }
  // Whether block `layer` has the mixture-of-experts MLP (moe_enabled and the strategy).
  bool is_moe(int64_t layer) const;
  double capacity_factor(int64_t layer) const;

  // Every value range-checked, Errors naming `source` and the key. _class_name, when present,
  // must be NucleusMoEImageTransformer2DModel.
  static Config from_json(const Json& j, const std::string& source);
  Json to_json() const;
  // The released checkpoint's transformer/config.json (spec 5.1, "released" column).
  static Config released();
  // Re-checks a Config built in code (as from_json checks a file); `source` names it.
  void validate(const std::string& source) const;
};

// The dense-layer strategies the reference knows, in its order.
const std::vector<std::string>& dense_moe_strategies();

}  // namespace flowkv::nucleus
