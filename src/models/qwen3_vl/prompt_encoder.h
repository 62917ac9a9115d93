// Qwen-Image-2.1's prompt encoder as one piece (diffusers 0.42.1 QwenImage21Pipeline
// ._get_qwen_prompt_embeds for one prompt): the Qwen3-VL processor (template, tokenizer, image
// processor), the vision tower and the language model of a text_encoder/ + processor/ pair. The
// pipeline prepares the images (resized, alpha over white: pipeline/condition_image.h).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/exec_context.h"
#include "flowkv/tensor.h"
#include "io/image.h"

namespace flowkv::qwen3_vl {

// What the other components must fit, from the configs alone.
struct EncoderShape {
  int64_t hidden_size = 0;      // the prompt embeddings' width
  int64_t pixels_per_slot = 0;  // pixels a side of one merged image token (patch x merge)
};
EncoderShape encoder_shape(const std::string& text_encoder_dir, const std::string& processor_dir);

struct PromptEncoding {
  Tensor embeds;               // f32 [1, L, hidden]: the system prompt's rows dropped
  std::vector<uint8_t> slots;  // [L]: 1 where a row is an image slot
  int64_t text_tokens = 0;     // rows that are text
};

// The prompt's rows without running a model: from the tokenizer and the images' sizes.
struct PromptCounts {
  int64_t rows = 0;                  // L, after the drop
  int64_t text_tokens = 0;           // rows that are text
  std::vector<int64_t> image_slots;  // slots of each image (one per 2x2 merged patches)
};
PromptCounts prompt_counts(const std::string& text_encoder_dir, const std::string& processor_dir,
                           const std::string& prompt,
                           std::span<const std::pair<int64_t, int64_t>> image_sizes);

class PromptEncoder {
 public:
  // A text_encoder/ folder (Qwen3VLForConditionalGeneration) and the pipeline's processor/
  // (tokenizer.json, preprocessor_config.json).
  static PromptEncoder load(const std::string& text_encoder_dir, const std::string& processor_dir);
  // One prompt with its condition images (RGB, in order; none: text to image).
  PromptEncoding encode(const ExecContext& ctx, const std::string& prompt,
                        std::span<const Image> images) const;

  struct Impl;

 private:
  std::shared_ptr<const Impl> impl_;
};

}  // namespace flowkv::qwen3_vl
