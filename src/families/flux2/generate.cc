// FLUX.2 Klein from a prompt and reference pictures to a picture, as diffusers 0.42.1's
// Flux2KleinKVPipeline and Flux2KleinPipeline __call__ do it, stage by stage:
//   prompt      tokenizer (chat template, 512 tokens) -> Qwen3 hidden states 9, 18, 27
//   references  load, resize / crop, VAE encode (mode), patchify, BatchNorm-normalise, pack
//   denoise     torch-seeded noise, the one denoising loop (the reference rule the pipeline
//               class names; Klein KV's exact cache)
//   decode      unpack, de-normalise, unpatchify, VAE decode, to 8-bit pixels
// This file is the family's spec of those stages; pipeline/generate.h runs them (and keeps the
// components resident or loads them per stage, as the opened Pipeline's policy says).
#include <algorithm>
#include <filesystem>
#include <limits>
#include <memory>

#include "core/arena.h"
#include "families/adapters.h"
#include "families/family.h"
#include "flowkv/error.h"
#include "flowkv/generate.h"
#include "flowkv/model.h"
#include "io/checkpoint.h"
#include "io/image.h"
#include "io/pipeline_folder.h"
#include "models/flux2/config.h"
#include "models/flux2_vae/model.h"
#include "models/qwen3/model.h"
#include "pipeline/generate.h"
#include "pipeline/reference_image.h"
#include "text/tokenizer.h"

namespace flowkv::families {

namespace {

namespace fs = std::filesystem;

constexpr int64_t kMaxTextTokens = 512;      // Flux2KleinPipeline's max_sequence_length default
constexpr int64_t kDefaultSampleSize = 128;  // x vae_scale_factor: 1024 pixels

struct Components {
  std::string transformer, text_encoder, tokenizer, vae;
  flux2::Config transformer_cfg;
  flux2_vae::Config vae_cfg;
  int64_t text_tokens = kMaxTextTokens;  // the default prompt rows (text_tokens())
};

std::string config_path(const std::string& dir) {
  return (fs::path(dir) / "config.json").string();
}

// Before any weight is read: every component is there and they fit together.
Components check_components(const PipelineFolder& p) {
  // Flux2KleinPipeline runs classifier-free guidance unless the checkpoint is step-distilled
  // (is_distilled, default false): flowkv runs FLUX.2 without an unconditional branch.
  FLOWKV_CHECK(p.class_name != "Flux2KleinPipeline" ||
                   json_bool(p.index, "is_distilled", false, p.path + "/model_index.json"),
               p.path,
               ": a Klein base pipeline (is_distilled false) needs classifier-free "
               "guidance, which flowkv does not run for FLUX.2; the distilled Klein 4B / 9B and "
               "Klein 9B KV pipelines run");
  Components c;
  c.transformer = p.component("transformer").path;
  c.text_encoder = p.component("text_encoder").path;
  c.tokenizer = p.component("tokenizer").path;
  c.vae = p.component("vae").path;
  for (const std::string* d : {&c.transformer, &c.text_encoder, &c.vae}) {
    FLOWKV_CHECK(path_exists(*d), *d, ": missing (model_index.json names it)");
  }
  FLOWKV_CHECK(path_exists(c.tokenizer + "/tokenizer.json"), c.tokenizer,
               "/tokenizer.json: missing (the Qwen3 tokenizer of the pipeline)");
  // The transformer and text encoder may be GGUF files (in their folder, or given in place of
  // it): their configs come from the files' metadata then.
  c.transformer_cfg = flux2_checkpoint_config(c.transformer);
  const CheckpointScan te_scan = scan_checkpoint(c.text_encoder);
  FLOWKV_CHECK(te_scan.config, te_scan.path,
               ": the text encoder's config is missing (no config.json, and a GGUF file carries "
               "it only when flowkv quantize wrote it)");
  const qwen3::Config te = qwen3::Config::from_json(*te_scan.config, te_scan.path);
  FLOWKV_CHECK(path_exists(config_path(c.vae)), c.vae, ": missing (model_index.json names it, but ",
               config_path(c.vae), " does not exist)");
  c.vae_cfg = flux2_vae::Config::from_json(read_json_file(config_path(c.vae)), config_path(c.vae));
  const int64_t stacked = 3 * te.hidden_size;  // hidden states 9, 18, 27 side by side
  FLOWKV_CHECK(stacked == c.transformer_cfg.joint_attention_dim, p.path,
               ": the text encoder's hidden size ", te.hidden_size, " x 3 = ", stacked,
               " does not fit the transformer's joint_attention_dim ",
               c.transformer_cfg.joint_attention_dim, " (mismatched components)");
  FLOWKV_CHECK(4 * c.vae_cfg.latent_channels == c.transformer_cfg.in_channels, p.path,
               ": the VAE's ", c.vae_cfg.latent_channels, " latent channels patchified 2x2 (",
               4 * c.vae_cfg.latent_channels, ") do not fit the transformer's in_channels ",
               c.transformer_cfg.in_channels, " (mismatched components)");
  FLOWKV_CHECK(te.num_hidden_layers >= 27, c.text_encoder, ": ", te.num_hidden_layers,
               " layers; Klein reads hidden state 27");
  // A tokenizer made for shorter prompts says so in its model_max_length.
  const std::string tok_cfg = c.tokenizer + "/tokenizer_config.json";
  if (path_exists(tok_cfg)) {
    const int64_t n = json_int(read_json_file(tok_cfg), "model_max_length", kMaxTextTokens, 1,
                               std::numeric_limits<int64_t>::max(), tok_cfg);
    c.text_tokens = std::min(n, kMaxTextTokens);
  }
  return c;
}

// The prompt's rows: the request's max_sequence_length, else the pipeline's default.
int64_t text_tokens(const Components& c, const GenerateRequest& req) {
  return req.max_sequence_length > 0 ? req.max_sequence_length : c.text_tokens;
}

using pipeline::size_str;

// The target's latent grid: the asked size, else the last reference's, else the default; floored
// to the latent grid.
std::pair<int64_t, int64_t> target_grid(const Components& c, const GenerateRequest& req,
                                        int64_t ref_w, int64_t ref_h) {
  const int64_t m = c.vae_cfg.pixel_multiple();
  const int64_t want_w = req.width ? req.width
                         : ref_w   ? ref_w
                                   : kDefaultSampleSize * c.vae_cfg.scale_factor();
  const int64_t want_h = req.height ? req.height
                         : ref_h    ? ref_h
                                    : kDefaultSampleSize * c.vae_cfg.scale_factor();
  FLOWKV_CHECK(want_w > 0 && want_h > 0, "the image size ", size_str(want_w, want_h),
               " is not a size");
  const int64_t gw = want_w / m, gh = want_h / m;
  FLOWKV_CHECK(gw >= 1 && gh >= 1, "the image size ", size_str(want_w, want_h),
               " is smaller than one latent token (", m, " pixels)");
  return {gw, gh};
}

void check_request(const PipelineFolder& p, const GenerateRequest& req) {
  FLOWKV_CHECK(!req.has_negative_prompt && req.cfg_scale <= 1.0f, p.path,
               ": FLUX.2 Klein runs without classifier-free guidance (the distilled pipelines "
               "have none): drop the negative prompt and the CFG scale");
  FLOWKV_CHECK(req.resolution == 0, p.path,
               ": the resolution option is Qwen-Image-2.1's; give FLUX.2 Klein the output size");
  FLOWKV_CHECK(req.max_sequence_length >= 0, "max_sequence_length: ", req.max_sequence_length,
               " is not a token count");
}

// Packed latents [1, h*w, C] to 8-bit pixels. Untiled, as diffusers decodes by default;
// --vae-tiling bounds memory for large images.
Image decode_latents(const flux2_vae::Vae& vae, const Tensor& latents, int64_t gh, int64_t gw,
                     bool tiled) {
  const flux2_vae::DecodeOptions d{.tiled = tiled, .tile_latent = 64};
  return tensor_to_image(vae.decode(ExecContext{}, flux2_vae::unpack(latents, gh, gw), d));
}

// FLUX.2 Klein's stages for the one orchestration (pipeline/generate.h).
class KleinSpec final : public pipeline::GenerateSpec {
 public:
  KleinSpec(const PipelineFolder& p, const PipelineOptions& o)
      : p_(p),
        c_(check_components(p)),
        dtype_(o.dtype),
        tokenizer_(text::Tokenizer::from_json_file(c_.tokenizer + "/tokenizer.json")) {}

  std::string images_stage() const override { return "references"; }
  std::string cached_name() const override { return "references"; }
  std::string kv_name() const override { return "references' K/V"; }
  PixelFormat pixel_format() const override { return PixelFormat::kRGB; }
  int default_steps() const override { return flux2_pipeline_default_steps(p_.class_name); }

  void plan(pipeline::Plan& p, std::vector<Image> decoded) const override {
    const GenerateRequest& req = p.request;
    check_request(p_, req);
    int64_t ref_w = 0, ref_h = 0;
    GenerateLayout& l = p.layout;
    l.text_tokens = text_tokens(c_, req);  // the prompt is padded to these rows, all read
    const int64_t m = c_.vae_cfg.pixel_multiple();
    for (size_t i = 0; i < decoded.size(); ++i) {
      Image img = flux2_reference_image(decoded[i], p.names[i]);
      ref_w = img.width, ref_h = img.height;
      l.image_sizes.emplace_back(img.width, img.height);
      l.image_tokens.push_back((img.width / m) * (img.height / m));
      p.images.push_back(std::move(img));
    }
    const auto [gw, gh] = target_grid(c_, req, ref_w, ref_h);
    p.grid_w = gw, p.grid_h = gh;
    l.width = gw * m, l.height = gh * m;
    l.target_tokens = gw * gh;
    l.transformer = c_.transformer;
    pipeline::check_schedule(p, scheduler_, sched::flux2_scheduler_config(),
                             [&](const sched::FlowMatchConfig&) {
                               return sched::empirical_mu(l.target_tokens, p.steps);
                             });
  }

  std::string text_encoder_path() const override { return c_.text_encoder; }
  std::string vae_path() const override { return c_.vae; }

  pipeline::PromptJob prompt(pipeline::Components& comps, const pipeline::Plan& p,
                             const std::string& text) const override {
    const int64_t rows = text_tokens(c_, p.request);
    auto t =
        std::make_shared<text::PromptTokens>(text::klein_prompt_tokens(tokenizer_, text, rows));
    // An explicit f32 or bf16 request computes the text encoder that way too (auto follows its
    // weights: bf16 weights compute in bf16, as transformers runs them).
    const std::string lo_dtype = encoder_dtype();
    pipeline::PromptJob job;
    job.truncated = t->truncated;
    int64_t n = 0;
    for (int32_t v : t->mask) n += v;
    job.note = std::to_string(n) + " of " + std::to_string(rows) + " tokens" +
               (t->truncated ? " (truncated from " + std::to_string(t->untruncated_length) +
                                   ": the end of the prompt is lost, as diffusers cuts it)"
                             : "");
    job.describe = [t, lo_dtype](store::KeyBuilder& key) {
      key.text("rule", "flux2 klein hidden states 9 18 27");
      key.text("compute", lo_dtype);
      key.bytes("ids", t->ids.data(), t->ids.size() * sizeof(t->ids[0]));
      key.bytes("mask", t->mask.data(), t->mask.size() * sizeof(t->mask[0]));
    };
    job.encode = [this, &comps, t](std::string*) {
      const auto enc = text_encoder(comps);
      Arena arena;
      const ExecContext ctx{&arena};
      return PromptEmbeds{.embeds = qwen3::klein_prompt_embeds(
                              ctx, *enc, {.ids = t->ids, .mask = t->mask, .batch = 1}),
                          .slots = {},
                          .mask = {}};
    };
    return job;
  }

  std::string image_rule() const override { return "flux2 reference: crop to 16, VAE mode"; }
  Tensor encode_image(pipeline::Components& comps, const Image& image) const override {
    return vae(comps)->encode(ExecContext{}, image_to_tensor(image));  // [1, 4L, h, w]
  }
  ReferenceLatents pack_image(const Tensor& z) const override {
    return {flux2_vae::pack(z), z.dim(2), z.dim(3)};
  }

  // Klein KV's references are computed at step 1 and read from the cache after it (or from
  // the reference store at every step).
  bool exact_cache(const pipeline::Plan& p) const override {
    return p.request.kv_cache && !p.images.empty() && klein_kv_rules();
  }

  Tensor noise(pipeline::Components& comps, const pipeline::Plan& p) const override {
    return flux2_vae::pack(torch_noise(*transformer(comps), p.request.seed,
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
  std::string parameters_after_model(const pipeline::Plan& p) const override {
    return ", References: " + std::to_string(p.images.size());
  }

 private:
  bool klein_kv_rules() const {
    return flux2_pipeline_rule(p_.class_name, p_.path) == Flux2References::kKleinKV;
  }
  std::string encoder_dtype() const {
    return dtype_ == "f32" || dtype_ == "bf16" ? dtype_ : "auto";
  }
  std::shared_ptr<const qwen3::Encoder> text_encoder(pipeline::Components& comps) const {
    return comps.get<qwen3::Encoder>("text_encoder", [&] {
      qwen3::LoadOptions lo;
      lo.last_hidden_state = qwen3::kKleinLayers[2];
      const std::string d = encoder_dtype();
      if (d != "auto") {
        lo.auto_dtype = false;
        lo.compute = d == "f32" ? DType::kF32 : DType::kBF16;
      }
      return qwen3::Encoder::load(c_.text_encoder, lo);
    });
  }
  std::shared_ptr<const flux2_vae::Vae> vae(pipeline::Components& comps) const {
    return comps.get<flux2_vae::Vae>("vae", [&] { return flux2_vae::Vae::load(c_.vae); });
  }
  std::shared_ptr<const LoadedTransformer> transformer(pipeline::Components& comps) const {
    return comps.get<LoadedTransformer>("transformer", [&] {
      return load_flux2_transformer(c_.transformer, dtype_, klein_kv_rules());
    });
  }

  const PipelineFolder p_;
  const Components c_;
  const std::string dtype_;
  const std::optional<sched::FlowMatchConfig> scheduler_ = pipeline::pipeline_scheduler(p_);
  const text::Tokenizer tokenizer_;
};

}  // namespace

std::shared_ptr<const pipeline::GenerateSpec> klein_open_pipeline(const PipelineFolder& p,
                                                                  const PipelineOptions& o) {
  return std::make_shared<const KleinSpec>(p, o);
}

}  // namespace flowkv::families
