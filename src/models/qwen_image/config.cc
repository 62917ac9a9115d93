#include "models/qwen_image/config.h"

#include <numeric>

#include "core/boundary.h"
#include "flowkv/error.h"
#include "flowkv/limits.h"
#include "models/qwen_image/weights.h"

namespace flowkv::qwen {

namespace {

// Sizes are read within flowkv's limits (flowkv/limits.h), so their products fit 64 bits.
int64_t get_size(const Json& j, const char* key, int64_t def, int64_t hi, const std::string& src) {
  return json_int(j, key, def, 0, hi, src);
}

std::vector<int64_t> get_axes(const Json& j, std::vector<int64_t> def, const std::string& src) {
  if (!j.contains("axes_dims_rope") || j["axes_dims_rope"].is_null()) return def;
  std::vector<int64_t> a;
  FLOWKV_CHECK(j["axes_dims_rope"].is_array(), src, ": axes_dims_rope must be a list");
  FLOWKV_CHECK(j["axes_dims_rope"].size() <= 16, src, ": axes_dims_rope is too long");
  for (const Json& v : j["axes_dims_rope"]) {
    a.push_back(json_int_value(v, 2, limits::kMaxWidth, src + ": axes_dims_rope entry"));
    FLOWKV_CHECK(a.back() % 2 == 0, src, ": axes_dims_rope entries must be even");
  }
  FLOWKV_CHECK(a.size() == 3, src, ": axes_dims_rope must have 3 entries (frame, height, width)");
  return a;
}

void check_common(int64_t heads, int64_t hd, const std::vector<int64_t>& axes,
                  const std::string& src) {
  FLOWKV_CHECK(heads > 0 && hd > 0 && hd % 2 == 0 && heads * hd <= limits::kMaxWidth, src,
               ": bad attention heads / head dim (even head dim, width at most ", limits::kMaxWidth,
               ")");
  const int64_t sum = std::accumulate(axes.begin(), axes.end(), int64_t{0});
  FLOWKV_CHECK(sum == hd, src, ": axes_dims_rope sums to ", sum, " but attention_head_dim is ", hd);
}

// The fields both configs share (out_channels defaults as the class's own default does).
template <class C>
void read_shared(const Json& j, C& c, int64_t out_default, const std::string& src) {
  c.patch_size = get_size(j, "patch_size", c.patch_size, 64, src);
  c.in_channels = get_size(j, "in_channels", c.in_channels, limits::kMaxWidth, src);
  c.out_channels = get_size(j, "out_channels", out_default, limits::kMaxWidth, src);
  c.num_layers = get_size(j, "num_layers", c.num_layers, limits::kMaxBlocks, src);
  c.attention_head_dim =
      get_size(j, "attention_head_dim", c.attention_head_dim, limits::kMaxWidth, src);
  c.num_attention_heads =
      get_size(j, "num_attention_heads", c.num_attention_heads, limits::kMaxWidth, src);
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

static Config21 from_json21_unguarded(const Json& j, const std::string& src) {
  FLOWKV_CHECK(j.is_object(), src, ": config is not a JSON object");
  const std::string cls = class_name(j);
  FLOWKV_CHECK(cls.empty() || cls == "QwenImage21Transformer2DModel", src, ": _class_name is \"",
               cls, "\", expected \"QwenImage21Transformer2DModel\"");
  Config21 c;
  read_shared(j, c, get_size(j, "in_channels", c.in_channels, limits::kMaxWidth, src), src);
  c.context_in_dim = get_size(j, "context_in_dim", c.context_in_dim, limits::kMaxWidth, src);
  c.mlp_ratio = get_size(j, "mlp_ratio", c.mlp_ratio, 64, src);
  c.eps = json_number(j, "eps", c.eps, 0, 1, src);
  c.causal_condition = json_bool(j, "causal_condition", c.causal_condition, src);
  FLOWKV_CHECK(c.patch_size > 0 && c.in_channels > 0 && c.out_channels > 0 && c.num_layers >= 0 &&
                   c.context_in_dim > 0 && c.mlp_ratio > 0,
               src, ": sizes must be positive");
  check_common(c.num_attention_heads, c.attention_head_dim, c.axes_dims_rope, src);
  return c;
}

Config21 Config21::from_json(const Json& j, const std::string& src) {
  return at_input_boundary(src, [&] { return from_json21_unguarded(j, src); });
}

Json Config21::to_json() const {
  Json j = shared_json(*this, "QwenImage21Transformer2DModel");
  j["context_in_dim"] = context_in_dim;
  j["mlp_ratio"] = mlp_ratio;
  j["eps"] = eps;
  j["causal_condition"] = causal_condition;
  return j;
}

static ConfigQwenImage from_json_qwen_unguarded(const Json& j, const std::string& src) {
  FLOWKV_CHECK(j.is_object(), src, ": config is not a JSON object");
  const std::string cls = class_name(j);
  FLOWKV_CHECK(cls.empty() || cls == "QwenImageTransformer2DModel", src, ": _class_name is \"", cls,
               "\", expected \"QwenImageTransformer2DModel\"");
  ConfigQwenImage c;
  read_shared(j, c, c.out_channels, src);
  c.joint_attention_dim =
      get_size(j, "joint_attention_dim", c.joint_attention_dim, limits::kMaxWidth, src);
  c.zero_cond_t = json_bool(j, "zero_cond_t", c.zero_cond_t, src);
  FLOWKV_CHECK(!json_bool(j, "use_additional_t_cond", false, src) &&
                   !json_bool(j, "use_layer3d_rope", false, src),
               src, ": the Qwen-Image Layered variant is not supported");
  FLOWKV_CHECK(c.patch_size > 0 && c.in_channels > 0 && c.out_channels > 0 && c.num_layers >= 0 &&
                   c.joint_attention_dim > 0,
               src, ": sizes must be positive");
  check_common(c.num_attention_heads, c.attention_head_dim, c.axes_dims_rope, src);
  return c;
}

ConfigQwenImage ConfigQwenImage::from_json(const Json& j, const std::string& src) {
  return at_input_boundary(src, [&] { return from_json_qwen_unguarded(j, src); });
}

Json ConfigQwenImage::to_json() const {
  Json j = shared_json(*this, "QwenImageTransformer2DModel");
  j["joint_attention_dim"] = joint_attention_dim;
  j["zero_cond_t"] = zero_cond_t;
  j["guidance_embeds"] = false;
  return j;
}

namespace {

// Dimension `axis` of a tensor the inference needs; an Error naming it when absent or not 2-D/1-D
// as expected.
int64_t dim_of(const std::map<std::string, TensorInfo>& t, const std::string& name, size_t rank,
               size_t axis, const std::string& src) {
  const TensorInfo* x = find_tensor(t, name);
  FLOWKV_CHECK(x && x->shape.size() == rank, src,
               ": no config, and its config cannot be inferred: ",
               x ? "tensor '" + name + "' is not " + std::to_string(rank) + "-D"
                 : "tensor '" + name + "' is missing");
  return x->shape[axis];
}

// Head dim and heads from norm_q and the width; the released RoPE axes need head dim 128.
void infer_heads(Json& j, int64_t width, int64_t hd, const std::string& src) {
  FLOWKV_CHECK(hd > 0 && width % hd == 0, src, ": the width ", width,
               " is not a multiple of norm_q's head dim ", hd);
  FLOWKV_CHECK(hd == 128, src, ": head dim ", hd,
               " has no released RoPE axes and the shapes cannot tell axes_dims_rope; put a "
               "config.json beside the weights");
  j["attention_head_dim"] = hd;
  j["num_attention_heads"] = width / hd;
}

}  // namespace

Config21 infer_config21(const std::map<std::string, TensorInfo>& t, const std::string& source) {
  const std::string src = source + " (config inferred from shapes)";
  Json j = Json::object();
  const int64_t d = dim_of(t, w21::kImgIn, 2, 0, src);
  j["in_channels"] = dim_of(t, w21::kImgIn, 2, 1, src);  // patch_size 1, as released
  j["out_channels"] = dim_of(t, w21::kProjOut, 2, 0, src);
  j["context_in_dim"] = dim_of(t, w21::kTextIn, 2, 1, src);
  const int64_t m = dim_of(t, block_name(0, w21::kGate), 2, 0, src);
  FLOWKV_CHECK(d > 0 && m % d == 0, src, ": the MLP width ", m, " is not a multiple of the width ",
               d);
  j["mlp_ratio"] = m / d;
  infer_heads(j, d, dim_of(t, block_name(0, w21::kNormQ), 1, 0, src), src);
  j["num_layers"] = count_blocks(t, "transformer_blocks.");
  return Config21::from_json(j, src);
}

ConfigQwenImage infer_config_qwen_image(const std::map<std::string, TensorInfo>& t,
                                        const std::string& source) {
  const std::string src = source + " (config inferred from shapes)";
  const ConfigQwenImage released;
  Json j = Json::object();
  const std::string img_in = std::string(wqi::kImgIn) + ".weight";
  const int64_t d = dim_of(t, img_in, 2, 0, src);
  j["in_channels"] = dim_of(t, img_in, 2, 1, src);
  const int64_t out = dim_of(t, std::string(wqi::kProjOut) + ".weight", 2, 0, src);
  const int64_t pp = released.patch_size * released.patch_size;  // patch_size 2, as released
  FLOWKV_CHECK(out % pp == 0, src, ": proj_out's ", out, " outputs are not a multiple of ", pp);
  j["out_channels"] = out / pp;
  j["joint_attention_dim"] = dim_of(t, std::string(wqi::kTxtIn) + ".weight", 2, 1, src);
  infer_heads(j, d, dim_of(t, block_name(0, wqi::kNormQ), 1, 0, src), src);
  j["num_layers"] = count_blocks(t, "transformer_blocks.");
  return ConfigQwenImage::from_json(j, src);
}

bool holds_qwen21(const std::map<std::string, TensorInfo>& t) {
  return find_tensor(t, w21::kModulation) && find_tensor(t, w21::kTextIn);
}

bool holds_qwen_image(const std::map<std::string, TensorInfo>& t) {
  return find_tensor(t, wqi::kTxtNorm) && find_tensor(t, block_name(0, wqi::kImgMod) + ".weight");
}

Config21 config21_of(const CheckpointScan& scan, bool* inferred) {
  if (inferred) *inferred = !scan.config;
  return scan.config ? Config21::from_json(*scan.config, scan.path + "/config.json")
                     : infer_config21(scan.tensors, scan.path);
}

ConfigQwenImage config_qwen_image_of(const CheckpointScan& scan, bool* inferred) {
  if (inferred) *inferred = !scan.config;
  return scan.config ? ConfigQwenImage::from_json(*scan.config, scan.path + "/config.json")
                     : infer_config_qwen_image(scan.tensors, scan.path);
}

}  // namespace flowkv::qwen
