// NucleusMoE-Image's prompt, as diffusers 0.42.1's NucleusMoEImagePipeline.encode_prompt builds it
// for one prompt (the pipeline encodes the prompt and the negative prompt in separate calls) with
// transformers 5.24's Qwen3VLProcessor and Qwen3VLForConditionalGeneration:
//
//   text = "<|im_start|>system\n" SYS "<|im_end|>\n<|im_start|>user\n" PROMPT
//          "<|im_end|>\n<|im_start|>assistant\n"
//
// (what the Qwen3-VL Instruct chat template renders for [system: SYS as a string, user:
// [{"type": "text", "text": PROMPT}]] with add_generation_prompt=True; an empty PROMPT stays
// empty), tokenized with truncation to max_sequence_length (default 1024) and padding="longest"
// with pad_to_multiple_of=8, so that one prompt of n tokens becomes L = 8 * ceil(min(n, max) / 8)
// ids. The sides and the pad token come from the processor's tokenizer_config.json (Padding).
// The embeddings are the text encoder's hidden_states[return_index] (default -8) over all L rows,
// padding rows included; the mask is the attention mask, or none when it is all ones. No rows
// are dropped.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/exec_context.h"
#include "flowkv/tensor.h"
#include "models/qwen3_vl/text_model.h"
#include "text/tokenizer.h"

namespace flowkv::qwen3_vl {

// pipeline_nucleusmoe_image.py DEFAULT_SYSTEM_PROMPT.
inline constexpr std::string_view kNucleusSystemPrompt =
    "You are an image generation assistant. Follow the user's prompt literally. Pay careful "
    "attention to spatial layout: objects described as on the left must appear on the left, on "
    "the right on the right. Match exact object counts and assign colors to the correct objects.";
inline constexpr int64_t kNucleusMaxSequenceLength = 1024;  // default_max_sequence_length
inline constexpr int64_t kNucleusReturnIndex = -8;          // default_return_index
inline constexpr int64_t kNucleusPadMultiple = 8;           // pad_to_multiple_of

// The chat-templated text of one prompt.
std::string nucleus_prompt_text(std::string_view prompt);

// How the processor's tokenizer pads and truncates: tokenizer_config.json's padding_side and
// truncation_side ("right" when absent: transformers' class defaults) and pad_token (a string or
// {"content": ...}; Qwen2Tokenizer's "<|endoftext|>" when absent). tokenizer.json's own
// "padding"/"truncation" sections (null in Qwen's files) are not read.
struct Padding {
  bool pad_left = false;
  bool truncate_left = false;
  int32_t pad_id = 0;
};
Padding read_padding(const std::string& processor_dir, const text::Tokenizer& tokenizer);

struct NucleusTokens {
  std::vector<int32_t> ids;   // [L], L a multiple of 8
  std::vector<uint8_t> mask;  // [L]: 1 for a token, 0 for padding
  int64_t untruncated = 0;    // the template's tokens before truncation
  bool truncated = false;     // more than max_length: cut as the reference cuts them
};
// The processor's input_ids and attention_mask for one prompt. Errors: max_length outside
// [8, limits::kMaxTokens] or not a multiple of 8 (the reference's tokenizer refuses truncation
// with pad_to_multiple_of otherwise), a prompt with the literal "<|image_pad|>" or
// "<|video_pad|>" (the processor takes it for a placeholder and refuses it without images).
NucleusTokens nucleus_prompt_tokens(const text::Tokenizer& tokenizer, const Padding& padding,
                                    std::string_view prompt,
                                    int64_t max_length = kNucleusMaxSequenceLength);

struct NucleusPromptEncoding {
  Tensor embeds;              // f32 [1, L, hidden]
  std::vector<uint8_t> mask;  // [L], or empty when every row is a token (the pipeline's None)
  bool truncated = false;
  int64_t untruncated = 0;
};

// The text encoder's hidden_states[return_index] for the tokens (TextModel::hidden_state with
// the attention mask). The pipeline's `return_index or default` turns 0 into -8: pass
// kNucleusReturnIndex for the default.
NucleusPromptEncoding nucleus_prompt_embeds(const ExecContext& ctx, const TextModel& model,
                                            const NucleusTokens& tokens,
                                            int64_t return_index = kNucleusReturnIndex);

// L for a prompt without running a model (the processor's tokenizer.json and
// tokenizer_config.json in processor_dir), for planning.
int64_t nucleus_prompt_rows(const std::string& processor_dir, const std::string& prompt,
                            int64_t max_length = kNucleusMaxSequenceLength);

class NucleusPromptEncoder {
 public:
  // A text_encoder/ folder (Qwen3VLForConditionalGeneration; only the language model is read)
  // and the pipeline's processor/ (tokenizer.json, or Qwen2Tokenizer's vocab.json and merges.txt:
  // text::Tokenizer::from_folder; tokenizer_config.json).
  static NucleusPromptEncoder load(const std::string& text_encoder_dir,
                                   const std::string& processor_dir);
  NucleusPromptEncoding encode(const ExecContext& ctx, std::string_view prompt,
                               int64_t max_length = kNucleusMaxSequenceLength,
                               int64_t return_index = kNucleusReturnIndex) const;
  const TextModel& model() const;
  const text::Tokenizer& tokenizer() const;
  const Padding& padding() const;

  struct Impl;

 private:
  std::shared_ptr<const Impl> impl_;
};

}  // namespace flowkv::qwen3_vl
