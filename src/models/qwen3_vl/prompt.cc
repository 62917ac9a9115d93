// Qwen-Image 2.1's prompt template, the processor's image-pad expansion and the drop of the
// system message (diffusers 0.42.1 QwenImage21Pipeline, transformers 5.24 Qwen3VLProcessor).
#include "models/qwen3_vl/prompt.h"

#include <cstring>

#include "core/checked.h"
#include "flowkv/error.h"
#include "flowkv/limits.h"

namespace flowkv::qwen3_vl {

namespace {

constexpr std::string_view kImagePad = "<|image_pad|>";
constexpr std::string_view kVideoPad = "<|video_pad|>";
constexpr std::string_view kImageSlot = "<|vision_start|><|image_pad|><|vision_end|>";

// Non-overlapping occurrences, left to right (Python's str.count).
int64_t count(std::string_view text, std::string_view what) {
  int64_t n = 0;
  for (size_t at = text.find(what); at != std::string_view::npos;
       at = text.find(what, at + what.size())) {
    ++n;
  }
  return n;
}

}  // namespace

std::string system_text() {
  std::string s = "<|im_start|>system\n";
  s.append(kSystemPrompt);
  s.append("<|im_end|>\n");
  return s;
}

std::string prompt_text(std::string_view prompt, int64_t n_images) {
  FLOWKV_CHECK(n_images >= 0 && n_images <= limits::kMaxReferences, "qwen3_vl prompt: ", n_images,
               " condition images, outside [0, ", limits::kMaxReferences, "]");
  // Qwen has no bos token: an empty prompt would leave the user turn empty, so the pipeline
  // substitutes a space.
  if (prompt.empty()) prompt = " ";
  std::string s = system_text();
  s.append("<|im_start|>user\n");
  if (n_images > 0) {
    s.append("<image1>").append(kImageSlot);
    for (int64_t i = 2; i <= n_images; ++i) {
      s.append(" <image").append(std::to_string(i)).append(">").append(kImageSlot);
    }
  }
  s.append(prompt);
  s.append("<|im_end|>\n<|im_start|>assistant\n");
  return s;
}

int64_t drop_index(const text::Tokenizer& tokenizer) {
  return static_cast<int64_t>(tokenizer.encode(system_text()).size());
}

PromptTokens prompt_tokens(const text::Tokenizer& tokenizer, const Config& cfg,
                           std::string_view prompt, std::span<const Grid> grids) {
  const int64_t n_images = static_cast<int64_t>(grids.size());
  const std::string text = prompt_text(prompt, n_images);
  // Qwen3VLProcessor's checks (ProcessorMixin.validate_inputs): the placeholders counted in the
  // whole text, so a prompt's own "<|image_pad|>" or "<|video_pad|>" is refused.
  const int64_t pads = count(text, kImagePad);
  FLOWKV_CHECK(pads == n_images, "qwen3_vl prompt: the prompt contains the literal text \"",
               kImagePad, "\" (", pads - n_images,
               " time(s)), which the Qwen3-VL processor takes for an image placeholder and "
               "refuses (",
               pads, " placeholders for ", n_images, " image(s)); remove it from the prompt");
  FLOWKV_CHECK(count(text, kVideoPad) == 0,
               "qwen3_vl prompt: the prompt contains the literal text \"", kVideoPad,
               "\", which the Qwen3-VL processor takes for a video placeholder and refuses (no "
               "videos); remove it from the prompt");
  const std::vector<int32_t> pad_ids = tokenizer.encode(kImagePad);
  FLOWKV_CHECK(pad_ids.size() == 1 && pad_ids[0] == cfg.image_token_id,
               "qwen3_vl prompt: the tokenizer's \"<|image_pad|>\" is not the model's "
               "image_token_id ",
               cfg.image_token_id, ": do the tokenizer and the text encoder belong together?");

  // The processor's expansion: the i-th placeholder becomes t*h*w / merge^2 pads.
  const int64_t m2 = cfg.spatial_merge_size * cfg.spatial_merge_size;
  std::string expanded;
  int64_t total = 0;
  size_t last = 0;
  for (int64_t i = 0; i < n_images; ++i) {
    const Grid& g = grids[static_cast<size_t>(i)];
    for (int a = 0; a < 3; ++a) {
      FLOWKV_CHECK(g[a] >= 1 && g[a] <= limits::kMaxTokens, "qwen3_vl prompt: image ", i + 1,
                   " grid (", g[0], ", ", g[1], ", ", g[2], ") has a size outside [1, ",
                   limits::kMaxTokens, "]");
    }
    FLOWKV_CHECK(g[1] % cfg.spatial_merge_size == 0 && g[2] % cfg.spatial_merge_size == 0,
                 "qwen3_vl prompt: image ", i + 1, " grid (", g[0], ", ", g[1], ", ", g[2],
                 ") is not a multiple of the spatial merge size ", cfg.spatial_merge_size,
                 " in h and w");
    const int64_t n = checked_mul(checked_mul(g[0], g[1], "image grid"), g[2], "image grid") / m2;
    total = checked_add(total, n, "image tokens");
    FLOWKV_CHECK(total <= limits::kMaxTokens, "qwen3_vl prompt: the images make ", total,
                 "+ tokens, over the limit of ", limits::kMaxTokens);
    const size_t at = text.find(kImagePad, last);
    expanded.append(text, last, at - last);
    for (int64_t k = 0; k < n; ++k) expanded.append(kImagePad);
    last = at + kImagePad.size();
  }
  expanded.append(text, last, std::string::npos);

  PromptTokens out;
  out.ids = tokenizer.encode(expanded);
  int64_t got = 0;
  for (int32_t id : out.ids) got += id == cfg.image_token_id;
  FLOWKV_CHECK(got == total, "qwen3_vl prompt: ", got, " image tokens after tokenization, ", total,
               " expected");
  out.drop_idx = drop_index(tokenizer);
  const int64_t L = static_cast<int64_t>(out.ids.size());
  FLOWKV_CHECK(L > out.drop_idx, "qwen3_vl prompt: ", L, " tokens, not more than the ",
               out.drop_idx, " dropped");
  out.image_pad_mask.resize(static_cast<size_t>(L - out.drop_idx));
  for (int64_t i = out.drop_idx; i < L; ++i) {
    out.image_pad_mask[static_cast<size_t>(i - out.drop_idx)] = out.ids[i] == cfg.image_token_id;
  }
  return out;
}

PromptEmbeds prompt_embeds(const ExecContext& ctx, const TextModel& model,
                           const text::Tokenizer& tokenizer, std::string_view prompt,
                           std::span<const Grid> grids, const VisionOutputs* vision) {
  const PromptTokens tok = prompt_tokens(tokenizer, model.config(), prompt, grids);
  const Tensor h = model.forward(ctx, {.ids = tok.ids, .grids = grids, .vision = vision});
  const int64_t L = h.dim(0), H = h.dim(1), n = L - tok.drop_idx;
  PromptEmbeds out;
  out.embeds = Tensor::empty({n, H});
  std::memcpy(out.embeds.f32(), h.f32() + tok.drop_idx * H,
              static_cast<size_t>(n * H) * sizeof(float));
  out.image_pad_mask = tok.image_pad_mask;
  return out;
}

}  // namespace flowkv::qwen3_vl
