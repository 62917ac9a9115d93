#include "models/qwen3_vl/config.h"

#include "core/boundary.h"
#include "flowkv/error.h"
#include "flowkv/limits.h"

namespace flowkv::qwen3_vl {

namespace {

// The RoPE dict transformers reads (rope_scaling when set, else rope_parameters), or null.
const Json* rope_dict(const Json& t) {
  for (const char* key : {"rope_scaling", "rope_parameters"}) {
    if (t.contains(key) && t[key].is_object()) return &t[key];
  }
  return nullptr;
}

void read_mrope(const Json& t, const std::string& src, Config& c) {
  const Json* params = rope_dict(t);
  if (!params || !params->contains("mrope_section") || (*params)["mrope_section"].is_null()) return;
  const Json& s = (*params)["mrope_section"];
  FLOWKV_CHECK(s.is_array() && s.size() == 3, src,
               ": text_config rope mrope_section must be a list of 3 sizes (t, h, w)");
  for (size_t i = 0; i < 3; ++i) {
    c.mrope_section[i] = json_int_value(
        s[i], 0, limits::kMaxWidth, src + ": text_config mrope_section[" + std::to_string(i) + "]");
  }
}

Config from_json_unguarded(const Json& j, const std::string& src) {
  FLOWKV_CHECK(j.is_object(), src, ": config is not a JSON object");
  if (j.contains("model_type") && j["model_type"].is_string()) {
    const std::string t = j["model_type"].get<std::string>();
    FLOWKV_CHECK(t == "qwen3_vl", src, ": model_type is \"", t,
                 "\", expected \"qwen3_vl\" (a Qwen3VLForConditionalGeneration checkpoint)");
  }
  FLOWKV_CHECK(j.contains("text_config") && j["text_config"].is_object(), src,
               ": text_config is missing or not an object");
  Json t = j["text_config"];
  // Qwen3VLTextConfig's defaults where they differ from Qwen3Config's.
  if (!t.contains("rope_theta")) t["rope_theta"] = 500000.0;
  if (!t.contains("max_position_embeddings")) t["max_position_embeddings"] = 128000;
  Config c;
  c.text = qwen3::Config::from_json(t, src + ": text_config", "qwen3_vl_text");
  read_mrope(t, src, c);
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
  text.validate(src + ": text_config");
  const int64_t half = text.head_dim / 2;
  for (int i = 0; i < 3; ++i) {
    FLOWKV_CHECK(mrope_section[i] >= 0 && mrope_section[i] <= half, src, ": mrope_section[", i,
                 "] is ", mrope_section[i], ", outside [0, head_dim / 2 = ", half, "]");
  }
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

}  // namespace flowkv::qwen3_vl
