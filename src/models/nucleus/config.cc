#include "models/nucleus/config.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/boundary.h"
#include "flowkv/error.h"
#include "flowkv/limits.h"

namespace flowkv::nucleus {

namespace {

constexpr const char* kClass = "NucleusMoEImageTransformer2DModel";
constexpr int64_t kMaxExperts = 4096;

int64_t get_size(const Json& j, const char* key, int64_t def, int64_t lo, int64_t hi,
                 const std::string& src) {
  return json_int(j, key, def, lo, hi, src);
}

std::vector<int64_t> get_axes(const Json& j, const std::vector<int64_t>& def,
                              const std::string& src) {
  if (!j.contains("axes_dims_rope") || j["axes_dims_rope"].is_null()) return def;
  const Json& a = j["axes_dims_rope"];
  FLOWKV_CHECK(a.is_array() && a.size() == 3, src,
               ": field \"axes_dims_rope\" must be a list of 3 entries (frame, height, width)");
  std::vector<int64_t> out;
  for (const Json& v : a) {
    out.push_back(json_int_value(v, 2, limits::kMaxWidth, src + ": axes_dims_rope entry"));
  }
  return out;
}

// capacity_factors: one number for every layer, or a list (one per layer).
std::vector<double> get_capacity(const Json& j, int64_t layers, const std::string& src) {
  const char* key = "capacity_factors";
  if (!j.contains(key) || j[key].is_null()) return std::vector<double>(layers, 8.0);
  const Json& v = j[key];
  if (v.is_number()) {
    const double d = json_number(j, key, 8.0, 0, 1e9, src);
    return std::vector<double>(layers, d);
  }
  FLOWKV_CHECK(v.is_array(), src, ": field \"", key, "\" must be a number or a list of numbers");
  FLOWKV_CHECK(static_cast<int64_t>(v.size()) == layers, src, ": field \"", key, "\" has ",
               v.size(), " entries for num_layers = ", layers);
  std::vector<double> out;
  for (size_t i = 0; i < v.size(); ++i) {
    FLOWKV_CHECK(v[i].is_number(), src, ": ", key, "[", i, "] must be a number");
    const double d = v[i].get<double>();
    FLOWKV_CHECK(std::isfinite(d) && d >= 0 && d <= 1e9, src, ": ", key, "[", i, "] is ", d,
                 ", outside [0, 1e9]");
    out.push_back(d);
  }
  return out;
}

Config from_json_unguarded(const Json& j, const std::string& src) {
  FLOWKV_CHECK(j.is_object(), src, ": config is not a JSON object");
  json_expect_class(j, kClass, src);
  Config c;
  c.patch_size = get_size(j, "patch_size", c.patch_size, 1, 64, src);
  c.in_channels = get_size(j, "in_channels", c.in_channels, 1, limits::kMaxWidth, src);
  // out_channels or in_channels: None and 0 both fall back.
  c.out_channels = get_size(j, "out_channels", 0, 0, limits::kMaxWidth, src);
  if (c.out_channels == 0) c.out_channels = c.in_channels;
  c.num_layers = get_size(j, "num_layers", c.num_layers, 0, limits::kMaxBlocks, src);
  c.attention_head_dim =
      get_size(j, "attention_head_dim", c.attention_head_dim, 2, limits::kMaxWidth, src);
  c.num_attention_heads =
      get_size(j, "num_attention_heads", c.num_attention_heads, 1, limits::kMaxWidth, src);
  c.num_key_value_heads =
      get_size(j, "num_key_value_heads", c.num_attention_heads, 1, limits::kMaxWidth, src);
  c.joint_attention_dim =
      get_size(j, "joint_attention_dim", c.joint_attention_dim, 1, limits::kMaxWidth, src);
  c.axes_dims_rope = get_axes(j, c.axes_dims_rope, src);
  c.mlp_ratio = json_number(j, "mlp_ratio", c.mlp_ratio, 0, limits::kMaxMlpRatio, src);
  c.moe_enabled = json_bool(j, "moe_enabled", c.moe_enabled, src);
  if (j.contains("dense_moe_strategy") && !j["dense_moe_strategy"].is_null()) {
    FLOWKV_CHECK(j["dense_moe_strategy"].is_string(), src,
                 ": field \"dense_moe_strategy\" must be a string");
    c.dense_moe_strategy = j["dense_moe_strategy"].get<std::string>();
  }
  c.num_experts = get_size(j, "num_experts", c.num_experts, 1, kMaxExperts, src);
  c.moe_intermediate_dim =
      get_size(j, "moe_intermediate_dim", c.moe_intermediate_dim, 1, limits::kMaxWidth, src);
  c.capacity_factors = get_capacity(j, c.num_layers, src);
  c.use_sigmoid = json_bool(j, "use_sigmoid", c.use_sigmoid, src);
  c.route_scale = json_number(j, "route_scale", c.route_scale, 0, 1e6, src);
  json_bool(j, "use_grouped_mm", false, src);  // a GPU kernel choice: same math
  c.validate(src);
  return c;
}

}  // namespace

const std::vector<std::string>& dense_moe_strategies() {
  static const std::vector<std::string> s = {"leave_first_three_and_last_block_dense",
                                             "leave_first_three_blocks_dense",
                                             "leave_first_block_dense", "all_moe", "all_dense"};
  return s;
}

int64_t Config::dense_inner() const {
  // Python: int(dim * mlp_ratio * 2 / 3) // 128 * 128, left to right in double.
  const double v = static_cast<double>(dim()) * mlp_ratio * 2.0 / 3.0;
  return static_cast<int64_t>(v) / 128 * 128;
}

bool Config::is_moe(int64_t layer) const {
  if (!moe_enabled) return false;
  const std::string& s = dense_moe_strategy;
  if (s == "leave_first_three_and_last_block_dense") return layer >= 3 && layer < num_layers - 1;
  if (s == "leave_first_three_blocks_dense") return layer >= 3;
  if (s == "leave_first_block_dense") return layer >= 1;
  if (s == "all_moe") return true;
  if (s == "all_dense") return false;
  // The reference treats an unknown strategy as all-MoE; validate() refuses it instead.
  fail("NucleusMoE config: unknown dense_moe_strategy \"", s, "\"");
}

double Config::capacity_factor(int64_t layer) const {
  FLOWKV_CHECK(layer >= 0 && layer < static_cast<int64_t>(capacity_factors.size()),
               "NucleusMoE config: no capacity factor for layer ", layer);
  return capacity_factors[static_cast<size_t>(layer)];
}

void Config::validate(const std::string& src) const {
  const auto& known = dense_moe_strategies();
  FLOWKV_CHECK(std::find(known.begin(), known.end(), dense_moe_strategy) != known.end(), src,
               ": field \"dense_moe_strategy\" is \"", dense_moe_strategy,
               "\"; the reference knows leave_first_three_and_last_block_dense, "
               "leave_first_three_blocks_dense, leave_first_block_dense, all_moe, all_dense");
  FLOWKV_CHECK(patch_size >= 1 && patch_size <= 64, src, ": field \"patch_size\" is ", patch_size);
  FLOWKV_CHECK(in_channels >= 1 && in_channels <= limits::kMaxWidth && out_channels >= 1 &&
                   out_channels <= limits::kMaxWidth,
               src, ": fields \"in_channels\" / \"out_channels\" must be in [1, ",
               limits::kMaxWidth, "]");
  FLOWKV_CHECK(num_layers >= 0 && num_layers <= limits::kMaxBlocks, src,
               ": field \"num_layers\" is ", num_layers);
  FLOWKV_CHECK(attention_head_dim >= 2 && attention_head_dim % 2 == 0 && num_attention_heads >= 1 &&
                   num_attention_heads <= limits::kMaxWidth / attention_head_dim,
               src, ": fields \"attention_head_dim\" (even) x \"num_attention_heads\" must give a ",
               "width in [2, ", limits::kMaxWidth, "]");
  FLOWKV_CHECK(num_key_value_heads >= 1 && num_key_value_heads <= num_attention_heads &&
                   num_attention_heads % num_key_value_heads == 0,
               src, ": field \"num_key_value_heads\" is ", num_key_value_heads,
               "; it must divide num_attention_heads = ", num_attention_heads);
  FLOWKV_CHECK(joint_attention_dim >= 1 && joint_attention_dim <= limits::kMaxWidth, src,
               ": field \"joint_attention_dim\" is ", joint_attention_dim);
  FLOWKV_CHECK(axes_dims_rope.size() == 3, src, ": field \"axes_dims_rope\" needs 3 entries");
  for (int64_t a : axes_dims_rope) {
    FLOWKV_CHECK(a >= 2 && a % 2 == 0, src, ": field \"axes_dims_rope\" entries must be even, got ",
                 a);
  }
  const int64_t sum = std::accumulate(axes_dims_rope.begin(), axes_dims_rope.end(), int64_t{0});
  FLOWKV_CHECK(sum == attention_head_dim, src, ": field \"axes_dims_rope\" sums to ", sum,
               " but attention_head_dim is ", attention_head_dim);
  FLOWKV_CHECK(std::isfinite(mlp_ratio) && mlp_ratio > 0 && mlp_ratio <= limits::kMaxMlpRatio, src,
               ": field \"mlp_ratio\" is ", mlp_ratio);
  FLOWKV_CHECK(num_experts >= 1 && num_experts <= kMaxExperts, src, ": field \"num_experts\" is ",
               num_experts, ", outside [1, ", kMaxExperts, "]");
  FLOWKV_CHECK(moe_intermediate_dim >= 1 && moe_intermediate_dim <= limits::kMaxWidth, src,
               ": field \"moe_intermediate_dim\" is ", moe_intermediate_dim);
  FLOWKV_CHECK(std::isfinite(route_scale) && route_scale >= 0 && route_scale <= 1e6, src,
               ": field \"route_scale\" is ", route_scale);
  FLOWKV_CHECK(static_cast<int64_t>(capacity_factors.size()) == num_layers, src,
               ": field \"capacity_factors\" has ", capacity_factors.size(),
               " entries for num_layers = ", num_layers);
  bool any_dense = false;
  for (int64_t i = 0; i < num_layers; ++i) {
    const double cf = capacity_factors[static_cast<size_t>(i)];
    FLOWKV_CHECK(std::isfinite(cf) && cf >= 0, src, ": capacity_factors[", i, "] is ", cf);
    if (!is_moe(i)) {
      any_dense = true;
      continue;
    }
    // C = ceil(cf * S / E) tokens per expert must not exceed the S tokens (torch.topk).
    FLOWKV_CHECK(
        cf <= static_cast<double>(num_experts), src, ": capacity_factors[", i, "] is ", cf,
        "; an expert cannot take more than every token (at most num_experts = ", num_experts, ")");
  }
  FLOWKV_CHECK(!any_dense || dense_inner() > 0, src, ": field \"mlp_ratio\" = ", mlp_ratio,
               " gives the dense layers an MLP width of int(", dim(), " * ", mlp_ratio,
               " * 2 / 3) // 128 * 128 = 0");
}

Config Config::from_json(const Json& j, const std::string& src) {
  return at_input_boundary(src, [&] { return from_json_unguarded(j, src); });
}

Json Config::to_json() const {
  return {{"_class_name", kClass},
          {"patch_size", patch_size},
          {"in_channels", in_channels},
          {"out_channels", out_channels},
          {"num_layers", num_layers},
          {"attention_head_dim", attention_head_dim},
          {"num_attention_heads", num_attention_heads},
          {"num_key_value_heads", num_key_value_heads},
          {"joint_attention_dim", joint_attention_dim},
          {"axes_dims_rope", axes_dims_rope},
          {"mlp_ratio", mlp_ratio},
          {"moe_enabled", moe_enabled},
          {"dense_moe_strategy", dense_moe_strategy},
          {"num_experts", num_experts},
          {"moe_intermediate_dim", moe_intermediate_dim},
          {"capacity_factors", capacity_factors},
          {"use_sigmoid", use_sigmoid},
          {"route_scale", route_scale},
          {"use_grouped_mm", false}};
}

Config Config::released() {
  Config c;
  c.out_channels = 16;
  c.num_layers = 32;
  c.num_key_value_heads = 4;
  c.joint_attention_dim = 4096;
  c.dense_moe_strategy = "leave_first_three_blocks_dense";
  c.num_experts = 64;
  c.capacity_factors = {0, 0, 0, 4, 4};
  c.capacity_factors.resize(32, 2.0);
  return c;
}

}  // namespace flowkv::nucleus
