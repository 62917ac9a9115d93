// Qwen-Image's prompt encoder as one piece (diffusers 0.42.1 QwenImagePipeline /
// QwenImageEditPlusPipeline .encode_prompt for one prompt): the tokenizer (text to image) or the
// Qwen2-VL processor (Edit-Plus: tokenizer and image processor), the vision tower and the
// Qwen2.5-VL language model of a text_encoder/ folder. The pipeline prepares the pictures (the
// 384^2 copies, families/qwen_image/generate.cc).
//
// Positions: with pictures, the rotary positions are those the pinned reference computes
// (transformers 5.24 under diffusers 0.42.1 numbers every token 0..L-1, as the pipeline passes no
// mm_token_type_ids; prompt.h), so flowkv gives diffusers' picture.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "core/exec_context.h"
#include "flowkv/tensor.h"
#include "io/image.h"

namespace flowkv::qwen25_vl {

// What the other components must fit, from the config alone.
struct EncoderShape {
  int64_t hidden_size = 0;  // the prompt embeddings' width
};
EncoderShape encoder_shape(const std::string& text_encoder_dir);

struct PromptEncoding {
  Tensor embeds;  // f32 [1, L, hidden]: the template's leading rows dropped, cut to the maximum
  int64_t vision_tokens = 0;  // rows that are the pictures' vision tokens
  bool truncated = false;     // the tokenizer or max_sequence_length cut the prompt
};

// The prompt's rows without running a model: from the tokenizer and the pictures' sizes.
struct PromptCounts {
  int64_t rows = 0;           // L, after the drop and the cut
  int64_t vision_tokens = 0;  // of which the pictures'
  bool truncated = false;
};

// `processor_dir` empty: text to image (QwenImagePipeline), the tokenizer in `tokenizer_dir`;
// else Edit-Plus, with preprocessor_config.json in processor_dir. `max_sequence_length` 0: no
// cut (Edit-Plus keeps the whole prompt).
PromptCounts prompt_counts(const std::string& text_encoder_dir, const std::string& tokenizer_dir,
                           const std::string& processor_dir, const std::string& prompt,
                           std::span<const std::pair<int64_t, int64_t>> image_sizes,
                           int64_t max_sequence_length);

class PromptEncoder {
 public:
  static PromptEncoder load(const std::string& text_encoder_dir, const std::string& tokenizer_dir,
                            const std::string& processor_dir);
  // One prompt with its pictures (RGB, in order; Edit-Plus only).
  PromptEncoding encode(const ExecContext& ctx, const std::string& prompt,
                        std::span<const Image> images, int64_t max_sequence_length) const;

  struct Impl;

 private:
  std::shared_ptr<const Impl> impl_;
};

}  // namespace flowkv::qwen25_vl
