#include "models/qwen3_vl/vision_config.h"

#include <cmath>

#include "core/boundary.h"
#include "flowkv/error.h"
#include "flowkv/limits.h"

namespace flowkv::qwen3_vl {

namespace {

// Patch sides and factors flowkv accepts (the released model: patch 16, merge 2, temporal 2).
constexpr int64_t kMaxPatch = 1024;
constexpr int64_t kMaxMerge = 64;
constexpr int64_t kMaxTemporal = 64;
constexpr int64_t kMaxChannels = 16;
constexpr int64_t kMaxIntermediate = limits::kMaxWidth * 16;

std::string string_field(const Json& j, const char* key, const std::string& def,
                         const std::string& src) {
  if (!j.contains(key) || j[key].is_null()) return def;
  FLOWKV_CHECK(j[key].is_string(), src, ": ", key, " must be a string");
  return j[key].get<std::string>();
}

// patch_size / temporal_patch_size may be lists in transformers' annotations; only an int (or a
// list of equal ints, which Conv3d would treat the same way) is implemented.
int64_t size_field(const Json& j, const char* key, int64_t def, int64_t hi,
                   const std::string& src) {
  if (j.contains(key) && j[key].is_array()) {
    FLOWKV_CHECK(false, src, ": ", key,
                 " is a list: only a single integer patch size is supported");
  }
  return json_int(j, key, def, 1, hi, src);
}

void read_rope(const Json& j, const std::string& src, VisionConfig& c) {
  if (!j.contains("rope_parameters") || j["rope_parameters"].is_null()) return;
  const Json& p = j["rope_parameters"];
  const std::string where = src + ": rope_parameters";
  FLOWKV_CHECK(p.is_object(), where, " must be an object or null");
  const std::string type = string_field(p, "rope_type", "axial", where);
  FLOWKV_CHECK(
      type == "axial", where, ".rope_type is \"", type,
      "\": only the \"axial\" 2D rotary embedding of Qwen3-VL's vision tower is supported");
  c.rope_theta = json_number(p, "rope_theta", c.rope_theta, 1e-30, 1e30, where);
}

VisionConfig from_json_unguarded(const Json& j, const std::string& src) {
  FLOWKV_CHECK(j.is_object(), src, ": vision_config is not a JSON object");
  if (j.contains("model_type") && j["model_type"].is_string()) {
    const std::string t = j["model_type"].get<std::string>();
    FLOWKV_CHECK(t == "qwen3_vl_vision" || t == "qwen3_vl", src, ": model_type is \"", t,
                 "\", expected \"qwen3_vl_vision\"");
  }
  VisionConfig c;
  c.depth = json_int(j, "depth", c.depth, 1, limits::kMaxBlocks, src);
  c.hidden_size = json_int(j, "hidden_size", c.hidden_size, 1, limits::kMaxWidth, src);
  c.intermediate_size =
      json_int(j, "intermediate_size", c.intermediate_size, 1, kMaxIntermediate, src);
  c.num_heads = json_int(j, "num_heads", c.num_heads, 1, limits::kMaxWidth, src);
  c.in_channels = json_int(j, "in_channels", c.in_channels, 1, kMaxChannels, src);
  c.patch_size = size_field(j, "patch_size", c.patch_size, kMaxPatch, src);
  c.spatial_merge_size = json_int(j, "spatial_merge_size", c.spatial_merge_size, 1, kMaxMerge, src);
  c.temporal_patch_size =
      size_field(j, "temporal_patch_size", c.temporal_patch_size, kMaxTemporal, src);
  c.out_hidden_size = json_int(j, "out_hidden_size", c.out_hidden_size, 1, limits::kMaxWidth, src);
  c.num_position_embeddings =
      json_int(j, "num_position_embeddings", c.num_position_embeddings, 1, limits::kMaxTokens, src);
  if (j.contains("deepstack_visual_indexes") && !j["deepstack_visual_indexes"].is_null()) {
    const Json& d = j["deepstack_visual_indexes"];
    FLOWKV_CHECK(d.is_array(), src, ": deepstack_visual_indexes must be a list of block indices");
    c.deepstack_visual_indexes.clear();
    for (size_t i = 0; i < d.size(); ++i) {
      c.deepstack_visual_indexes.push_back(
          json_int_value(d[i], 0, limits::kMaxBlocks,
                         src + ": deepstack_visual_indexes[" + std::to_string(i) + "]"));
    }
  }
  c.hidden_act = string_field(j, "hidden_act", c.hidden_act, src);
  read_rope(j, src, c);
  c.validate(src);
  return c;
}

}  // namespace

int64_t VisionConfig::grid_side() const {
  auto s = static_cast<int64_t>(std::sqrt(static_cast<double>(num_position_embeddings)));
  while (s * s > num_position_embeddings) --s;
  while ((s + 1) * (s + 1) <= num_position_embeddings) ++s;
  return s;
}

VisionConfig VisionConfig::from_json(const Json& j, const std::string& src) {
  return at_input_boundary(src, [&] { return from_json_unguarded(j, src); });
}

VisionConfig VisionConfig::from_model_config(const Json& j, const std::string& src) {
  return at_input_boundary(src, [&] {
    FLOWKV_CHECK(j.is_object(), src, ": config is not a JSON object");
    if (j.contains("model_type") && j["model_type"].is_string()) {
      const std::string t = j["model_type"].get<std::string>();
      FLOWKV_CHECK(t == "qwen3_vl", src, ": model_type is \"", t,
                   "\", expected \"qwen3_vl\" (Qwen3VLForConditionalGeneration)");
    }
    if (!j.contains("vision_config") || j["vision_config"].is_null()) {
      VisionConfig c;
      c.validate(src);
      return c;
    }
    return from_json_unguarded(j["vision_config"], src + ": vision_config");
  });
}

void VisionConfig::validate(const std::string& src) const {
  FLOWKV_CHECK(hidden_size % num_heads == 0, src, ": hidden_size ", hidden_size,
               " is not a multiple of num_heads ", num_heads);
  // The axial RoPE splits each head into (h, w) quarters: head_dim / 4 frequencies per axis.
  FLOWKV_CHECK(head_dim() % 4 == 0, src, ": head_dim ", head_dim(), " (hidden_size ", hidden_size,
               " / num_heads ", num_heads, ") must be a multiple of 4 for the 2D rotary embedding");
  const int64_t side = grid_side();
  FLOWKV_CHECK(side * side == num_position_embeddings && side >= 2, src,
               ": num_position_embeddings ", num_position_embeddings,
               " is not the square of a side of at least 2 (the learned position grid is square)");
  FLOWKV_CHECK(patch_dim() <= limits::kMaxWidth * 16, src, ": a patch of in_channels ", in_channels,
               " x temporal_patch_size ", temporal_patch_size, " x patch_size ", patch_size,
               "^2 values is too wide");
  FLOWKV_CHECK(merged_hidden() <= limits::kMaxWidth * 16, src, ": hidden_size ", hidden_size,
               " x spatial_merge_size^2 ", merge_unit(), " is too wide");
  for (size_t i = 0; i < deepstack_visual_indexes.size(); ++i) {
    const int64_t k = deepstack_visual_indexes[i];
    FLOWKV_CHECK(k >= 0 && k < depth, src, ": deepstack_visual_indexes[", i, "] = ", k,
                 " is not a block index (depth ", depth, ")");
    for (size_t j = 0; j < i; ++j) {
      FLOWKV_CHECK(deepstack_visual_indexes[j] != k, src, ": deepstack_visual_indexes lists block ",
                   k, " twice");
    }
  }
  FLOWKV_CHECK(hidden_act == "gelu_pytorch_tanh" || hidden_act == "gelu", src, ": hidden_act is \"",
               hidden_act, "\": only \"gelu_pytorch_tanh\" and \"gelu\" are supported");
}

double vision_flops(const VisionConfig& c, const std::vector<std::array<int64_t, 3>>& grid_thw) {
  double n = 0, pairs = 0;
  for (const auto& g : grid_thw) {
    const double frame = static_cast<double>(g[1]) * static_cast<double>(g[2]);
    n += static_cast<double>(g[0]) * frame;
    pairs += static_cast<double>(g[0]) * frame * frame;
  }
  const double h = static_cast<double>(c.hidden_size), f = static_cast<double>(c.intermediate_size);
  const double u = static_cast<double>(c.merge_unit()),
               out = static_cast<double>(c.out_hidden_size);
  const double patch = 2 * n * static_cast<double>(c.patch_dim()) * h;
  const double block = 2 * n * (4 * h * h + 2 * h * f) + 4 * h * pairs;
  const double mergers = static_cast<double>(c.deepstack_visual_indexes.size() + 1) * 2 * (n / u) *
                         (u * h * u * h + u * h * out);
  return patch + static_cast<double>(c.depth) * block + mergers;
}

}  // namespace flowkv::qwen3_vl
