#include "models/qwen_image/config.h"

#include <numeric>

#include "flowkv/error.h"

namespace flowkv::qwen {

namespace {

int64_t get_int(const Json& j, const char* key, int64_t def, const std::string& src) {
  if (!j.contains(key) || j[key].is_null()) return def;
  FLOWKV_CHECK(j[key].is_number_integer(), src, ": field \"", key, "\" must be an integer, got ",
               j[key].dump());
  return j[key].get<int64_t>();
}

bool get_bool(const Json& j, const char* key, bool def, const std::string& src) {
  if (!j.contains(key) || j[key].is_null()) return def;
  FLOWKV_CHECK(j[key].is_boolean(), src, ": field \"", key, "\" must be true or false");
  return j[key].get<bool>();
}

std::vector<int64_t> get_axes(const Json& j, std::vector<int64_t> def, const std::string& src) {
  if (!j.contains("axes_dims_rope") || j["axes_dims_rope"].is_null()) return def;
  std::vector<int64_t> a;
  FLOWKV_CHECK(j["axes_dims_rope"].is_array(), src, ": axes_dims_rope must be a list");
  for (const Json& v : j["axes_dims_rope"]) {
    FLOWKV_CHECK(v.is_number_integer() && v.get<int64_t>() > 0 && v.get<int64_t>() % 2 == 0, src,
                 ": axes_dims_rope entries must be positive even integers");
    a.push_back(v.get<int64_t>());
  }
  FLOWKV_CHECK(a.size() == 3, src, ": axes_dims_rope must have 3 entries (frame, height, width)");
  return a;
}

void check_common(int64_t heads, int64_t hd, const std::vector<int64_t>& axes,
                  const std::string& src) {
  FLOWKV_CHECK(heads > 0 && hd > 0 && hd % 2 == 0, src, ": bad attention heads / head dim");
  const int64_t sum = std::accumulate(axes.begin(), axes.end(), int64_t{0});
  FLOWKV_CHECK(sum == hd, src, ": axes_dims_rope sums to ", sum, " but attention_head_dim is ", hd);
}

// The fields both configs share (out_channels defaults as the class's own default does).
template <class C>
void read_shared(const Json& j, C& c, int64_t out_default, const std::string& src) {
  c.patch_size = get_int(j, "patch_size", c.patch_size, src);
  c.in_channels = get_int(j, "in_channels", c.in_channels, src);
  c.out_channels = get_int(j, "out_channels", out_default, src);
  c.num_layers = get_int(j, "num_layers", c.num_layers, src);
  c.attention_head_dim = get_int(j, "attention_head_dim", c.attention_head_dim, src);
  c.num_attention_heads = get_int(j, "num_attention_heads", c.num_attention_heads, src);
  c.axes_dims_rope = get_axes(j, c.axes_dims_rope, src);
}

template <class C>
Json shared_json(const C& c, const char* class_name) {
  return {{"_class_name", class_name},
          {"patch_size", c.patch_size},
          {"in_channels", c.in_channels},
          {"out_channels", c.out_channels},
          {"num_layers", c.num_layers},
          {"attention_head_dim", c.attention_head_dim},
          {"num_attention_heads", c.num_attention_heads},
          {"axes_dims_rope", c.axes_dims_rope}};
}

}  // namespace

std::string class_name(const Json& config) {
  if (config.is_object() && config.contains("_class_name") && config["_class_name"].is_string()) {
    return config["_class_name"].get<std::string>();
  }
  return "";
}

Config21 Config21::from_json(const Json& j, const std::string& src) {
  FLOWKV_CHECK(j.is_object(), src, ": config is not a JSON object");
  const std::string cls = class_name(j);
  FLOWKV_CHECK(cls.empty() || cls == "QwenImage21Transformer2DModel", src, ": _class_name is \"",
               cls, "\", expected \"QwenImage21Transformer2DModel\"");
  Config21 c;
  read_shared(j, c, get_int(j, "in_channels", c.in_channels, src), src);
  c.context_in_dim = get_int(j, "context_in_dim", c.context_in_dim, src);
  c.mlp_ratio = get_int(j, "mlp_ratio", c.mlp_ratio, src);
  if (j.contains("eps") && j["eps"].is_number()) c.eps = j["eps"].get<double>();
  c.causal_condition = get_bool(j, "causal_condition", c.causal_condition, src);
  FLOWKV_CHECK(c.patch_size > 0 && c.in_channels > 0 && c.out_channels > 0 && c.num_layers >= 0 &&
                   c.context_in_dim > 0 && c.mlp_ratio > 0,
               src, ": sizes must be positive");
  check_common(c.num_attention_heads, c.attention_head_dim, c.axes_dims_rope, src);
  return c;
}

Json Config21::to_json() const {
  Json j = shared_json(*this, "QwenImage21Transformer2DModel");
  j["context_in_dim"] = context_in_dim;
  j["mlp_ratio"] = mlp_ratio;
  j["eps"] = eps;
  j["causal_condition"] = causal_condition;
  return j;
}

ConfigQwenImage ConfigQwenImage::from_json(const Json& j, const std::string& src) {
  FLOWKV_CHECK(j.is_object(), src, ": config is not a JSON object");
  const std::string cls = class_name(j);
  FLOWKV_CHECK(cls.empty() || cls == "QwenImageTransformer2DModel", src, ": _class_name is \"", cls,
               "\", expected \"QwenImageTransformer2DModel\"");
  ConfigQwenImage c;
  read_shared(j, c, c.out_channels, src);
  c.joint_attention_dim = get_int(j, "joint_attention_dim", c.joint_attention_dim, src);
  c.zero_cond_t = get_bool(j, "zero_cond_t", c.zero_cond_t, src);
  FLOWKV_CHECK(!get_bool(j, "use_additional_t_cond", false, src) &&
                   !get_bool(j, "use_layer3d_rope", false, src),
               src, ": the Qwen-Image Layered variant is not supported");
  FLOWKV_CHECK(c.patch_size > 0 && c.in_channels > 0 && c.out_channels > 0 && c.num_layers >= 0 &&
                   c.joint_attention_dim > 0,
               src, ": sizes must be positive");
  check_common(c.num_attention_heads, c.attention_head_dim, c.axes_dims_rope, src);
  return c;
}

Json ConfigQwenImage::to_json() const {
  Json j = shared_json(*this, "QwenImageTransformer2DModel");
  j["joint_attention_dim"] = joint_attention_dim;
  j["zero_cond_t"] = zero_cond_t;
  j["guidance_embeds"] = false;
  return j;
}

}  // namespace flowkv::qwen
