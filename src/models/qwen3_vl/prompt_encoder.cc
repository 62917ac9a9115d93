// Qwen-Image-2.1's prompt encoder: processor, vision tower and language model together (see
// prompt_encoder.h).
#include "models/qwen3_vl/prompt_encoder.h"

#include <cstring>

#include "flowkv/error.h"
#include "io/json.h"
#include "models/qwen3_vl/config.h"
#include "models/qwen3_vl/image_processor.h"
#include "models/qwen3_vl/prompt.h"
#include "models/qwen3_vl/text_model.h"
#include "models/qwen3_vl/vision.h"
#include "text/tokenizer.h"

namespace flowkv::qwen3_vl {

namespace {

struct Parts {
  Config cfg;
  ImageProcessorConfig proc;
  text::Tokenizer tokenizer;
};

// The configs and tokenizer, checked against each other.
Parts read_parts(const std::string& text_encoder_dir, const std::string& processor_dir) {
  const std::string config = text_encoder_dir + "/config.json";
  Parts p{Config::from_json(read_json_file(config), config),
          ImageProcessorConfig::read(processor_dir + "/preprocessor_config.json"),
          text::Tokenizer::from_json_file(processor_dir + "/tokenizer.json")};
  FLOWKV_CHECK(p.proc.merge_size == p.cfg.spatial_merge_size, processor_dir,
               "/preprocessor_config.json: merge_size ", p.proc.merge_size,
               " differs from the text encoder's vision_config.spatial_merge_size ",
               p.cfg.spatial_merge_size, " (mismatched components)");
  return p;
}

}  // namespace

struct PromptEncoder::Impl {
  Parts parts;
  VisionTower vision;
  TextModel text;
};

EncoderShape encoder_shape(const std::string& text_encoder_dir, const std::string& processor_dir) {
  const std::string config = text_encoder_dir + "/config.json";
  const Config cfg = Config::from_json(read_json_file(config), config);
  const ImageProcessorConfig proc =
      ImageProcessorConfig::read(processor_dir + "/preprocessor_config.json");
  FLOWKV_CHECK(proc.merge_size == cfg.spatial_merge_size, processor_dir,
               "/preprocessor_config.json: merge_size ", proc.merge_size,
               " differs from the text encoder's vision_config.spatial_merge_size ",
               cfg.spatial_merge_size, " (mismatched components)");
  return {cfg.text.hidden_size, proc.patch_size * proc.merge_size};
}

PromptCounts prompt_counts(const std::string& text_encoder_dir, const std::string& processor_dir,
                           const std::string& prompt,
                           std::span<const std::pair<int64_t, int64_t>> image_sizes) {
  const Parts p = read_parts(text_encoder_dir, processor_dir);
  std::vector<Grid> grids;
  for (const auto& [w, h] : image_sizes) grids.push_back(image_grid(p.proc, w, h));
  const PromptTokens t = prompt_tokens(p.tokenizer, p.cfg, prompt, grids);
  PromptCounts c;
  c.rows = static_cast<int64_t>(t.image_pad_mask.size());
  for (uint8_t v : t.image_pad_mask) c.text_tokens += v == 0;
  const int64_t merge2 = p.cfg.spatial_merge_size * p.cfg.spatial_merge_size;
  for (const Grid& g : grids) c.image_slots.push_back(g[0] * g[1] * g[2] / merge2);
  return c;
}

PromptEncoder PromptEncoder::load(const std::string& text_encoder_dir,
                                  const std::string& processor_dir) {
  Parts parts = read_parts(text_encoder_dir, processor_dir);
  VisionTower vision = VisionTower::load(text_encoder_dir);
  TextModel text = TextModel::load(text_encoder_dir);
  PromptEncoder e;
  e.impl_ =
      std::make_shared<const Impl>(Impl{std::move(parts), std::move(vision), std::move(text)});
  return e;
}

PromptEncoding PromptEncoder::encode(const ExecContext& ctx, const std::string& prompt,
                                     std::span<const Image> images) const {
  const Impl& m = *impl_;
  std::vector<Grid> grids;
  VisionOutputs vo;
  if (!images.empty()) {
    const ProcessedImages px = process_images(m.parts.proc, images);
    VisionOutput out = m.vision.forward(ctx, px.pixel_values, px.grid_thw);
    grids = px.grid_thw;
    vo.embeds = std::move(out.embeds);
    vo.deepstack = std::move(out.deepstack);
  }
  const PromptEmbeds e =
      prompt_embeds(ctx, m.text, m.parts.tokenizer, prompt, grids, images.empty() ? nullptr : &vo);
  PromptEncoding r;
  const int64_t L = e.embeds.dim(0), H = e.embeds.dim(1);
  r.embeds = Tensor::empty({1, L, H});
  std::memcpy(r.embeds.f32(), e.embeds.f32(), static_cast<size_t>(L * H) * sizeof(float));
  r.slots = e.image_pad_mask;
  for (uint8_t v : r.slots) r.text_tokens += v == 0;
  return r;
}

}  // namespace flowkv::qwen3_vl
