// Qwen-Image's prompt side (diffusers 0.42.1):
//
//   kTextToImage (QwenImagePipeline._get_qwen_prompt_embeds): "<|im_start|>system\nDescribe the
//     image by detailing ...:<|im_end|>\n<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>
//     assistant\n", tokenized with truncation to 1024 + 34 tokens; the first 34 hidden states
//     (the system turn and "<|im_start|>user\n") are dropped, then encode_prompt keeps the first
//     max_sequence_length (512 in the pipeline's __call__).
//   kEditPlus (QwenImageEditPlusPipeline): its own system prompt, the user content
//     "Picture 1: <|vision_start|><|image_pad|><|vision_end|>Picture 2: ..." + prompt, each
//     <|image_pad|> expanded by the Qwen2VLProcessor to t*h*w / merge^2 pads; no truncation;
//     the first 64 hidden states are dropped; no max_sequence_length cut.
//
// The features are the language model's final hidden state (after the final norm).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/exec_context.h"
#include "flowkv/tensor.h"
#include "models/qwen25_vl/config.h"
#include "models/qwen25_vl/text_model.h"
#include "text/tokenizer.h"

namespace flowkv::qwen25_vl {

enum class Template { kTextToImage, kEditPlus };

// QwenImagePipeline.tokenizer_max_length: the prompt's token budget after the drop.
inline constexpr int64_t kTokenizerMaxLength = 1024;

// The pipeline's prompt_template_encode_start_idx: 34 (kTextToImage), 64 (kEditPlus).
int64_t drop_index(Template t);

// The template text for `prompt` with `n_images` condition images (kEditPlus only), before the
// processor's expansion (one <|image_pad|> per image).
std::string template_text(Template t, std::string_view prompt, int64_t n_images);

struct PromptTokens {
  std::vector<int32_t> ids;  // [L]: the template applied, tokenized, pads expanded, truncated
  int64_t drop = 0;          // leading rows encode_prompt drops
  Template tmpl = Template::kTextToImage;
  std::vector<Grid> grids;    // the images' grids (kEditPlus), for the 3-D positions
  int64_t image_pad_id = -1;  // the tokenizer's <|image_pad|> id
  int64_t image_tokens = 0;   // pads in ids (expanded)
  bool truncated = false;     // kTextToImage: the tokenizer cut the text at 1024 + 34 tokens
};

// The ids the pipeline's tokenizer (kTextToImage) or processor (kEditPlus) gives for one prompt.
// `grids`: one per condition image in order (kEditPlus; must be empty for kTextToImage);
// `merge_size`: the image processor's merge_size (the model's vision_config.spatial_merge_size).
// Errors: grids with kTextToImage, grids that are not whole merge blocks, a kEditPlus prompt that
// spells "<|image_pad|>" or "<|video_pad|>" (the processor takes them for placeholders and
// refuses the count), a tokenizer without a single-token <|image_pad|>, too few tokens to drop.
PromptTokens prompt_tokens(const text::Tokenizer& tokenizer, Template t, const std::string& prompt,
                           std::span<const Grid> grids, int64_t merge_size);

// The pipeline's encode_prompt for one prompt: the language model's final hidden state over
// tokens.ids, the first tokens.drop rows dropped, then at most max_sequence_length rows kept
// (0: no cut, as kEditPlus). f32 [1, L - drop (cut), hidden].
//
// `vision`: the vision tower's output for tokens.grids (kEditPlus with images), else nullptr.
// `positions`: the rotary positions with images. kMrope (default) is get_rope_index's 3-D
// positions, as transformers 4.x computed them for the pipeline and as the model was trained;
// transformers 5.24 under diffusers 0.42.1 numbers the tokens 0..L-1 instead (the pipeline passes
// no mm_token_type_ids), which kSequential reproduces. Text-only prompts are the same either way.
Tensor encode_prompt(const ExecContext& ctx, const TextModel& model, const PromptTokens& tokens,
                     const VisionEmbeds* vision, int64_t max_sequence_length,
                     Positions positions = Positions::kMrope);

}  // namespace flowkv::qwen25_vl
