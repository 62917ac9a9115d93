#include "models/flux2/builtin.h"

#include "models/common/random_weights.h"
#include "models/flux2/weights.h"

namespace flowkv::flux2 {

void fill_normal(float* out, int64_t n, uint64_t seed, float scale) {
  flowkv::fill_normal(out, n, seed, scale);
}

bool builtin_config(const std::string& name, Config* out) {
  Config c;
  c.guidance_embeds = false;
  if (name == "tiny") {
    c.in_channels = 16;
    c.num_layers = 1;
    c.num_single_layers = 2;
    c.num_attention_heads = 2;
    c.attention_head_dim = 32;
    c.joint_attention_dim = 48;
    c.axes_dims_rope = {8, 8, 8, 8};
  } else if (name == "medium") {  // the forward benchmark's mid-size config
    c.in_channels = 128;
    c.num_layers = 2;
    c.num_single_layers = 6;
    c.num_attention_heads = 8;
    c.attention_head_dim = 128;
    c.joint_attention_dim = 3072;
  } else if (name == "small") {  // the KV benchmark's default: sized for minutes on 2 cores
    c.in_channels = 128;
    c.num_layers = 2;
    c.num_single_layers = 6;
    c.num_attention_heads = 3;
    c.attention_head_dim = 128;
    c.joint_attention_dim = 1152;
  } else {
    return false;
  }
  *out = c;
  return true;
}

std::vector<std::string> builtin_names() {
  return {"tiny", "small"};
}

std::map<std::string, Tensor> random_weights(const Config& c, uint64_t seed, DType dtype) {
  return flowkv::random_weights(weight_table(c), seed, dtype,
                                [](const std::string&) { return 1.0f; });
}

}  // namespace flowkv::flux2
