// Qwen3 text encoder configuration (transformers Qwen3Config, the text_encoder/config.json of a
// FLUX.2 Klein pipeline: Qwen3-4B for Klein 4B, Qwen3-8B for Klein 9B).
#pragma once

#include <string>

#include "flowkv/dtype.h"
#include "io/json.h"

namespace flowkv::qwen3 {

struct Config {
  // Defaults are transformers' Qwen3Config defaults (a missing field takes them).
  int64_t vocab_size = 151936;
  int64_t hidden_size = 4096;
  int64_t intermediate_size = 22016;
  int64_t num_hidden_layers = 32;
  int64_t num_attention_heads = 32;
  int64_t num_key_value_heads = 32;  // null: num_attention_heads
  int64_t head_dim = 128;
  int64_t max_position_embeddings = 32768;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000;  // rope_parameters.rope_theta, else rope_theta, else 10000
  bool tie_word_embeddings = false;
  std::string dtype = "float32";  // torch_dtype / dtype as written (informational)
  // The Qwen2 form of the same layer (Qwen2.5-VL's language model, models/qwen25_vl): biased
  // q/k/v projections and no q/k RMSNorm. Never read from a Qwen3 config.json (whose
  // attention_bias is refused); set by the loaders of the Qwen2 family.
  bool attention_bias = false;  // q_proj/k_proj/v_proj have biases
  bool qk_norm = true;          // q_norm/k_norm per head before RoPE

  int64_t q_width() const { return num_attention_heads * head_dim; }
  int64_t kv_width() const { return num_key_value_heads * head_dim; }

  // Reads config.json. Fields flowkv does not implement are refused by name: attention_bias
  // true, hidden_act other than silu, a RoPE type other than "default", sliding-window layers.
  // `model_type`: the value a config.json's model_type must have when present ("qwen3";
  // "qwen3_vl_text" for the text_config of a Qwen3-VL checkpoint).
  static Config from_json(const Json& j, const std::string& source,
                          const std::string& model_type = "qwen3");
  Json to_json() const;
  void validate(const std::string& source) const;
};

// "Qwen3-8B (FLUX.2 Klein 9B text encoder)" etc., from the shapes alone.
std::string variant_name(const Config& c);

// Released shapes: "qwen3-4b" and "qwen3-8b" (the Klein 4B and 9B text encoders).
bool released_config(const std::string& name, Config* out);

}  // namespace flowkv::qwen3
