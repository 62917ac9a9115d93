#include "models/qwen25_vl/vision_config.h"

#include <algorithm>

#include "core/boundary.h"
#include "flowkv/error.h"
#include "flowkv/limits.h"

namespace flowkv::qwen25_vl {

namespace {

// Patch sides and factors flowkv accepts (the released model: patch 14, merge 2, temporal 2).
constexpr int64_t kMaxPatch = 1024;
constexpr int64_t kMaxMerge = 64;
constexpr int64_t kMaxTemporal = 64;
constexpr int64_t kMaxChannels = 16;
constexpr int64_t kMaxWindow = 1 << 20;  // pixels
constexpr int64_t kMaxIntermediate = limits::kMaxWidth * 16;

std::string string_field(const Json& j, const char* key, const std::string& def,
                         const std::string& src) {
  if (!j.contains(key) || j[key].is_null()) return def;
  FLOWKV_CHECK(j[key].is_string(), src, ": ", key, " must be a string");
  return j[key].get<std::string>();
}

// patch_size / temporal_patch_size may be lists in transformers' annotations; only an int is
// implemented.
int64_t size_field(const Json& j, const char* key, int64_t def, int64_t hi,
                   const std::string& src) {
  FLOWKV_CHECK(!(j.contains(key) && j[key].is_array()), src, ": ", key,
               " is a list: only a single integer patch size is supported");
  return json_int(j, key, def, 1, hi, src);
}

// transformers 5.x: rope_parameters {rope_type "axial", rope_theta}; a top-level rope_theta is
// the backward-compatible spelling (rope_parameters' own wins, as standardize_rope_params does).
void read_rope(const Json& j, const std::string& src, VisionConfig& c) {
  c.rope_theta = json_number(j, "rope_theta", c.rope_theta, 1e-30, 1e30, src);
  const char* key = j.contains("rope_parameters") ? "rope_parameters" : "rope_scaling";
  if (!j.contains(key) || j[key].is_null()) return;
  const Json& p = j[key];
  const std::string where = src + ": " + key;
  FLOWKV_CHECK(p.is_object(), where, " must be an object or null");
  const std::string type =
      string_field(p, "rope_type", string_field(p, "type", "axial", where), where);
  FLOWKV_CHECK(
      type == "axial", where, ".rope_type is \"", type,
      "\": only the \"axial\" 2D rotary embedding of Qwen2.5-VL's vision tower is supported");
  c.rope_theta = json_number(p, "rope_theta", c.rope_theta, 1e-30, 1e30, where);
}

VisionConfig from_json_unguarded(const Json& j, const std::string& src) {
  FLOWKV_CHECK(j.is_object(), src, ": vision_config is not a JSON object");
  if (j.contains("model_type") && j["model_type"].is_string()) {
    // 4.x checkpoints (Qwen-Image's text_encoder/) carry the parent's model_type here, which
    // transformers rewrites to qwen2_5_vl_vision.
    const std::string t = j["model_type"].get<std::string>();
    FLOWKV_CHECK(t == "qwen2_5_vl_vision" || t == "qwen2_5_vl", src, ": model_type is \"", t,
                 "\", expected \"qwen2_5_vl_vision\"");
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
  c.window_size = json_int(j, "window_size", c.window_size, 1, kMaxWindow, src);
  c.out_hidden_size = json_int(j, "out_hidden_size", c.out_hidden_size, 1, limits::kMaxWidth, src);
  if (j.contains("fullatt_block_indexes") && !j["fullatt_block_indexes"].is_null()) {
    const Json& d = j["fullatt_block_indexes"];
    FLOWKV_CHECK(d.is_array(), src, ": fullatt_block_indexes must be a list of block indices");
    c.fullatt_block_indexes.clear();
    for (size_t i = 0; i < d.size(); ++i) {
      c.fullatt_block_indexes.push_back(json_int_value(
          d[i], 0, limits::kMaxBlocks, src + ": fullatt_block_indexes[" + std::to_string(i) + "]"));
    }
  }
  c.hidden_act = string_field(j, "hidden_act", c.hidden_act, src);
  read_rope(j, src, c);
  c.validate(src);
  return c;
}

}  // namespace

bool VisionConfig::full_attention(int64_t block) const {
  return std::find(fullatt_block_indexes.begin(), fullatt_block_indexes.end(), block) !=
         fullatt_block_indexes.end();
}

VisionConfig VisionConfig::from_json(const Json& j, const std::string& src) {
  return at_input_boundary(src, [&] { return from_json_unguarded(j, src); });
}

VisionConfig VisionConfig::from_model_config(const Json& j, const std::string& src) {
  return at_input_boundary(src, [&] {
    FLOWKV_CHECK(j.is_object(), src, ": config is not a JSON object");
    if (j.contains("model_type") && j["model_type"].is_string()) {
      const std::string t = j["model_type"].get<std::string>();
      FLOWKV_CHECK(t == "qwen2_5_vl", src, ": model_type is \"", t,
                   "\", expected \"qwen2_5_vl\" (Qwen2_5_VLForConditionalGeneration)");
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
  FLOWKV_CHECK(patch_dim() <= limits::kMaxWidth * 16, src, ": a patch of in_channels ", in_channels,
               " x temporal_patch_size ", temporal_patch_size, " x patch_size ", patch_size,
               "^2 values is too wide");
  FLOWKV_CHECK(merged_hidden() <= limits::kMaxWidth * 16, src, ": hidden_size ", hidden_size,
               " x spatial_merge_size^2 ", merge_unit(), " is too wide");
  FLOWKV_CHECK(merger_window() >= 1, src, ": window_size ", window_size,
               " is smaller than one merged token (spatial_merge_size ", spatial_merge_size,
               " x patch_size ", patch_size, " pixels)");
  for (size_t i = 0; i < fullatt_block_indexes.size(); ++i) {
    const int64_t k = fullatt_block_indexes[i];
    FLOWKV_CHECK(k >= 0 && k < depth, src, ": fullatt_block_indexes[", i, "] = ", k,
                 " is not a block index (depth ", depth, ")");
  }
  FLOWKV_CHECK(hidden_act == "silu", src, ": hidden_act is \"", hidden_act,
               "\": only \"silu\" (the released SwiGLU) is supported");
}

double vision_flops(const VisionConfig& c, std::span<const Grid> grids) {
  const WindowLayout l = window_layout(c, grids);
  auto pairs = [](const std::vector<int64_t>& cu) {
    double p = 0;
    for (size_t i = 0; i + 1 < cu.size(); ++i) {
      const auto len = static_cast<double>(cu[i + 1] - cu[i]);
      p += len * len;
    }
    return p;
  };
  const double n = static_cast<double>(l.cu_seqlens.back());
  const double h = static_cast<double>(c.hidden_size), f = static_cast<double>(c.intermediate_size);
  const double u = static_cast<double>(c.merge_unit()),
               out = static_cast<double>(c.out_hidden_size);
  const double patch = 2 * n * static_cast<double>(c.patch_dim()) * h;
  const double linears = 2 * n * (4 * h * h + 3 * h * f);
  double attention = 0;
  for (int64_t b = 0; b < c.depth; ++b) {
    attention += 4 * h * (c.full_attention(b) ? pairs(l.cu_seqlens) : pairs(l.cu_window_seqlens));
  }
  const double merger = 2 * (n / u) * (u * h * u * h + u * h * out);
  return patch + static_cast<double>(c.depth) * linears + attention + merger;
}

WindowLayout window_layout(const VisionConfig& c, std::span<const Grid> grids) {
  WindowLayout l;
  const int64_t m = c.spatial_merge_size, ws = c.merger_window(), u = c.merge_unit();
  l.cu_window_seqlens.push_back(0);
  l.cu_seqlens.push_back(0);
  int64_t base = 0;  // merged tokens of the images before this one
  for (const Grid& g : grids) {
    const int64_t gh = g[1] / m, gw = g[2] / m;
    const int64_t nwh = (gh + ws - 1) / ws, nww = (gw + ws - 1) / ws;
    for (int64_t t = 0; t < g[0]; ++t) {
      for (int64_t wr = 0; wr < nwh; ++wr) {
        for (int64_t wc = 0; wc < nww; ++wc) {
          // The window's merged tokens, row-major; the padding past the grid is dropped and an
          // empty window adds no boundary (unique_consecutive).
          const int64_t r1 = std::min(gh, (wr + 1) * ws), c1 = std::min(gw, (wc + 1) * ws);
          for (int64_t r = wr * ws; r < r1; ++r) {
            for (int64_t col = wc * ws; col < c1; ++col) {
              l.index.push_back(base + (t * gh + r) * gw + col);
            }
          }
          const auto rows = static_cast<int64_t>(l.index.size()) * u;
          if (rows != l.cu_window_seqlens.back()) l.cu_window_seqlens.push_back(rows);
        }
      }
      l.cu_seqlens.push_back(l.cu_seqlens.back() + g[1] * g[2]);
    }
    base += g[0] * gh * gw;
  }
  return l;
}

}  // namespace flowkv::qwen25_vl
