// Qwen2.5-VL configuration, the language side (transformers 5.24 Qwen2_5_VLConfig: its
// text_config, the top-level token ids and the one vision field the 3-D positions need).
// Qwen-Image's text_encoder/ is a Qwen2_5_VLForConditionalGeneration (Qwen2.5-VL-7B-Instruct).
#pragma once

#include <array>
#include <cstdint>
#include <string>

#include "io/json.h"
#include "models/qwen3/config.h"

namespace flowkv::qwen25_vl {

// An image's grid in vision patches (t, h, w), as the image processor's image_grid_thw gives it.
using Grid = std::array<int64_t, 3>;

struct Config {
  // The decoder, read as a Qwen3 config in its Qwen2 form (attention_bias: biased q/k/v;
  // qk_norm off). head_dim is hidden_size / num_attention_heads (Qwen2_5_VLAttention's). Defaults
  // where a field is missing are Qwen2_5_VLTextConfig's: vocab_size 152064, hidden_size 8192,
  // intermediate_size 29568, 80 layers, 64 heads, 8 key/value heads, rms_norm_eps 1e-5,
  // rope_theta 1e6, max_position_embeddings 32768.
  qwen3::Config text;
  // rope mrope_section: the head_dim/2 rotary frequencies in three consecutive chunks driven by
  // the t, h and w positions (Qwen2_5_VLRotaryEmbedding.recomposition_frequencies: not
  // interleaved, unlike Qwen3-VL). Its sizes sum to head_dim / 2.
  std::array<int64_t, 3> mrope_section{16, 24, 24};
  // Top level (Qwen2_5_VLConfig defaults: the Qwen tokenizer's ids).
  int64_t image_token_id = 151655;
  int64_t video_token_id = 151656;
  int64_t vision_start_token_id = 151652;
  int64_t vision_end_token_id = 151653;
  bool tie_word_embeddings = false;
  // vision_config.spatial_merge_size: an image of grid (t, h, w) patches becomes
  // t * h * w / merge^2 tokens laid out on a (t, h / merge, w / merge) position grid.
  int64_t spatial_merge_size = 2;

  // Reads a Qwen2_5_VLForConditionalGeneration config.json (model_type "qwen2_5_vl") in either
  // layout: transformers 5.x's, text fields in text_config, or the flat one transformers 4.x
  // wrote (the released Qwen-Image text_encoder/), text fields at the top level. As in
  // transformers 5.24, a text_config object wins and the top level is read only without one. A
  // "mrope" RoPE type is the default RoPE (transformers renames it). Refused by name: another
  // RoPE type, a hidden_act other than silu, a head_dim other than hidden_size / heads, sliding
  // window layers, a malformed mrope_section, token ids outside the vocabulary.
  static Config from_json(const Json& model_config, const std::string& what);
  void validate(const std::string& what) const;
};

}  // namespace flowkv::qwen25_vl
