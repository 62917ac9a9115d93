#include "models/nucleus/builtin.h"

#include "models/common/random_weights.h"
#include "models/nucleus/weights.h"

namespace flowkv::nucleus {

bool builtin_config(const std::string& name, Config* out) {
  if (name != "nucleus-tiny") return false;
  Config c;
  c.in_channels = 16;
  c.out_channels = 4;
  c.num_layers = 5;
  c.attention_head_dim = 16;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.joint_attention_dim = 24;
  c.axes_dims_rope = {4, 6, 6};
  c.dense_moe_strategy = "leave_first_three_blocks_dense";
  c.num_experts = 4;
  c.moe_intermediate_dim = 32;
  c.capacity_factors = {0, 0, 0, 2, 2};
  *out = c;
  return true;
}

std::vector<std::string> builtin_names() {
  return {"nucleus-tiny"};
}

std::map<std::string, Tensor> random_weights(const Config& c, uint64_t seed, DType dtype) {
  // RMSNorm weights (QK norms, txt_norm, the timestep norm) around 1; biases around 0.
  return flowkv::random_weights(weight_table(c), seed, dtype, [](const std::string& n) {
    return n.size() > 7 && n.compare(n.size() - 7, 7, ".weight") == 0 ? 1.0f : 0.0f;
  });
}

}  // namespace flowkv::nucleus
