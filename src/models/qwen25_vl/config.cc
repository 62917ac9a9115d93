#include "models/qwen25_vl/config.h"

#include "core/boundary.h"
#include "flowkv/error.h"
#include "flowkv/limits.h"

namespace flowkv::qwen25_vl {

namespace {

// The RoPE dict transformers reads (rope_scaling when set, else rope_parameters), or null.
Json* rope_dict(Json& t) {
  for (const char* key : {"rope_scaling", "rope_parameters"}) {
    if (t.contains(key) && t[key].is_object()) return &t[key];
  }
  return nullptr;
}

// Qwen2_5_VLTextConfig.convert_rope_params_to_dict: a "mrope" type is the default RoPE (older
// Qwen2.5-VL configs carry rope_scaling {"type": "mrope", "mrope_section": [...]}).
void rename_mrope_type(Json& params) {
  for (const char* key : {"rope_type", "type"}) {
    if (params.contains(key) && !params[key].is_null()) {
      if (params[key].is_string() && params[key].get<std::string>() == "mrope") {
        params[key] = "default";
      }
      return;  // rope_type wins over type
    }
  }
}

void read_mrope(const Json* params, const std::string& src, Config& c) {
  if (!params || !params->contains("mrope_section") || (*params)["mrope_section"].is_null()) return;
  const Json& s = (*params)["mrope_section"];
  FLOWKV_CHECK(s.is_array() && s.size() == 3, src,
               ": rope mrope_section must be a list of 3 sizes (t, h, w)");
  for (size_t i = 0; i < 3; ++i) {
    c.mrope_section[i] = json_int_value(s[i], 0, limits::kMaxWidth,
                                        src + ": mrope_section[" + std::to_string(i) + "]");
  }
}

// Where the text fields are: text_config when it is an object (transformers 5.24 then ignores
// the top level's), else the top level (the 4.x layout).
Json text_fields(const Json& j, std::string& where) {
  if (j.contains("text_config") && j["text_config"].is_object()) {
    where = ": text_config";
    return j["text_config"];
  }
  where = "";
  Json t = j;
  for (const char* key : {"text_config", "vision_config", "model_type", "architectures"}) {
    t.erase(key);
  }
  return t;
}

Config from_json_unguarded(const Json& j, const std::string& src) {
  FLOWKV_CHECK(j.is_object(), src, ": config is not a JSON object");
  if (j.contains("model_type") && j["model_type"].is_string()) {
    const std::string t = j["model_type"].get<std::string>();
    FLOWKV_CHECK(t == "qwen2_5_vl", src, ": model_type is \"", t,
                 "\", expected \"qwen2_5_vl\" (a Qwen2_5_VLForConditionalGeneration checkpoint)");
  }
  std::string where;
  Json t = text_fields(j, where);
  const std::string tsrc = src + where;
  // Qwen2_5_VLTextConfig's defaults where they differ from Qwen3Config's.
  const std::pair<const char*, Json> defaults[] = {
      {"vocab_size", 152064},    {"hidden_size", 8192},       {"intermediate_size", 29568},
      {"num_hidden_layers", 80}, {"num_attention_heads", 64}, {"num_key_value_heads", 8},
      {"rms_norm_eps", 1e-5},    {"rope_theta", 1000000.0},   {"max_position_embeddings", 32768},
      {"max_window_layers", 80},
  };
  for (const auto& [key, value] : defaults) {
    if (!t.contains(key)) t[key] = value;
  }
  // Qwen2_5_VLAttention's head width is hidden_size / heads; its rotary embedding reads a
  // head_dim field first, so one that differs would not run in the reference.
  const int64_t hidden = json_int(t, "hidden_size", 0, 1, limits::kMaxWidth, tsrc);
  const int64_t heads = json_int(t, "num_attention_heads", 0, 1, limits::kMaxWidth, tsrc);
  FLOWKV_CHECK(hidden % heads == 0, tsrc, ": hidden_size ", hidden,
               " is not a multiple of num_attention_heads ", heads);
  if (t.contains("head_dim") && !t["head_dim"].is_null()) {
    FLOWKV_CHECK(json_int(t, "head_dim", 0, 0, limits::kMaxWidth, tsrc) == hidden / heads, tsrc,
                 ": head_dim differs from hidden_size / num_attention_heads = ", hidden / heads,
                 " (Qwen2.5-VL's attention does not support that)");
  }
  t["head_dim"] = hidden / heads;
  // The projections' biases are fixed by the architecture (q/k/v biased, o not), whatever an
  // attention_bias field says.
  t.erase("attention_bias");
  if (Json* params = rope_dict(t)) rename_mrope_type(*params);
  if (!t.contains("torch_dtype") && !t.contains("dtype")) {
    for (const char* key : {"torch_dtype", "dtype"}) {
      if (j.contains(key) && j[key].is_string()) t["dtype"] = j[key];
    }
  }
  const std::string text_type = where.empty() ? "qwen2_5_vl" : "qwen2_5_vl_text";
  if (where.empty()) t["model_type"] = text_type;
  Config c;
  c.text = qwen3::Config::from_json(t, tsrc, text_type);
  c.text.attention_bias = true;
  c.text.qk_norm = false;
  read_mrope(rope_dict(t), tsrc, c);
  c.tie_word_embeddings = json_bool(j, "tie_word_embeddings", false, src);
  c.text.tie_word_embeddings = c.tie_word_embeddings;
  c.image_token_id = json_int(j, "image_token_id", c.image_token_id, 0, limits::kMaxVocab, src);
  c.video_token_id = json_int(j, "video_token_id", c.video_token_id, 0, limits::kMaxVocab, src);
  c.vision_start_token_id =
      json_int(j, "vision_start_token_id", c.vision_start_token_id, 0, limits::kMaxVocab, src);
  c.vision_end_token_id =
      json_int(j, "vision_end_token_id", c.vision_end_token_id, 0, limits::kMaxVocab, src);
  if (j.contains("vision_config") && j["vision_config"].is_object()) {
    c.spatial_merge_size = json_int(j["vision_config"], "spatial_merge_size", c.spatial_merge_size,
                                    1, 64, src + ": vision_config");
  }
  c.validate(src);
  return c;
}

}  // namespace

Config Config::from_json(const Json& j, const std::string& src) {
  return at_input_boundary(src, [&] { return from_json_unguarded(j, src); });
}

void Config::validate(const std::string& src) const {
  text.validate(src);
  FLOWKV_CHECK(text.attention_bias && !text.qk_norm, src,
               ": a Qwen2.5-VL decoder has q/k/v biases and no q/k norm");
  const int64_t half = text.head_dim / 2;
  int64_t sum = 0;
  for (int i = 0; i < 3; ++i) {
    FLOWKV_CHECK(mrope_section[i] >= 0 && mrope_section[i] <= half, src, ": mrope_section[", i,
                 "] is ", mrope_section[i], ", outside [0, head_dim / 2 = ", half, "]");
    sum += mrope_section[i];
  }
  FLOWKV_CHECK(sum == half, src, ": mrope_section [", mrope_section[0], ", ", mrope_section[1],
               ", ", mrope_section[2], "] sums to ", sum, ", not head_dim / 2 = ", half);
  auto id = [&](int64_t v, const char* name) {
    FLOWKV_CHECK(v >= 0 && v < text.vocab_size, src, ": ", name, " ", v,
                 " is outside the vocabulary [0, ", text.vocab_size, ")");
  };
  id(image_token_id, "image_token_id");
  id(video_token_id, "video_token_id");
  id(vision_start_token_id, "vision_start_token_id");
  id(vision_end_token_id, "vision_end_token_id");
  FLOWKV_CHECK(spatial_merge_size >= 1 && spatial_merge_size <= 64, src,
               ": vision_config.spatial_merge_size ", spatial_merge_size, " is outside [1, 64]");
}

}  // namespace flowkv::qwen25_vl
