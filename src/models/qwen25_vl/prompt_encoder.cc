// Qwen-Image's prompt encoder: tokenizer or processor, vision tower and language model together
// (see prompt_encoder.h).
#include "models/qwen25_vl/prompt_encoder.h"

#include <algorithm>
#include <optional>

#include "flowkv/error.h"
#include "io/json.h"
#include "models/qwen25_vl/config.h"
#include "models/qwen25_vl/prompt.h"
#include "models/qwen25_vl/source.h"
#include "models/qwen25_vl/text_model.h"
#include "models/qwen25_vl/vision.h"
#include "models/qwen3_vl/image_processor.h"
#include "text/tokenizer.h"

namespace flowkv::qwen25_vl {

namespace {

struct Parts {
  Config cfg;
  std::optional<qwen3_vl::ImageProcessorConfig> proc;  // Edit-Plus
  text::Tokenizer tokenizer;
  Template tmpl = Template::kTextToImage;
};

// The configs and tokenizer, checked against each other.
Parts read_parts(const std::string& text_encoder_dir, const std::string& tokenizer_dir,
                 const std::string& processor_dir) {
  Parts p{text_encoder_config(text_encoder_dir), std::nullopt,
          text::Tokenizer::from_folder(tokenizer_dir), Template::kTextToImage};
  if (!processor_dir.empty()) {
    p.tmpl = Template::kEditPlus;
    p.proc = qwen3_vl::ImageProcessorConfig::read(processor_dir + "/preprocessor_config.json");
    FLOWKV_CHECK(p.proc->merge_size == p.cfg.spatial_merge_size, processor_dir,
                 "/preprocessor_config.json: merge_size ", p.proc->merge_size,
                 " differs from the text encoder's vision_config.spatial_merge_size ",
                 p.cfg.spatial_merge_size, " (mismatched components)");
  }
  return p;
}

std::vector<Grid> grids_of(const Parts& p,
                           std::span<const std::pair<int64_t, int64_t>> image_sizes) {
  std::vector<Grid> grids;
  for (const auto& [w, h] : image_sizes) grids.push_back(qwen3_vl::image_grid(*p.proc, w, h));
  return grids;
}

}  // namespace

struct PromptEncoder::Impl {
  Parts parts;
  std::optional<VisionTower> vision;
  TextModel text;
};

EncoderShape encoder_shape(const std::string& text_encoder_dir) {
  return {text_encoder_config(text_encoder_dir).text.hidden_size};
}

PromptCounts prompt_counts(const std::string& text_encoder_dir, const std::string& tokenizer_dir,
                           const std::string& processor_dir, const std::string& prompt,
                           std::span<const std::pair<int64_t, int64_t>> image_sizes,
                           int64_t max_sequence_length) {
  const Parts p = read_parts(text_encoder_dir, tokenizer_dir, processor_dir);
  FLOWKV_CHECK(p.proc || image_sizes.empty(), "a text-to-image prompt takes no pictures");
  const std::vector<Grid> grids = p.proc ? grids_of(p, image_sizes) : std::vector<Grid>{};
  const PromptTokens t =
      prompt_tokens(p.tokenizer, p.tmpl, prompt, grids, p.cfg.spatial_merge_size);
  PromptCounts c;
  c.rows = static_cast<int64_t>(t.ids.size()) - t.drop;
  c.truncated = t.truncated;
  if (max_sequence_length > 0 && c.rows > max_sequence_length) {
    c.rows = max_sequence_length;
    c.truncated = true;
  }
  c.vision_tokens = t.image_tokens;
  return c;
}

PromptEncoder PromptEncoder::load(const std::string& text_encoder_dir,
                                  const std::string& tokenizer_dir,
                                  const std::string& processor_dir) {
  Parts parts = read_parts(text_encoder_dir, tokenizer_dir, processor_dir);
  std::optional<VisionTower> vision;
  if (parts.proc) vision = VisionTower::load(text_encoder_dir);
  TextModel text = TextModel::load(text_encoder_dir);
  PromptEncoder e;
  e.impl_ =
      std::make_shared<const Impl>(Impl{std::move(parts), std::move(vision), std::move(text)});
  return e;
}

PromptEncoding PromptEncoder::encode(const ExecContext& ctx, const std::string& prompt,
                                     std::span<const Image> images,
                                     int64_t max_sequence_length) const {
  const Impl& m = *impl_;
  FLOWKV_CHECK(m.vision || images.empty(), "a text-to-image prompt takes no pictures");
  std::vector<Grid> grids;
  VisionEmbeds vision;
  if (!images.empty()) {
    const qwen3_vl::ProcessedImages px = qwen3_vl::process_images(*m.parts.proc, images);
    grids.assign(px.grid_thw.begin(), px.grid_thw.end());
    vision.embeds = m.vision->forward(ctx, px.pixel_values, grids);
  }
  const PromptTokens t =
      prompt_tokens(m.parts.tokenizer, m.parts.tmpl, prompt, grids, m.parts.cfg.spatial_merge_size);
  PromptEncoding r;
  r.embeds = encode_prompt(ctx, m.text, t, images.empty() ? nullptr : &vision, max_sequence_length,
                           Positions::kSequential);
  r.vision_tokens = t.image_tokens;
  r.truncated = t.truncated || (max_sequence_length > 0 &&
                                static_cast<int64_t>(t.ids.size()) - t.drop > max_sequence_length);
  return r;
}

}  // namespace flowkv::qwen25_vl
