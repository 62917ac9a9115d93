// Qwen-Image-2.1 from a prompt and condition images to a picture, as diffusers 0.42.1's
// QwenImage21Pipeline.__call__ does it, stage by stage:
//   prompt      each condition image resized to about resolution^2 pixels (RGBA Lanczos),
//               pasted over white for the Qwen3-VL processor; the template, the vision tower,
//               the language model's last pre-norm hidden states without the system prompt:
//               the positive branch, and the negative one under classifier-free guidance
//   conditions  the same RGBA images through the VAE encoder (mode), normalised, flattened
//   denoise     torch-seeded noise, the one denoising loop with the exact prefix cache (one per
//               CFG branch) under causal_condition
//   decode      de-normalise, VAE decode, RGBA pixels
// This file is the family's spec of those stages; pipeline/generate.h runs them.
#include <cstdio>
#include <filesystem>
#include <memory>

#include "core/arena.h"
#include "families/family.h"
#include "flowkv/error.h"
#include "flowkv/generate.h"
#include "flowkv/limits.h"
#include "flowkv/model.h"
#include "io/atomic_file.h"
#include "io/checkpoint.h"
#include "io/image.h"
#include "io/pipeline_folder.h"
#include "models/qwen3/weights.h"
#include "models/qwen3_vl/config.h"
#include "models/qwen3_vl/prompt_encoder.h"
#include "models/qwen3_vl/vision.h"
#include "models/qwen3_vl/vision_config.h"
#include "models/qwen3_vl/vision_weights.h"
#include "models/qwen_image/config.h"
#include "models/qwen_image/weights.h"
#include "models/qwen_image21_vae/image_processor.h"
#include "models/qwen_image21_vae/model.h"
#include "models/qwen_image21_vae/weights.h"
#include "pipeline/condition_image.h"
#include "pipeline/generate.h"
#include "pipeline/identity.h"

namespace flowkv::families {

namespace {

namespace fs = std::filesystem;

constexpr int64_t kDefaultResolution = 1024;  // QwenImage21Pipeline output_resolution
constexpr int64_t kMultiple = 32;             // vae_scale_factor * 2: sizes are floored to it
constexpr int64_t kSlotTokens = 4;            // each vision-language image slot: 2x2 latents

struct Components {
  std::string transformer, text_encoder, processor, vae;
  qwen::Config21 transformer_cfg;
  qwen21_vae::Config vae_cfg;
  std::vector<double> sample_sigmas;  // model_index.json's sample_sigmas (empty: linspace)
};

std::string config_path(const std::string& dir) {
  return (fs::path(dir) / "config.json").string();
}

// Before any weight is read: every component is there and they fit together.
Components check_components(const PipelineFolder& p) {
  Components c;
  c.transformer = p.component("transformer").path;
  c.text_encoder = p.component("text_encoder").path;
  c.processor = p.component("processor").path;
  c.vae = p.component("vae").path;
  FLOWKV_CHECK(path_exists(c.transformer), c.transformer, ": missing (model_index.json names it)");
  for (const std::string* d : {&c.text_encoder, &c.vae}) {
    FLOWKV_CHECK(path_exists(config_path(*d)), *d, ": missing (model_index.json names it, but ",
                 config_path(*d), " does not exist)");
  }
  for (const char* f : {"/tokenizer.json", "/preprocessor_config.json"}) {
    FLOWKV_CHECK(path_exists(c.processor + f), c.processor, f,
                 ": missing (the Qwen3-VL processor of the pipeline)");
  }
  // The transformer may be a GGUF file (in its folder, or given in place of it): its config
  // from the file's metadata, or inferred from the tensors of a config-less conversion.
  const CheckpointScan ts = scan_checkpoint(c.transformer);
  c.transformer_cfg =
      ts.config ? qwen::Config21::from_json(*ts.config, ts.path) : qwen::config21_of(ts);
  const qwen3_vl::EncoderShape te = qwen3_vl::encoder_shape(c.text_encoder, c.processor);
  c.vae_cfg = qwen21_vae::Config::from_json(read_json_file(config_path(c.vae)), config_path(c.vae));
  const qwen::Config21& t = c.transformer_cfg;
  FLOWKV_CHECK(te.hidden_size == t.context_in_dim, p.path, ": the text encoder's hidden size ",
               te.hidden_size, " does not fit the transformer's context_in_dim ", t.context_in_dim,
               " (mismatched components)");
  FLOWKV_CHECK(t.patch_size == 1 && c.vae_cfg.z_dim == t.in_channels, p.path, ": the VAE's ",
               c.vae_cfg.z_dim, " latent channels do not fit the transformer's in_channels ",
               t.in_channels, " (patch_size ", t.patch_size, "; mismatched components)");
  // One vision-language image slot stands for 2x2 latent tokens of 16 pixels: the processor's
  // merged patches must cover 32 pixels.
  FLOWKV_CHECK(te.pixels_per_slot == kMultiple, p.path, ": the processor's merged patch covers ",
               te.pixels_per_slot, " pixels; Qwen-Image-2.1's transformer reads one slot as 2x2 ",
               "latent tokens of 16 pixels (32)");
  FLOWKV_CHECK(c.vae_cfg.scale_factor() == kMultiple / 2, p.path, ": the VAE scales by ",
               c.vae_cfg.scale_factor(), "; Qwen-Image-2.1's pipeline assumes 16");
  if (p.index.contains("sample_sigmas") && !p.index["sample_sigmas"].is_null()) {
    const Json& s = p.index["sample_sigmas"];
    FLOWKV_CHECK(s.is_array() && !s.empty(), p.path,
                 "/model_index.json: sample_sigmas must be a list of numbers");
    for (const Json& v : s) {
      FLOWKV_CHECK(v.is_number(), p.path,
                   "/model_index.json: sample_sigmas must be a list of numbers");
      const double x = v.get<double>();
      FLOWKV_CHECK(x > 0 && x <= 1, p.path, "/model_index.json: sample_sigmas value ", x,
                   " is outside (0, 1]");
      c.sample_sigmas.push_back(x);
    }
  }
  return c;
}

using pipeline::size_str;

// Packed latents [1, h*w, C] to an RGBA picture.
Image decode_latents(const qwen21_vae::Vae& vae, const Tensor& latents, int64_t gh, int64_t gw,
                     bool tiled) {
  const qwen21_vae::DecodeOptions d{.tiled = tiled};
  return qwen21_vae::postprocess(vae.decode(ExecContext{}, qwen21_vae::unpack(latents, gh, gw), d))
      .at(0);
}

// The prompt is padded to the longest branch, not to a fixed length.
void check_text_length(const PipelineFolder& p, const GenerateRequest& req) {
  FLOWKV_CHECK(req.max_sequence_length == 0, p.path,
               ": max_sequence_length is FLUX.2 Klein's padded prompt length; Qwen-Image-2.1 "
               "pads its prompts to the longest branch");
}

// What the prompt encoder sees of a request: the condition images pasted over white.
struct QwenPlan {
  std::vector<Image> vl_images;
  int64_t resolution = kDefaultResolution;
};

// Qwen-Image-2.1's stages for the one orchestration (pipeline/generate.h).
class Qwen21Spec final : public pipeline::GenerateSpec {
 public:
  Qwen21Spec(const PipelineFolder& p, const PipelineOptions& o)
      : p_(p), c_(check_components(p)), dtype_(o.dtype) {}

  std::string images_stage() const override { return "conditions"; }
  std::string cached_name() const override { return "prefix"; }
  std::string kv_name() const override { return "prefix K/V"; }
  PixelFormat pixel_format() const override { return PixelFormat::kRGBA; }
  // QwenImage21Pipeline.__call__'s num_inference_steps (sample_sigmas, when set, fix it).
  int default_steps() const override {
    return c_.sample_sigmas.empty() ? qwen21_pipeline_default_steps(p_.class_name)
                                    : static_cast<int>(c_.sample_sigmas.size());
  }

  void plan(pipeline::Plan& p, std::vector<Image> decoded) const override {
    const GenerateRequest& req = p.request;
    check_text_length(p_, req);
    auto qp = std::make_shared<QwenPlan>();
    qp->resolution = req.resolution > 0 ? req.resolution : kDefaultResolution;
    // diffusers ignores num_inference_steps when the pipeline sets sample_sigmas; a step count
    // that disagrees is refused here, before any work, rather than dropped silently.
    FLOWKV_CHECK(c_.sample_sigmas.empty() || req.steps == 0 ||
                     req.steps == static_cast<int>(c_.sample_sigmas.size()),
                 p_.path, "/model_index.json sets ", c_.sample_sigmas.size(),
                 " sample_sigmas, which fix the step count; --steps ", req.steps,
                 " differs (leave it out)");
    p.sigmas = c_.sample_sigmas;
    if (!p.sigmas.empty()) p.steps = static_cast<int>(p.sigmas.size());
    // diffusers: guidance runs when true_cfg_scale > 1 and a negative prompt is given.
    p.cfg = req.cfg_scale > 1.0f && req.has_negative_prompt;
    GenerateLayout& l = p.layout;
    l.cfg = p.cfg;
    // Step 1 of __call__: the condition images at their pipeline size (RGBA).
    for (size_t i = 0; i < decoded.size(); ++i) {
      p.images.push_back(
          qwen21_condition_image(decoded[i], qp->resolution, "condition image " + p.names[i]));
      l.image_sizes.emplace_back(p.images.back().width, p.images.back().height);
      qp->vl_images.push_back(over_white(p.images.back()));
    }
    // Each image's prompt slots must cover its latents 2x2: checked from the processor config
    // before any weight is read (a min_pixels above the image's size would resize it again).
    const qwen3_vl::PromptCounts pc =
        qwen3_vl::prompt_counts(c_.text_encoder, c_.processor, req.prompt, l.image_sizes);
    for (size_t i = 0; i < p.images.size(); ++i) {
      const Image& im = p.images[i];
      const int64_t tokens = (im.width / 16) * (im.height / 16);
      FLOWKV_CHECK(pc.image_slots[i] * kSlotTokens == tokens, "condition image ", p.names[i],
                   ": at ", size_str(im.width, im.height), " the processor makes ",
                   pc.image_slots[i], " prompt slots for ", tokens,
                   " latent tokens (4 each expected): its min_pixels / max_pixels "
                   "(preprocessor_config.json) resize the image again; raise --resolution");
    }
    l.text_tokens = pc.text_tokens;
    for (int64_t slots : pc.image_slots) l.image_tokens.push_back(slots * kSlotTokens);
    if (p.cfg) {
      l.negative_text_tokens =
          qwen3_vl::prompt_counts(c_.text_encoder, c_.processor, req.negative_prompt, l.image_sizes)
              .text_tokens;
    }
    int64_t want_w = req.width, want_h = req.height;
    if (!p.images.empty()) {  // the last image's calculate_dimensions, unless given
      if (want_w == 0) want_w = p.images.back().width;
      if (want_h == 0) want_h = p.images.back().height;
    }
    if (want_w == 0) want_w = qp->resolution;
    if (want_h == 0) want_h = qp->resolution;
    FLOWKV_CHECK(want_w > 0 && want_h > 0, "the image size ", size_str(want_w, want_h),
                 " is not a size");
    p.grid_w = want_w / kMultiple * 2, p.grid_h = want_h / kMultiple * 2;  // latent tokens
    FLOWKV_CHECK(p.grid_w >= 2 && p.grid_h >= 2, "the image size ", size_str(want_w, want_h),
                 " is smaller than ", kMultiple, " pixels a side");
    l.width = p.grid_w * (kMultiple / 2), l.height = p.grid_h * (kMultiple / 2);
    l.target_tokens = p.grid_w * p.grid_h;
    l.transformer = c_.transformer;
    p.family = qp;
    pipeline::check_schedule(
        p, scheduler_, sched::qwen_image_scheduler_config(),
        [&](const sched::FlowMatchConfig& cfg) { return sched::linear_mu(l.target_tokens, cfg); });
  }

  std::string text_encoder_path() const override { return c_.text_encoder; }
  std::string vae_path() const override { return c_.vae; }

  pipeline::PromptJob prompt(pipeline::Components& comps, const pipeline::Plan& p,
                             const std::string& text) const override {
    const auto qp = std::static_pointer_cast<const QwenPlan>(p.family);
    pipeline::PromptJob job;
    const std::string processor = c_.processor;
    job.describe = [qp, text, processor](store::KeyBuilder& key) {
      pipeline::add_files_identity(key, "processor", processor);
      key.text("rule", "qwen-image-2.1 qwen3-vl prompt").text("text", text);
      key.integer("images", static_cast<int64_t>(qp->vl_images.size()));
      for (const Image& im : qp->vl_images) {
        key.integer("width", im.width).integer("height", im.height);
        key.integer("channels", im.channels);
        key.bytes("pixels", im.pixels.data(), im.pixels.size());
      }
    };
    job.encode = [this, &comps, qp, text](std::string* note) {
      const auto enc = comps.get<qwen3_vl::PromptEncoder>("text_encoder", [&] {
        return qwen3_vl::PromptEncoder::load(c_.text_encoder, c_.processor);
      });
      Arena arena;
      const ExecContext ctx{&arena};
      const qwen3_vl::PromptEncoding e = enc->encode(ctx, text, qp->vl_images);
      *note = std::to_string(e.embeds.dim(1)) + " tokens (" + std::to_string(e.text_tokens) +
              " text, " + std::to_string(e.embeds.dim(1) - e.text_tokens) + " image slots)";
      return PromptEmbeds{.embeds = e.embeds, .slots = e.slots, .mask = {}};
    };
    return job;
  }

  std::string image_rule() const override { return "qwen-image-2.1 condition: RGBA, VAE mode"; }
  Tensor encode_image(pipeline::Components& comps, const Image& image) const override {
    return vae(comps)->encode(ExecContext{}, qwen21_vae::preprocess(image));
  }
  ReferenceLatents pack_image(const Tensor& z) const override {
    return {qwen21_vae::pack(z), z.dim(2), z.dim(3)};
  }

  // Each image's slots in the prompt must cover its latents 2x2 (the processor keeps the
  // pipeline's multiple-of-32 sizes; a processor config that resizes them again would not).
  void check_conditioning(const pipeline::Plan&, const PromptEmbeds& positive,
                          const PromptEmbeds* negative,
                          const std::vector<ReferenceLatents>& images) const override {
    for (const PromptEmbeds* b : {&positive, negative}) {
      if (!b || !b->embeds.defined()) continue;
      int64_t slots = 0, tokens = 0;
      for (uint8_t v : b->slots) slots += v;
      for (const ReferenceLatents& r : images) tokens += r.height * r.width;
      FLOWKV_CHECK(slots * kSlotTokens == tokens, p_.path, ": the prompt encoder gave ", slots,
                   " image slots for ", tokens,
                   " condition latent tokens (4 each expected): the processor resized the "
                   "condition images (check min_pixels / max_pixels in "
                   "preprocessor_config.json)");
    }
  }

  bool exact_cache(const pipeline::Plan& p) const override {
    return p.request.kv_cache && c_.transformer_cfg.causal_condition;
  }

  // randn of [1, 1, C, h, w], flattened to tokens (_pack_latents).
  Tensor noise(pipeline::Components& comps, const pipeline::Plan& p) const override {
    return qwen21_vae::pack(torch_noise(*transformer(comps), p.request.seed,
                                        c_.transformer_cfg.in_channels, p.grid_h, p.grid_w));
  }
  DenoiseResult denoise(pipeline::Components& comps, const DenoiseInputs& in,
                        const DenoiseOptions& o) const override {
    return run_family_denoise(*transformer(comps), in, o, scheduler_);
  }
  Image decode(pipeline::Components& comps, const pipeline::Plan& p, const Tensor& latents,
               bool tiled) const override {
    return decode_latents(*vae(comps), latents, p.grid_h, p.grid_w, tiled);
  }
  std::string decode_note() const override { return "RGBA"; }

  std::string parameters_after_sampler(const pipeline::Plan& p) const override {
    return pipeline::cfg_parameters(p);
  }
  std::string parameters_after_model(const pipeline::Plan& p) const override {
    const auto qp = std::static_pointer_cast<const QwenPlan>(p.family);
    return ", Condition images: " + std::to_string(p.images.size()) +
           (p.images.empty() ? "" : ", Resolution: " + std::to_string(qp->resolution));
  }

 private:
  std::shared_ptr<const qwen21_vae::Vae> vae(pipeline::Components& comps) const {
    return comps.get<qwen21_vae::Vae>("vae", [&] { return qwen21_vae::Vae::load(c_.vae); });
  }
  std::shared_ptr<const LoadedTransformer> transformer(pipeline::Components& comps) const {
    return comps.get<LoadedTransformer>("transformer",
                                        [&] { return load_transformer(c_.transformer, dtype_); });
  }

  const PipelineFolder p_;
  const Components c_;
  const std::string dtype_;
  const std::optional<sched::FlowMatchConfig> scheduler_ = pipeline::pipeline_scheduler(p_);
};

}  // namespace

namespace {

// Qwen3-VL-8B as transformers 5.24 saves it (Qwen-Image-2.1's prompt encoder: hidden 4096 =
// context_in_dim).
Json qwen3_vl_8b_config() {
  return Json::parse(R"({
  "architectures": ["Qwen3VLForConditionalGeneration"], "model_type": "qwen3_vl",
  "dtype": "bfloat16", "tie_word_embeddings": false,
  "image_token_id": 151655, "video_token_id": 151656,
  "vision_start_token_id": 151652, "vision_end_token_id": 151653,
  "text_config": {
    "model_type": "qwen3_vl_text", "attention_bias": false, "head_dim": 128,
    "hidden_act": "silu", "hidden_size": 4096, "intermediate_size": 12288,
    "max_position_embeddings": 262144, "num_attention_heads": 32, "num_hidden_layers": 36,
    "num_key_value_heads": 8, "rms_norm_eps": 1e-06, "vocab_size": 151936,
    "rope_parameters": {"mrope_interleaved": true, "mrope_section": [24, 20, 20],
                        "rope_theta": 5000000.0, "rope_type": "default"}},
  "vision_config": {
    "model_type": "qwen3_vl_vision", "deepstack_visual_indexes": [8, 16, 24], "depth": 27,
    "hidden_act": "gelu_pytorch_tanh", "hidden_size": 1152, "in_channels": 3,
    "intermediate_size": 4304, "num_heads": 16, "num_position_embeddings": 2304,
    "out_hidden_size": 4096, "patch_size": 16, "spatial_merge_size": 2,
    "temporal_patch_size": 2}})");
}

// The released Qwen3-VL preprocessor_config.json.
Json qwen3_vl_preprocessor_config() {
  return Json::parse(R"({
  "image_processor_type": "Qwen2VLImageProcessor", "do_convert_rgb": true,
  "do_normalize": true, "do_rescale": true, "do_resize": true,
  "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5], "merge_size": 2,
  "patch_size": 16, "resample": 3, "rescale_factor": 0.00392156862745098,
  "size": {"longest_edge": 16777216, "shortest_edge": 65536}, "temporal_patch_size": 2})");
}

}  // namespace

void write_zero_qwen3_vl_8b(const std::string& text_encoder_dir, const std::string& processor_dir,
                            DType dtype) {
  const Json te = qwen3_vl_8b_config();
  const qwen3_vl::Config tc = qwen3_vl::Config::from_json(te, "Qwen3-VL-8B config");
  std::vector<ExpectedTensor> table = qwen3::weight_table(tc.text, "model.language_model.");
  for (ExpectedTensor& e : table) {  // untied: the head is lm_head.weight, at the top level
    if (e.name == "model.language_model.lm_head.weight") e.name = "lm_head.weight";
  }
  for (const ExpectedTensor& e : qwen3_vl::vision_weight_table(
           qwen3_vl::VisionConfig::from_model_config(te, "Qwen3-VL-8B config"),
           qwen3_vl::kVisionPrefix)) {
    table.push_back(e);
  }
  write_zero_folder(text_encoder_dir, te, table, dtype);
  fs::create_directories(processor_dir);
  write_file_atomic((fs::path(processor_dir) / "preprocessor_config.json").string(),
                    qwen3_vl_preprocessor_config().dump(2));
}

void qwen21_write_zero_pipeline(const qwen::Config21& transformer, DType dtype,
                                const std::string& dir) {
  const fs::path d(dir);
  write_zero_folder((d / "transformer").string(), transformer.to_json(),
                    qwen::weight_table(transformer), dtype);
  write_zero_qwen3_vl_8b((d / "text_encoder").string(), (d / "processor").string(), dtype);
  const qwen21_vae::Config vae;  // the class defaults are the released VAE
  write_zero_folder((d / "vae").string(), vae.to_json(), qwen21_vae::weight_table(vae), dtype);
  fs::create_directories(d / "scheduler");
  write_file_atomic((d / "scheduler/scheduler_config.json").string(),
                    qwen_scheduler_json().dump(2));
  const Json index = {{"_class_name", "QwenImage21Pipeline"},
                      {"processor", {"transformers", "Qwen3VLProcessor"}},
                      {"scheduler", {"diffusers", "FlowMatchEulerDiscreteScheduler"}},
                      {"text_encoder", {"transformers", "Qwen3VLForConditionalGeneration"}},
                      {"transformer", {"diffusers", "QwenImage21Transformer2DModel"}},
                      {"vae", {"diffusers", "AutoencoderKLQwenImage21"}}};
  write_file_atomic((d / "model_index.json").string(), index.dump(2));
}

std::shared_ptr<const pipeline::GenerateSpec> qwen21_open_pipeline(const PipelineFolder& p,
                                                                   const PipelineOptions& o) {
  return std::make_shared<const Qwen21Spec>(p, o);
}

}  // namespace flowkv::families
