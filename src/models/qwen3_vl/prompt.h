// Qwen-Image 2.1's prompt, as diffusers 0.42.1's QwenImage21Pipeline builds it
// (_get_qwen_prompt_embeds) and transformers' Qwen3VLProcessor tokenizes it:
//
//   t2i:  "<|im_start|>system\n" SYS "<|im_end|>\n<|im_start|>user\n" PROMPT
//         "<|im_end|>\n<|im_start|>assistant\n"
//   ti2i: the same with "<image1><|vision_start|><|image_pad|><|vision_end|>" before PROMPT, and
//         " <imageN><|vision_start|><|image_pad|><|vision_end|>" after it for images 2..n,
//
// with SYS = "Comprehend and analyze the provided prompt." and an empty PROMPT replaced by " ".
// The processor expands each <|image_pad|> to t*h*w/merge^2 copies (the image's grid in
// patches), tokenizes (added tokens are found in the raw text, so a prompt's literal
// "<|im_start|>" or "<|vision_start|>" becomes that special token, as in the reference), and
// refuses a text whose <|image_pad|> count differs from the image count or that holds
// <|video_pad|>: a prompt containing either literal string is therefore an Error, as it is a
// ValueError in the reference. The hidden states of the first drop_idx tokens (the system
// message) are dropped.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/exec_context.h"
#include "flowkv/tensor.h"
#include "models/qwen3_vl/config.h"
#include "models/qwen3_vl/text_model.h"
#include "text/tokenizer.h"

namespace flowkv::qwen3_vl {

inline constexpr std::string_view kSystemPrompt = "Comprehend and analyze the provided prompt.";

// The system message as the Qwen3-VL chat template renders [{"role": "system", "content":
// [{"type": "text", "text": kSystemPrompt}]}] (no generation prompt): the pipeline's drop index
// is its token count.
std::string system_text();

// The pipeline's template text for `prompt` with `n_images` condition images (0: t2i), before
// the processor's expansion (one <|image_pad|> per image).
std::string prompt_text(std::string_view prompt, int64_t n_images);

// The number of leading tokens dropped (QwenImage21Pipeline._drop_idx): the tokens of
// system_text(). 14 with the released Qwen3 tokenizer.
int64_t drop_index(const text::Tokenizer& tokenizer);

struct PromptTokens {
  std::vector<int32_t> ids;             // [L]: the whole template, image pads expanded
  std::vector<uint8_t> image_pad_mask;  // [L - drop_idx]: 1 where ids[drop_idx + i] is a pad
  int64_t drop_idx = 0;
};

// The processor's input_ids for one prompt with the given image grids (one per condition image,
// in order; empty: t2i). `cfg` gives the token ids and the merge size (the model config's
// vision_config.spatial_merge_size, which the image processor's merge_size equals in released
// checkpoints). Errors: literal <|image_pad|> / <|video_pad|> in the prompt, a tokenizer whose
// "<|image_pad|>" is not cfg.image_token_id, grids that are not whole merge blocks.
PromptTokens prompt_tokens(const text::Tokenizer& tokenizer, const Config& cfg,
                           std::string_view prompt, std::span<const Grid> grids);

struct PromptEmbeds {
  Tensor embeds;                        // f32 [L - drop_idx, hidden]
  std::vector<uint8_t> image_pad_mask;  // [L - drop_idx]
};

// _get_qwen_prompt_embeds for one prompt: tokens, the language model's last layer before the
// final norm, the first drop_idx rows dropped. `vision` holds the vision tower's outputs for
// `grids` (null when there are no images).
PromptEmbeds prompt_embeds(const ExecContext& ctx, const TextModel& model,
                           const text::Tokenizer& tokenizer, std::string_view prompt,
                           std::span<const Grid> grids, const VisionOutputs* vision);

}  // namespace flowkv::qwen3_vl
