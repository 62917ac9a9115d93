// Qwen-Image's prompt templates, the processor's image-pad expansion, the tokenizer's truncation
// and the drop and cut of the hidden states (diffusers 0.42.1 pipeline_qwenimage.py and
// pipeline_qwenimage_edit_plus.py, transformers 5.24 Qwen2VLProcessor).
#include "models/qwen25_vl/prompt.h"

#include <algorithm>
#include <cstring>

#include "core/checked.h"
#include "flowkv/error.h"
#include "flowkv/limits.h"

namespace flowkv::qwen25_vl {

namespace {

constexpr std::string_view kImagePad = "<|image_pad|>";
constexpr std::string_view kVideoPad = "<|video_pad|>";

// The pipelines' prompt_template_encode, split at its "{}".
constexpr std::string_view kTextToImageHead =
    "<|im_start|>system\nDescribe the image by detailing the color, shape, size, texture, "
    "quantity, text, spatial relationships of the objects and background:<|im_end|>\n"
    "<|im_start|>user\n";
constexpr std::string_view kEditPlusHead =
    "<|im_start|>system\nDescribe the key features of the input image (color, shape, size, "
    "texture, objects, background), then explain how the user's text instruction should alter "
    "or modify the image. Generate a new image that meets the user's requirements while "
    "maintaining consistency with the original input where appropriate.<|im_end|>\n"
    "<|im_start|>user\n";
constexpr std::string_view kTail = "<|im_end|>\n<|im_start|>assistant\n";

// Non-overlapping occurrences, left to right (Python's str.count).
int64_t count(std::string_view text, std::string_view what) {
  int64_t n = 0;
  for (size_t at = text.find(what); at != std::string_view::npos;
       at = text.find(what, at + what.size())) {
    ++n;
  }
  return n;
}

void check_grid(const Grid& g, int64_t i, int64_t merge) {
  for (int a = 0; a < 3; ++a) {
    FLOWKV_CHECK(g[a] >= 1 && g[a] <= limits::kMaxTokens, "qwen25_vl prompt: image ", i + 1,
                 " grid (", g[0], ", ", g[1], ", ", g[2], ") has a size outside [1, ",
                 limits::kMaxTokens, "]");
  }
  FLOWKV_CHECK(g[1] % merge == 0 && g[2] % merge == 0, "qwen25_vl prompt: image ", i + 1, " grid (",
               g[0], ", ", g[1], ", ", g[2], ") is not a multiple of the spatial merge size ",
               merge, " in h and w");
}

}  // namespace

int64_t drop_index(Template t) {
  return t == Template::kEditPlus ? 64 : 34;
}

std::string template_text(Template t, std::string_view prompt, int64_t n_images) {
  FLOWKV_CHECK(n_images >= 0 && n_images <= limits::kMaxReferences, "qwen25_vl prompt: ", n_images,
               " condition images, outside [0, ", limits::kMaxReferences, "]");
  FLOWKV_CHECK(t == Template::kEditPlus || n_images == 0,
               "qwen25_vl prompt: the text-to-image template takes no images (", n_images,
               " given)");
  std::string s(t == Template::kEditPlus ? kEditPlusHead : kTextToImageHead);
  for (int64_t i = 1; i <= n_images; ++i) {
    s.append("Picture ").append(std::to_string(i)).append(": <|vision_start|>");
    s.append(kImagePad).append("<|vision_end|>");
  }
  s.append(prompt);
  s.append(kTail);
  return s;
}

PromptTokens prompt_tokens(const text::Tokenizer& tokenizer, Template t, const std::string& prompt,
                           std::span<const Grid> grids, int64_t merge_size) {
  FLOWKV_CHECK(merge_size >= 1 && merge_size <= 64, "qwen25_vl prompt: merge size ", merge_size,
               " is outside [1, 64]");
  const int64_t n_images = static_cast<int64_t>(grids.size());
  const std::string text = template_text(t, prompt, n_images);
  const std::optional<int32_t> pad_id = tokenizer.token_id(kImagePad);
  FLOWKV_CHECK(pad_id.has_value() && tokenizer.encode(kImagePad) == std::vector<int32_t>{*pad_id},
               "qwen25_vl prompt: the tokenizer has no \"<|image_pad|>\" token");
  PromptTokens out;
  out.tmpl = t;
  out.drop = drop_index(t);
  out.image_pad_id = *pad_id;
  out.grids.assign(grids.begin(), grids.end());

  if (t == Template::kTextToImage) {
    // The tokenizer alone (no processor): literal special tokens in the prompt are tokens like
    // any other; truncation keeps the first 1024 + 34.
    out.ids = tokenizer.encode(text);
    const auto max_len = static_cast<size_t>(kTokenizerMaxLength + out.drop);
    if (out.ids.size() > max_len) {
      out.ids.resize(max_len);
      out.truncated = true;
    }
  } else {
    // Qwen2VLProcessor's checks: the placeholders are counted in the whole text.
    const int64_t pads = count(text, kImagePad);
    FLOWKV_CHECK(pads == n_images, "qwen25_vl prompt: the prompt contains the literal text \"",
                 kImagePad, "\" (", pads - n_images,
                 " time(s)), which the Qwen2-VL processor takes for an image placeholder and "
                 "refuses (",
                 pads, " placeholders for ", n_images, " image(s)); remove it from the prompt");
    FLOWKV_CHECK(count(text, kVideoPad) == 0,
                 "qwen25_vl prompt: the prompt contains the literal text \"", kVideoPad,
                 "\", which the Qwen2-VL processor takes for a video placeholder and refuses (no "
                 "videos); remove it from the prompt");
    // The expansion: the i-th placeholder becomes t*h*w / merge^2 pads.
    const int64_t m2 = merge_size * merge_size;
    std::string expanded;
    int64_t total = 0;
    size_t last = 0;
    for (int64_t i = 0; i < n_images; ++i) {
      const Grid& g = grids[static_cast<size_t>(i)];
      check_grid(g, i, merge_size);
      const int64_t n = checked_mul(checked_mul(g[0], g[1], "image grid"), g[2], "image grid") / m2;
      total = checked_add(total, n, "image tokens");
      FLOWKV_CHECK(total <= limits::kMaxTokens, "qwen25_vl prompt: the images make ", total,
                   "+ tokens, over the limit of ", limits::kMaxTokens);
      const size_t at = text.find(kImagePad, last);
      expanded.append(text, last, at - last);
      for (int64_t k = 0; k < n; ++k) expanded.append(kImagePad);
      last = at + kImagePad.size();
    }
    expanded.append(text, last, std::string::npos);
    out.ids = tokenizer.encode(expanded);
  }
  for (int32_t id : out.ids) out.image_tokens += id == *pad_id;
  const int64_t L = static_cast<int64_t>(out.ids.size());
  FLOWKV_CHECK(L > out.drop, "qwen25_vl prompt: ", L, " tokens, not more than the ", out.drop,
               " the pipeline drops (a tokenizer that is not Qwen's?)");
  return out;
}

Tensor encode_prompt(const ExecContext& ctx, const TextModel& model, const PromptTokens& tokens,
                     const VisionEmbeds* vision, int64_t max_sequence_length, Positions positions) {
  const Config& c = model.config();
  FLOWKV_CHECK(max_sequence_length >= 0, "qwen25_vl encode_prompt: max_sequence_length ",
               max_sequence_length, " is negative");
  FLOWKV_CHECK(tokens.image_pad_id == c.image_token_id,
               "qwen25_vl encode_prompt: the tokenizer's "
               "\"<|image_pad|>\" is id ",
               tokens.image_pad_id, ", the model's image_token_id is ", c.image_token_id,
               ": do the tokenizer and the text encoder belong together?");
  TextInputs in{.ids = tokens.ids, .grids = tokens.grids, .vision = vision};
  if (tokens.tmpl == Template::kTextToImage) {
    // The tokenizer-only pipeline: no image features, no grids, positions 0..L-1.
    FLOWKV_CHECK(vision == nullptr,
                 "qwen25_vl encode_prompt: vision embeddings given to a text-to-image prompt");
    in.positions = Positions::kSequential;
  } else {
    FLOWKV_CHECK((vision != nullptr) == !tokens.grids.empty(),
                 "qwen25_vl encode_prompt: ", tokens.grids.size(), " image(s) in the prompt but ",
                 vision ? "vision embeddings" : "no vision embeddings", " given");
    in.positions = positions;
  }
  const Tensor h = model.forward(ctx, in);
  const int64_t L = h.dim(0), H = h.dim(1);
  int64_t n = L - tokens.drop;
  if (max_sequence_length > 0) n = std::min(n, max_sequence_length);
  Tensor out = Tensor::empty({1, n, H});
  std::memcpy(out.f32(), h.f32() + tokens.drop * H, static_cast<size_t>(n * H) * sizeof(float));
  return out;
}

}  // namespace flowkv::qwen25_vl
