#include "models/qwen_image/builtin.h"

#include "models/common/random_weights.h"
#include "models/qwen_image/weights.h"

namespace flowkv::qwen {

bool builtin_config21(const std::string& name, Config21* out) {
  Config21 c;
  if (name == "qwen21-tiny") {
    c.in_channels = c.out_channels = 16;
    c.num_layers = 2;
    c.num_attention_heads = 2;
    c.attention_head_dim = 32;
    c.context_in_dim = 24;
    c.mlp_ratio = 2;
    c.axes_dims_rope = {8, 12, 12};
  } else if (name == "qwen21-small") {
    c.num_layers = 8;
    c.num_attention_heads = 3;
    c.attention_head_dim = 128;
    c.context_in_dim = 1152;
  } else {
    return false;
  }
  *out = c;
  return true;
}

std::vector<std::string> builtin_names21() {
  return {"qwen21-tiny", "qwen21-small"};
}

std::map<std::string, Tensor> random_weights21(const Config21& c, uint64_t seed, DType dtype) {
  // The text norm is zero-centred (checkpoints store scale - 1); the QK norms are plain.
  return random_weights(weight_table(c), seed, dtype,
                        [](const std::string& n) { return n == w21::kTextNorm ? 0.0f : 1.0f; });
}

bool builtin_config_qwen_image(const std::string& name, ConfigQwenImage* out) {
  if (name != "qwen-image-tiny") return false;
  ConfigQwenImage c;
  c.in_channels = 16;
  c.out_channels = 4;
  c.num_layers = 2;
  c.num_attention_heads = 2;
  c.attention_head_dim = 32;
  c.joint_attention_dim = 24;
  c.axes_dims_rope = {8, 12, 12};
  *out = c;
  return true;
}

std::vector<std::string> builtin_names_qwen_image() {
  return {"qwen-image-tiny"};
}

std::map<std::string, Tensor> random_weights_qwen_image(const ConfigQwenImage& c, uint64_t seed,
                                                        DType dtype) {
  // Every norm is a plain RMSNorm weight around 1.
  return random_weights(weight_table(c), seed, dtype, [](const std::string&) { return 1.0f; });
}

}  // namespace flowkv::qwen
