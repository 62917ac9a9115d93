// The FLUX.2 Klein prompt as diffusers 0.42.1 builds it (Flux2KleinPipeline and
// Flux2KleinKVPipeline, _get_qwen3_prompt_embeds).
#include "flowkv/error.h"
#include "flowkv/limits.h"
#include "text/tokenizer.h"

namespace flowkv::text {

std::string klein_prompt_text(std::string_view prompt) {
  // What Qwen3's chat template (tokenizer_config.json) renders for
  // [{"role": "user", "content": prompt}] with add_generation_prompt=True and
  // enable_thinking=False (checked against transformers' apply_chat_template by
  // python/ref/make_tokenizer_corpus.py for every prompt of the golden corpus).
  std::string text = "<|im_start|>user\n";
  text.append(prompt);
  text.append("<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
  return text;
}

PromptTokens klein_prompt_tokens(const Tokenizer& tokenizer, std::string_view prompt,
                                 int64_t max_length) {
  FLOWKV_CHECK(max_length >= 1 && max_length <= limits::kMaxTokens,
               "the prompt's max_length must be in [1, ", limits::kMaxTokens, "], got ",
               max_length);
  const std::optional<int32_t> pad = tokenizer.token_id("<|endoftext|>");
  FLOWKV_CHECK(pad.has_value(),
               "the tokenizer has no \"<|endoftext|>\" token (Qwen3's pad token): is it the "
               "Qwen3 tokenizer of a FLUX.2 Klein pipeline?");
  PromptTokens out;
  out.ids = tokenizer.encode(klein_prompt_text(prompt));
  out.untruncated_length = static_cast<int64_t>(out.ids.size());
  out.truncated = out.untruncated_length > max_length;
  const auto n = static_cast<size_t>(std::min(out.untruncated_length, max_length));
  out.ids.resize(static_cast<size_t>(max_length), *pad);
  out.mask.assign(static_cast<size_t>(max_length), 0);
  std::fill(out.mask.begin(), out.mask.begin() + static_cast<ptrdiff_t>(n), 1);
  return out;
}

}  // namespace flowkv::text
