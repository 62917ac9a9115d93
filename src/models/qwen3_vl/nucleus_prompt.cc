// NucleusMoE-Image's prompt encoder (see nucleus_prompt.h).
#include "models/qwen3_vl/nucleus_prompt.h"

#include <algorithm>
#include <cstring>
#include <optional>

#include "core/checked.h"
#include "flowkv/error.h"
#include "flowkv/limits.h"
#include "io/json.h"
#include "io/mapped_file.h"

namespace flowkv::qwen3_vl {

namespace {

// A tokenizer_config.json side: "left" or "right", "right" when absent.
bool left_side(const Json& cfg, const char* key, const std::string& src) {
  if (!cfg.contains(key) || cfg[key].is_null()) return false;
  FLOWKV_CHECK(cfg[key].is_string(), src, ": ", key, " must be \"left\" or \"right\"");
  const std::string v = cfg[key].get<std::string>();
  FLOWKV_CHECK(v == "left" || v == "right", src, ": ", key,
               " must be \"left\" or \"right\", got \"", v, "\"");
  return v == "left";
}

}  // namespace

std::string nucleus_prompt_text(std::string_view prompt) {
  std::string s = "<|im_start|>system\n";
  s.append(kNucleusSystemPrompt);
  s.append("<|im_end|>\n<|im_start|>user\n");
  s.append(prompt);
  s.append("<|im_end|>\n<|im_start|>assistant\n");
  return s;
}

Padding read_padding(const std::string& processor_dir, const text::Tokenizer& tokenizer) {
  const std::string src = processor_dir + "/tokenizer_config.json";
  Json cfg = Json::object();
  if (path_exists(src)) cfg = read_json_file(src);
  FLOWKV_CHECK(cfg.is_object(), src, ": not a JSON object");
  Padding p;
  p.pad_left = left_side(cfg, "padding_side", src);
  p.truncate_left = left_side(cfg, "truncation_side", src);
  std::string pad = "<|endoftext|>";  // Qwen2Tokenizer's default pad_token
  if (cfg.contains("pad_token") && !cfg["pad_token"].is_null()) {
    const Json& v = cfg["pad_token"];
    if (v.is_string()) {
      pad = v.get<std::string>();
    } else {
      FLOWKV_CHECK(v.is_object() && v.contains("content") && v["content"].is_string(), src,
                   ": pad_token must be a string or an object with a \"content\" string");
      pad = v["content"].get<std::string>();
    }
  }
  const std::optional<int32_t> id = tokenizer.token_id(pad);
  FLOWKV_CHECK(id.has_value(), src, ": the pad_token \"", pad, "\" is not in the tokenizer");
  p.pad_id = *id;
  return p;
}

NucleusTokens nucleus_prompt_tokens(const text::Tokenizer& tokenizer, const Padding& padding,
                                    std::string_view prompt, int64_t max_length) {
  FLOWKV_CHECK(max_length >= kNucleusPadMultiple && max_length <= limits::kMaxTokens &&
                   max_length % kNucleusPadMultiple == 0,
               "nucleus prompt: max_sequence_length ", max_length, " must be a multiple of ",
               kNucleusPadMultiple, " in [", kNucleusPadMultiple, ", ", limits::kMaxTokens,
               "] (the reference tokenizer refuses truncation with pad_to_multiple_of=",
               kNucleusPadMultiple, " otherwise)");
  for (std::string_view pad :
       {std::string_view("<|image_pad|>"), std::string_view("<|video_pad|>")}) {
    FLOWKV_CHECK(prompt.find(pad) == std::string_view::npos,
                 "nucleus prompt: the prompt contains the literal text \"", pad,
                 "\", which the Qwen3-VL processor takes for an image or video placeholder and "
                 "refuses (no images); remove it from the prompt");
  }
  std::vector<int32_t> ids = tokenizer.encode(nucleus_prompt_text(prompt));
  NucleusTokens t;
  t.untruncated = static_cast<int64_t>(ids.size());
  t.truncated = t.untruncated > max_length;
  if (t.truncated) {
    if (padding.truncate_left)
      ids.erase(ids.begin(), ids.end() - max_length);
    else
      ids.resize(static_cast<size_t>(max_length));
  }
  const auto n = static_cast<int64_t>(ids.size());
  const int64_t L = (n + kNucleusPadMultiple - 1) / kNucleusPadMultiple * kNucleusPadMultiple;
  const auto pads = static_cast<size_t>(L - n);
  t.ids.reserve(static_cast<size_t>(L));
  t.mask.reserve(static_cast<size_t>(L));
  if (padding.pad_left) {
    t.ids.assign(pads, padding.pad_id);
    t.mask.assign(pads, 0);
  }
  t.ids.insert(t.ids.end(), ids.begin(), ids.end());
  t.mask.insert(t.mask.end(), ids.size(), 1);
  if (!padding.pad_left) {
    t.ids.insert(t.ids.end(), pads, padding.pad_id);
    t.mask.insert(t.mask.end(), pads, 0);
  }
  return t;
}

NucleusPromptEncoding nucleus_prompt_embeds(const ExecContext& ctx, const TextModel& model,
                                            const NucleusTokens& tokens, int64_t return_index) {
  const bool all = std::all_of(tokens.mask.begin(), tokens.mask.end(), [](uint8_t m) { return m; });
  const Tensor h = model.hidden_state(
      ctx, {.ids = tokens.ids, .attention_mask = all ? std::span<const uint8_t>() : tokens.mask},
      return_index);
  NucleusPromptEncoding e;
  const int64_t L = h.dim(0), H = h.dim(1);
  e.embeds = Tensor::empty({1, L, H});
  std::memcpy(e.embeds.f32(), h.f32(), static_cast<size_t>(L * H) * sizeof(float));
  if (!all) e.mask = tokens.mask;
  e.truncated = tokens.truncated;
  e.untruncated = tokens.untruncated;
  return e;
}

int64_t nucleus_prompt_rows(const std::string& processor_dir, const std::string& prompt,
                            int64_t max_length) {
  const text::Tokenizer tok = text::Tokenizer::from_folder(processor_dir);
  const Padding p = read_padding(processor_dir, tok);
  return static_cast<int64_t>(nucleus_prompt_tokens(tok, p, prompt, max_length).ids.size());
}

struct NucleusPromptEncoder::Impl {
  text::Tokenizer tokenizer;
  Padding padding;
  TextModel model;
};

NucleusPromptEncoder NucleusPromptEncoder::load(const std::string& text_encoder_dir,
                                                const std::string& processor_dir) {
  text::Tokenizer tok = text::Tokenizer::from_folder(processor_dir);
  const Padding p = read_padding(processor_dir, tok);
  TextModel m = TextModel::load(text_encoder_dir);
  FLOWKV_CHECK(p.pad_id < m.config().text.vocab_size, processor_dir, ": the pad token id ",
               p.pad_id, " is outside the text encoder's vocabulary of ",
               m.config().text.vocab_size, " (mismatched components)");
  NucleusPromptEncoder e;
  e.impl_ = std::make_shared<const Impl>(Impl{std::move(tok), p, std::move(m)});
  return e;
}

NucleusPromptEncoding NucleusPromptEncoder::encode(const ExecContext& ctx, std::string_view prompt,
                                                   int64_t max_length, int64_t return_index) const {
  const NucleusTokens t =
      nucleus_prompt_tokens(impl_->tokenizer, impl_->padding, prompt, max_length);
  return nucleus_prompt_embeds(ctx, impl_->model, t, return_index);
}

const TextModel& NucleusPromptEncoder::model() const {
  return impl_->model;
}
const text::Tokenizer& NucleusPromptEncoder::tokenizer() const {
  return impl_->tokenizer;
}
const Padding& NucleusPromptEncoder::padding() const {
  return impl_->padding;
}

}  // namespace flowkv::qwen3_vl
