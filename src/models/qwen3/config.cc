#include "models/qwen3/config.h"

#include <cmath>

#include "core/boundary.h"
#include "flowkv/error.h"
#include "flowkv/limits.h"

namespace flowkv::qwen3 {

namespace {

// The MLP width: at most kMaxMlpRatio times the widest model (Qwen3-8B: 12,288 = 3 x 4096).
constexpr int64_t kMaxIntermediate = limits::kMaxWidth * static_cast<int64_t>(limits::kMaxMlpRatio);

std::string string_field(const Json& j, const char* key, const std::string& def,
                         const std::string& src) {
  if (!j.contains(key) || j[key].is_null()) return def;
  FLOWKV_CHECK(j[key].is_string(), src, ": ", key, " must be a string");
  return j[key].get<std::string>();
}

// transformers' convert_rope_params_to_dict: rope_scaling (when set) or rope_parameters holds
// the RoPE dict; its rope_theta wins over a top-level rope_theta; its type is "rope_type" (or
// the older "type"), "default" when absent. Only the default type is implemented.
void read_rope(const Json& j, const std::string& src, Config& c) {
  c.rope_theta = json_number(j, "rope_theta", c.rope_theta, 0, 1e30, src);
  const Json* params = nullptr;
  for (const char* key : {"rope_scaling", "rope_parameters"}) {
    if (j.contains(key) && !j[key].is_null()) {
      FLOWKV_CHECK(j[key].is_object(), src, ": ", key, " must be an object or null");
      if (!params) params = &j[key];
    }
  }
  if (!params) return;
  const std::string where =
      src + ": " +
      (j.contains("rope_scaling") && !j["rope_scaling"].is_null() ? "rope_scaling"
                                                                  : "rope_parameters");
  std::string type = "default";
  for (const char* key : {"rope_type", "type"}) {
    if (params->contains(key) && !(*params)[key].is_null()) {
      FLOWKV_CHECK((*params)[key].is_string(), where, ".", key, " must be a string");
      type = (*params)[key].get<std::string>();
      break;
    }
  }
  FLOWKV_CHECK(type == "default", where, ": RoPE type \"", type,
               "\" is not supported (flowkv implements the default RoPE of the released Qwen3 "
               "models only)");
  c.rope_theta = json_number(*params, "rope_theta", c.rope_theta, 0, 1e30, where);
}

// transformers' layer_types: explicit, or "sliding_attention" for layers >= max_window_layers
// when use_sliding_window is set (with a sliding_window).
void refuse_sliding_window(const Json& j, const std::string& src, const Config& c) {
  if (j.contains("layer_types") && !j["layer_types"].is_null()) {
    const Json& t = j["layer_types"];
    FLOWKV_CHECK(t.is_array(), src, ": layer_types must be a list");
    for (const Json& v : t) {
      FLOWKV_CHECK(v.is_string(), src, ": layer_types entries must be strings");
      FLOWKV_CHECK(v.get<std::string>() == "full_attention", src, ": layer type \"",
                   v.get<std::string>(),
                   "\" is not supported (flowkv implements full attention layers only)");
    }
    return;
  }
  const bool use = json_bool(j, "use_sliding_window", false, src);
  const bool has_window = !(j.contains("sliding_window") && j["sliding_window"].is_null());
  const int64_t max_window_layers =
      json_int(j, "max_window_layers", 28, 0, limits::kMaxBlocks, src);
  FLOWKV_CHECK(!use || !has_window || max_window_layers >= c.num_hidden_layers, src,
               ": use_sliding_window with max_window_layers ", max_window_layers, " < ",
               c.num_hidden_layers,
               " layers: sliding-window attention is not supported (the released Qwen3 models "
               "do not use it)");
}

Config from_json_unguarded(const Json& j, const std::string& src, const std::string& model_type) {
  FLOWKV_CHECK(j.is_object(), src, ": config is not a JSON object");
  if (j.contains("model_type") && j["model_type"].is_string()) {
    const std::string t = j["model_type"].get<std::string>();
    FLOWKV_CHECK(t == model_type, src, ": model_type is \"", t, "\", expected \"", model_type,
                 "\"");
  }
  Config c;
  // Sizes within flowkv's limits (flowkv/limits.h), so every product below fits 64 bits.
  auto size = [&](const char* key, int64_t def, int64_t hi) {
    return json_int(j, key, def, 0, hi, src);
  };
  c.vocab_size = size("vocab_size", c.vocab_size, limits::kMaxVocab);
  c.hidden_size = size("hidden_size", c.hidden_size, limits::kMaxWidth);
  c.intermediate_size = size("intermediate_size", c.intermediate_size, kMaxIntermediate);
  c.num_hidden_layers = size("num_hidden_layers", c.num_hidden_layers, limits::kMaxBlocks);
  c.num_attention_heads = size("num_attention_heads", c.num_attention_heads, limits::kMaxWidth);
  c.num_key_value_heads =
      size("num_key_value_heads", c.num_attention_heads, limits::kMaxWidth);  // null: heads
  c.head_dim = size("head_dim", c.head_dim, limits::kMaxWidth);
  c.max_position_embeddings =
      size("max_position_embeddings", c.max_position_embeddings, limits::kMaxTokens);
  c.rms_norm_eps = json_number(j, "rms_norm_eps", c.rms_norm_eps, 0, 1, src);
  c.tie_word_embeddings = json_bool(j, "tie_word_embeddings", c.tie_word_embeddings, src);
  c.dtype = string_field(j, "torch_dtype", string_field(j, "dtype", c.dtype, src), src);
  FLOWKV_CHECK(!json_bool(j, "attention_bias", false, src), src,
               ": attention_bias is true: biased q/k/v/o projections are not supported (the "
               "released Qwen3 models have none)");
  const std::string act = string_field(j, "hidden_act", "silu", src);
  FLOWKV_CHECK(act == "silu", src, ": hidden_act is \"", act, "\", only \"silu\" is supported");
  read_rope(j, src, c);
  c.validate(src);
  refuse_sliding_window(j, src, c);
  return c;
}

}  // namespace

Config Config::from_json(const Json& j, const std::string& src, const std::string& model_type) {
  return at_input_boundary(src, [&] { return from_json_unguarded(j, src, model_type); });
}

void Config::validate(const std::string& src) const {
  auto size = [&](int64_t v, const char* name, int64_t lo, int64_t hi) {
    FLOWKV_CHECK(v >= lo && v <= hi, src, ": ", name, " is ", v, ", outside [", lo, ", ", hi, "]");
  };
  size(vocab_size, "vocab_size", 1, limits::kMaxVocab);
  size(hidden_size, "hidden_size", 1, limits::kMaxWidth);
  size(intermediate_size, "intermediate_size", 1, kMaxIntermediate);
  size(num_hidden_layers, "num_hidden_layers", 1, limits::kMaxBlocks);
  size(num_attention_heads, "num_attention_heads", 1, limits::kMaxWidth);
  size(num_key_value_heads, "num_key_value_heads", 1, num_attention_heads);
  size(head_dim, "head_dim", 2, limits::kMaxWidth);
  size(q_width(), "num_attention_heads * head_dim", 1, limits::kMaxWidth);
  size(max_position_embeddings, "max_position_embeddings", 1, limits::kMaxTokens);
  FLOWKV_CHECK(num_attention_heads % num_key_value_heads == 0, src, ": num_attention_heads (",
               num_attention_heads, ") is not a multiple of num_key_value_heads (",
               num_key_value_heads, ")");
  FLOWKV_CHECK(head_dim % 2 == 0, src, ": head_dim must be even (RoPE pairs)");
  FLOWKV_CHECK(hidden_size % 2 == 0, src, ": hidden_size must be even");
  FLOWKV_CHECK(std::isfinite(rope_theta) && rope_theta > 0, src, ": rope_theta must be positive");
  FLOWKV_CHECK(std::isfinite(rms_norm_eps) && rms_norm_eps > 0, src,
               ": rms_norm_eps must be positive");
}

Json Config::to_json() const {
  Json j;
  j["architectures"] = {"Qwen3ForCausalLM"};
  j["model_type"] = "qwen3";
  j["vocab_size"] = vocab_size;
  j["hidden_size"] = hidden_size;
  j["intermediate_size"] = intermediate_size;
  j["num_hidden_layers"] = num_hidden_layers;
  j["num_attention_heads"] = num_attention_heads;
  j["num_key_value_heads"] = num_key_value_heads;
  j["head_dim"] = head_dim;
  j["max_position_embeddings"] = max_position_embeddings;
  j["rms_norm_eps"] = rms_norm_eps;
  j["rope_theta"] = rope_theta;
  j["rope_scaling"] = nullptr;
  j["tie_word_embeddings"] = tie_word_embeddings;
  j["attention_bias"] = false;
  j["hidden_act"] = "silu";
  j["use_sliding_window"] = false;
  j["torch_dtype"] = dtype;
  return j;
}

std::string variant_name(const Config& c) {
  const bool base = c.num_hidden_layers == 36 && c.num_attention_heads == 32 &&
                    c.num_key_value_heads == 8 && c.head_dim == 128 && c.vocab_size == 151936;
  if (base && c.hidden_size == 2560 && c.intermediate_size == 9728) {
    return "Qwen3-4B (FLUX.2 Klein 4B text encoder)";
  }
  if (base && c.hidden_size == 4096 && c.intermediate_size == 12288) {
    return "Qwen3-8B (FLUX.2 Klein 9B text encoder)";
  }
  return "Qwen3 custom (" + std::to_string(c.num_hidden_layers) + " layers, width " +
         std::to_string(c.hidden_size) + ")";
}

bool released_config(const std::string& name, Config* out) {
  Config c;
  c.num_hidden_layers = 36;
  c.num_attention_heads = 32;
  c.num_key_value_heads = 8;
  c.head_dim = 128;
  c.max_position_embeddings = 40960;
  c.rope_theta = 1000000;
  c.dtype = "bfloat16";
  if (name == "qwen3-4b") {
    c.hidden_size = 2560;
    c.intermediate_size = 9728;
    c.tie_word_embeddings = true;
  } else if (name == "qwen3-8b") {
    c.hidden_size = 4096;
    c.intermediate_size = 12288;
  } else {
    return false;
  }
  *out = c;
  return true;
}

}  // namespace flowkv::qwen3
