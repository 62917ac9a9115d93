// Qwen3-VL configuration, the language side (transformers Qwen3VLConfig: the text_config part
// and the top-level token ids, plus the one vision field the 3-D positions need). The prompt
// encoder of Qwen-Image 2.1 is a Qwen3VLForConditionalGeneration (its text_encoder/config.json).
#pragma once

#include <array>
#include <cstdint>
#include <string>

#include "io/json.h"
#include "models/qwen3/config.h"

namespace flowkv::qwen3_vl {

struct Config {
  // text_config, read as a Qwen3 config (the decoder layers are the same). Its defaults where a
  // field is missing are Qwen3VLTextConfig's: rope_theta 500000, max_position_embeddings 128000.
  qwen3::Config text;
  // rope_parameters.mrope_section: how many of the head_dim/2 rotary frequencies each of the
  // t, h, w position axes drives. transformers 5.24 always interleaves them (frequency i is
  // driven by h when i % 3 == 1 and i < 3 * section[1], by w when i % 3 == 2 and
  // i < 3 * section[2], else by t), whatever rope_parameters.mrope_interleaved says.
  std::array<int64_t, 3> mrope_section{24, 20, 20};
  // Top level (Qwen3VLConfig defaults: the Qwen tokenizer's ids).
  int64_t image_token_id = 151655;
  int64_t video_token_id = 151656;
  int64_t vision_start_token_id = 151652;
  int64_t vision_end_token_id = 151653;
  bool tie_word_embeddings = false;
  // vision_config.spatial_merge_size: an image of grid (t, h, w) patches becomes
  // t * h * w / merge^2 tokens laid out on a (t, h / merge, w / merge) position grid.
  int64_t spatial_merge_size = 2;

  // Reads a Qwen3VLForConditionalGeneration config.json (model_type "qwen3_vl"). Refused by name:
  // a RoPE type other than "default", attention_bias, a hidden_act other than silu, a malformed
  // mrope_section, token ids outside the vocabulary.
  static Config from_json(const Json& j, const std::string& source);
  void validate(const std::string& source) const;
};

}  // namespace flowkv::qwen3_vl
