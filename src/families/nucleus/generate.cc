// NucleusMoE-Image from a prompt to a picture, as diffusers 0.42.1's NucleusMoEImagePipeline
// does it, stage by stage:
//   prompt   the Qwen3-VL chat template with the pipeline's system prompt, the processor's
//            tokenizer padded to a multiple of 8 (cut to max_sequence_length, 1024), the
//            language model's hidden_states[-8]; the mask when some rows are padding; the
//            positive branch, and the negative one ("" unless given) under CFG (on by default,
//            guidance 4)
//   denoise  torch-seeded noise packed 2x2, the one denoising loop with the exact text K/V
//            cache (one per CFG branch), CFG rescaled to the positive branch's norm per token,
//            the prediction negated before the Euler step
//   decode   unpacked, de-normalised, the Qwen-Image VAE, RGB pixels
// This file is the family's spec of those stages; pipeline/generate.h runs them.
#include <cstdio>
#include <filesystem>
#include <memory>

#include "core/arena.h"
#include "families/family.h"
#include "flowkv/error.h"
#include "flowkv/generate.h"
#include "flowkv/limits.h"
#include "io/atomic_file.h"
#include "io/checkpoint.h"
#include "io/image.h"
#include "io/pipeline_folder.h"
#include "models/nucleus/config.h"
#include "models/nucleus/weights.h"
#include "models/qwen3_vl/nucleus_prompt.h"
#include "models/qwen3_vl/prompt_encoder.h"
#include "models/qwen_image_vae/image_processor.h"
#include "models/qwen_image_vae/model.h"
#include "models/qwen_image_vae/weights.h"
#include "pipeline/generate.h"
#include "pipeline/identity.h"

namespace flowkv::families {

namespace {

namespace fs = std::filesystem;

constexpr int64_t kDefaultSize = 1024;        // default_sample_size 128 x vae_scale_factor 8
constexpr int64_t kMultiple = 16;             // vae_scale_factor * 2: sizes are floored to it
constexpr int64_t kMaxSequenceLength = 1024;  // default_max_sequence_length
constexpr float kDefaultCfgScale = 4.0f;      // __call__'s guidance_scale

std::string config_path(const std::string& dir) {
  return (fs::path(dir) / "config.json").string();
}

struct Components {
  std::string transformer, text_encoder, processor, vae;
  nucleus::Config transformer_cfg;
  qwen_vae::Config vae_cfg;
};

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
  FLOWKV_CHECK(path_exists(c.processor + "/tokenizer.json"), c.processor,
               "/tokenizer.json: missing (the Qwen3-VL processor of the pipeline)");
  const CheckpointScan ts = scan_checkpoint(c.transformer);
  FLOWKV_CHECK(ts.config, c.transformer,
               ": no config.json (a NucleusMoE-Image transformer needs its config, or a GGUF "
               "written by flowkv quantize, which carries it)");
  c.transformer_cfg = nucleus::Config::from_json(*ts.config, ts.path);
  const qwen3_vl::EncoderShape te = qwen3_vl::encoder_shape(c.text_encoder, c.processor);
  c.vae_cfg = qwen_vae::Config::from_json(read_json_file(config_path(c.vae)), config_path(c.vae));
  const nucleus::Config& t = c.transformer_cfg;
  FLOWKV_CHECK(te.hidden_size == t.joint_attention_dim, p.path, ": the text encoder's hidden size ",
               te.hidden_size, " does not fit the transformer's joint_attention_dim ",
               t.joint_attention_dim, " (mismatched components)");
  FLOWKV_CHECK(t.patch_size == 2 && c.vae_cfg.z_dim * 4 == t.in_channels, p.path, ": the VAE's ",
               c.vae_cfg.z_dim, " latent channels packed 2x2 do not fit the transformer's ",
               "in_channels ", t.in_channels, " (patch_size ", t.patch_size,
               "; mismatched components)");
  FLOWKV_CHECK(t.out_channels * 4 == t.in_channels, p.path, ": the transformer's out_channels ",
               t.out_channels, " packed 2x2 are not its in_channels ", t.in_channels);
  FLOWKV_CHECK(c.vae_cfg.scale_factor() == kMultiple / 2, p.path, ": the VAE scales by ",
               c.vae_cfg.scale_factor(), "; NucleusMoE-Image's pipeline assumes 8");
  return c;
}

using pipeline::size_str;

class NucleusSpec final : public pipeline::GenerateSpec {
 public:
  NucleusSpec(const PipelineFolder& p, const PipelineOptions& o)
      : p_(p), c_(check_components(p)), dtype_(o.dtype) {}

  std::string images_stage() const override { return "references"; }
  std::string cached_name() const override { return "text"; }
  std::string kv_name() const override { return "text K/V"; }
  PixelFormat pixel_format() const override { return PixelFormat::kRGB; }
  int default_steps() const override { return nucleus_pipeline_default_steps(p_.class_name); }
  float default_cfg_scale() const override { return kDefaultCfgScale; }

  void plan(pipeline::Plan& p, std::vector<Image> decoded) const override {
    const GenerateRequest& req = p.request;
    FLOWKV_CHECK(decoded.empty(), p_.path,
                 ": NucleusMoEImagePipeline generates from a prompt alone (got ", decoded.size(),
                 " pictures)");
    const int64_t m = max_length(req);
    FLOWKV_CHECK(m > 0 && m <= kMaxSequenceLength, "max_sequence_length ", m, " is outside 1..",
                 kMaxSequenceLength);
    // __call__: CFG when guidance_scale > 1, with "" when no negative prompt is given.
    p.cfg = req.cfg_scale > 1.0f;
    GenerateLayout& l = p.layout;
    l.cfg = p.cfg;
    l.text_tokens = qwen3_vl::nucleus_prompt_rows(c_.processor, req.prompt, m);
    if (p.cfg) {
      l.negative_text_tokens = qwen3_vl::nucleus_prompt_rows(c_.processor, negative(req), m);
    }
    const int64_t want_w = req.width > 0 ? req.width : kDefaultSize;
    const int64_t want_h = req.height > 0 ? req.height : kDefaultSize;
    p.grid_w = want_w / kMultiple, p.grid_h = want_h / kMultiple;  // latent tokens (2x2 packed)
    FLOWKV_CHECK(p.grid_w >= 1 && p.grid_h >= 1, "the image size ", size_str(want_w, want_h),
                 " is smaller than ", kMultiple, " pixels a side (one latent token)");
    l.width = p.grid_w * kMultiple, l.height = p.grid_h * kMultiple;
    l.target_tokens = p.grid_w * p.grid_h;
    l.transformer = c_.transformer;
    pipeline::check_schedule(
        p, scheduler_, sched::FlowMatchConfig{},
        [&](const sched::FlowMatchConfig& cfg) { return sched::linear_mu(l.target_tokens, cfg); });
  }

  std::string text_encoder_path() const override { return c_.text_encoder; }
  std::string vae_path() const override { return c_.vae; }

  pipeline::PromptJob prompt(pipeline::Components& comps, const pipeline::Plan& p,
                             const std::string& text) const override {
    const int64_t max_len = max_length(p.request);
    pipeline::PromptJob job;
    const std::string processor = c_.processor;
    job.describe = [text, processor, max_len](store::KeyBuilder& key) {
      pipeline::add_files_identity(key, "processor", processor);
      key.text("rule", "nucleusmoe-image qwen3-vl prompt hidden_states[-8]");
      key.text("text", text).integer("max length", max_len);
    };
    job.encode = [this, &comps, text, max_len](std::string* note) {
      const auto enc = comps.get<qwen3_vl::NucleusPromptEncoder>("text_encoder", [&] {
        return qwen3_vl::NucleusPromptEncoder::load(c_.text_encoder, c_.processor);
      });
      Arena arena;
      const ExecContext ctx{&arena};
      const qwen3_vl::NucleusPromptEncoding e = enc->encode(ctx, text, max_len);
      *note = std::to_string(e.embeds.dim(1)) + " tokens";
      PromptEmbeds out{.embeds = e.embeds, .slots = {}, .mask = {}};
      if (!e.mask.empty()) {
        int64_t valid = 0;
        Tensor mask = Tensor::empty({1, static_cast<int64_t>(e.mask.size())});
        for (size_t i = 0; i < e.mask.size(); ++i) {
          mask.f32()[i] = e.mask[i] ? 1.0f : 0.0f;
          valid += e.mask[i] ? 1 : 0;
        }
        out.mask = mask;
        *note += " (" + std::to_string(valid) + " valid, padded to a multiple of 8)";
      }
      if (e.truncated) *note += ", cut to " + std::to_string(max_len);
      return out;
    };
    return job;
  }

  std::string image_rule() const override { return "nucleusmoe-image: no pictures"; }
  Tensor encode_image(pipeline::Components&, const Image&) const override {
    fail(p_.path, ": NucleusMoEImagePipeline takes no pictures");
  }
  ReferenceLatents pack_image(const Tensor&) const override {
    fail(p_.path, ": NucleusMoEImagePipeline takes no pictures");
  }
  bool exact_cache(const pipeline::Plan& p) const override { return p.request.kv_cache; }

  // randn of [1, 1, C, 2h, 2w] in the prompt's type, packed 2x2 (_pack_latents).
  Tensor noise(pipeline::Components& comps, const pipeline::Plan& p) const override {
    return qwen_vae::pack(torch_noise(*transformer(comps), p.request.seed,
                                      c_.transformer_cfg.in_channels / 4, 2 * p.grid_h,
                                      2 * p.grid_w));
  }
  DenoiseResult denoise(pipeline::Components& comps, const DenoiseInputs& in,
                        const DenoiseOptions& o) const override {
    return run_family_denoise(*transformer(comps), in, o, scheduler_);
  }
  Image decode(pipeline::Components& comps, const pipeline::Plan& p, const Tensor& latents,
               bool tiled) const override {
    const qwen_vae::DecodeOptions d{.tiled = tiled};
    const Tensor z = qwen_vae::unpack(latents, 2 * p.grid_h, 2 * p.grid_w);
    return qwen_vae::postprocess(vae(comps)->decode(ExecContext{}, z, d)).at(0);
  }

  std::string parameters_after_sampler(const pipeline::Plan& p) const override {
    return pipeline::cfg_parameters(p);
  }
  std::string parameters_after_model(const pipeline::Plan&) const override { return ""; }

 private:
  static std::string negative(const GenerateRequest& r) {
    return r.has_negative_prompt ? r.negative_prompt : std::string();
  }
  static int64_t max_length(const GenerateRequest& r) {
    return r.max_sequence_length > 0 ? r.max_sequence_length : kMaxSequenceLength;
  }
  std::shared_ptr<const qwen_vae::Vae> vae(pipeline::Components& comps) const {
    return comps.get<qwen_vae::Vae>("vae", [&] { return qwen_vae::Vae::load(c_.vae); });
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

// FlowMatchEulerDiscreteScheduler with a static shift of 1 (use_dynamic_shifting false).
Json nucleus_scheduler_json() {
  return {{"_class_name", "FlowMatchEulerDiscreteScheduler"},
          {"num_train_timesteps", 1000},
          {"shift", 1.0},
          {"use_dynamic_shifting", false}};
}

}  // namespace

void nucleus_write_zero_pipeline(const nucleus::Config& transformer, DType dtype,
                                 const std::string& dir) {
  const fs::path d(dir);
  write_zero_folder((d / "transformer").string(), transformer.to_json(),
                    nucleus::weight_table(transformer), dtype);
  write_zero_qwen3_vl_8b((d / "text_encoder").string(), (d / "processor").string(), dtype);
  const qwen_vae::Config vae;  // the class defaults are the released VAE
  write_zero_folder((d / "vae").string(), vae.to_json(), qwen_vae::weight_table(vae), dtype);
  fs::create_directories(d / "scheduler");
  write_file_atomic((d / "scheduler/scheduler_config.json").string(),
                    nucleus_scheduler_json().dump(2));
  const Json index = {{"_class_name", "NucleusMoEImagePipeline"},
                      {"processor", {"transformers", "Qwen3VLProcessor"}},
                      {"scheduler", {"diffusers", "FlowMatchEulerDiscreteScheduler"}},
                      {"text_encoder", {"transformers", "Qwen3VLForConditionalGeneration"}},
                      {"transformer", {"diffusers", "NucleusMoEImageTransformer2DModel"}},
                      {"vae", {"diffusers", "AutoencoderKLQwenImage"}}};
  write_file_atomic((d / "model_index.json").string(), index.dump(2));
}

std::shared_ptr<const pipeline::GenerateSpec> nucleus_open_pipeline(const PipelineFolder& p,
                                                                    const PipelineOptions& o) {
  return std::make_shared<const NucleusSpec>(p, o);
}

}  // namespace flowkv::families
