// FLUX.2 Klein from a prompt and reference pictures to a picture, as diffusers 0.42.1's
// Flux2KleinKVPipeline and Flux2KleinPipeline __call__ do it, stage by stage:
//   prompt      tokenizer (chat template, 512 tokens) -> Qwen3 hidden states 9, 18, 27
//   references  load, resize / crop, VAE encode (mode), patchify, BatchNorm-normalise, pack
//   denoise     torch-seeded noise, the one denoising loop (the reference rule the pipeline
//               class names; Klein KV's exact cache)
//   decode      unpack, de-normalise, unpatchify, VAE decode, to 8-bit pixels
// Each stage loads its component and releases it before the next one starts, so peak memory is
// the largest stage plus the request's caches.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <optional>

#include "core/arena.h"
#include "core/random.h"
#include "families/family.h"
#include "flowkv/error.h"
#include "flowkv/generate.h"
#include "flowkv/model.h"
#include "io/image.h"
#include "io/pipeline_folder.h"
#include "models/flux2/config.h"
#include "models/flux2_vae/model.h"
#include "models/qwen3/model.h"
#include "pipeline/denoise_stage.h"
#include "pipeline/identity.h"
#include "pipeline/reference_image.h"
#include "pipeline/request_store.h"
#include "pipeline/stages.h"
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
    FLOWKV_CHECK(path_exists(config_path(*d)), *d, ": missing (model_index.json names it, but ",
                 config_path(*d), " does not exist)");
  }
  FLOWKV_CHECK(path_exists(c.tokenizer + "/tokenizer.json"), c.tokenizer,
               "/tokenizer.json: missing (the Qwen3 tokenizer of the pipeline)");
  c.transformer_cfg = flux2::Config::from_json(read_json_file(config_path(c.transformer)),
                                               config_path(c.transformer));
  const qwen3::Config te = qwen3::Config::from_json(read_json_file(config_path(c.text_encoder)),
                                                    config_path(c.text_encoder));
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

std::string size_str(int64_t w, int64_t h) {
  return std::to_string(w) + "x" + std::to_string(h);
}

// The prompt stage: [1, 512, 3 * hidden] embeddings (from the reference store when it holds
// these token ids' embeddings by this text encoder).
Tensor encode_prompt(const Components& c, const GenerateRequest& req, pipeline::Stage& stage,
                     pipeline::RequestStore& rs, bool* truncated) {
  const text::Tokenizer tok = text::Tokenizer::from_json_file(c.tokenizer + "/tokenizer.json");
  const int64_t rows = text_tokens(c, req);
  const text::PromptTokens t = text::klein_prompt_tokens(tok, req.prompt, rows);
  *truncated = t.truncated;
  stage.advance(1, "tokenized");
  auto compute = [&]() -> std::vector<Tensor> {
    qwen3::LoadOptions lo;
    lo.last_hidden_state = qwen3::kKleinLayers[2];
    const qwen3::Encoder enc = qwen3::Encoder::load(c.text_encoder, lo);
    stage.advance(2, "text encoder loaded");
    Arena arena;
    const ExecContext ctx{&arena};
    return {qwen3::klein_prompt_embeds(ctx, enc, {.ids = t.ids, .mask = t.mask, .batch = 1})};
  };
  bool hit = false;
  Tensor embeds;
  if (rs.active()) {
    store::KeyBuilder key("prompt");
    pipeline::add_files_identity(key, "text encoder", c.text_encoder);
    key.text("rule", "flux2 klein hidden states 9 18 27");
    key.bytes("ids", t.ids.data(), t.ids.size() * sizeof(t.ids[0]));
    key.bytes("mask", t.mask.data(), t.mask.size() * sizeof(t.mask[0]));
    embeds = rs.get(key.finish(), compute, &hit).at(0);
  } else {
    embeds = compute().at(0);
  }
  int64_t n = 0;
  for (int32_t m : t.mask) n += m;
  stage.detail = std::to_string(n) + " of " + std::to_string(rows) + " tokens" +
                 (t.truncated ? " (truncated from " + std::to_string(t.untruncated_length) +
                                    ": the end of the prompt is lost, as diffusers cuts it)"
                              : "") +
                 (hit ? ", from the reference store" : "");
  stage.advance(3, hit ? "from the reference store" : "encoded");
  return embeds;
}

// The references stage: each image preprocessed as the pipeline does, VAE-encoded, packed.
// Each reference's latents come from the reference store when it holds this VAE's encoding of
// the same preprocessed pixels; the VAE is loaded only when one is missing.
std::vector<ReferenceLatents> encode_references(const Components& c, const GenerateRequest& req,
                                                pipeline::Stage& stage, pipeline::RequestStore& rs,
                                                int64_t* last_w, int64_t* last_h) {
  std::vector<Image> images;
  for (const std::string& path : req.references) {
    images.push_back(flux2_reference_image(load_image(path), path));
  }
  std::optional<flux2_vae::Vae> vae;
  const ExecContext ctx{};
  std::vector<ReferenceLatents> out;
  for (size_t i = 0; i < images.size(); ++i) {
    bool hit = false;
    const Tensor z = rs.image_latents(  // [1, 4L, h, w]
        c.vae, "flux2 reference: crop to 16, VAE mode", images[i],
        [&] {
          if (!vae) vae.emplace(flux2_vae::Vae::load(c.vae));
          return vae->encode(ctx, image_to_tensor(images[i]));
        },
        &hit);
    const int64_t h = z.dim(2), w = z.dim(3);
    out.push_back({flux2_vae::pack(z), h, w});
    stage.detail += (stage.detail.empty() ? "" : ", ") +
                    size_str(images[i].width, images[i].height) + " (" + std::to_string(h * w) +
                    " tokens" + (hit ? ", from the reference store" : "") + ")";
    stage.advance(static_cast<int64_t>(i + 1), req.references[i]);
    *last_w = images[i].width, *last_h = images[i].height;
  }
  return out;
}

// The generation parameters, as A1111-style tools write them into a PNG.
std::string parameters_text(const GenerateRequest& req, const PipelineFolder& p, int64_t w,
                            int64_t h, int steps) {
  std::string s = req.prompt + "\nSteps: " + std::to_string(steps) +
                  ", Sampler: Euler (flow matching), Seed: " + std::to_string(req.seed) +
                  ", Size: " + size_str(w, h) + ", Model: " + fs::path(p.path).filename().string() +
                  " (" + p.class_name + "), References: " + std::to_string(req.references.size()) +
                  ", KV cache: " + (req.kv_cache ? "on" : "off");
  for (const std::string& sc : req.step_caches) s += ", Step cache: " + sc;
  return s + ", Generator: flowkv";
}

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
  const int64_t gw = want_w / m, gh = want_h / m;
  FLOWKV_CHECK(gw >= 1 && gh >= 1, "the image size ", size_str(want_w, want_h),
               " is smaller than one latent token (", m, " pixels)");
  return {gw, gh};
}

// Packed latents [1, h*w, C] to 8-bit pixels. Untiled, as diffusers decodes by default;
// --vae-tiling bounds memory for large images.
Image decode_latents(const flux2_vae::Vae& vae, const Tensor& latents, int64_t gh, int64_t gw,
                     bool tiled) {
  const flux2_vae::DecodeOptions d{.tiled = tiled, .tile_latent = 64};
  return tensor_to_image(vae.decode(ExecContext{}, flux2_vae::unpack(latents, gh, gw), d));
}

void check_request(const PipelineFolder& p, const GenerateRequest& req) {
  FLOWKV_CHECK(!req.has_negative_prompt && req.cfg_scale <= 1.0f, p.path,
               ": FLUX.2 Klein runs without classifier-free guidance (the distilled pipelines "
               "have none): drop the negative prompt and the CFG scale");
  FLOWKV_CHECK(req.resolution == 0, p.path,
               ": the resolution option is Qwen-Image-2.1's; give FLUX.2 Klein the output size");
}

GenerateResult generate_klein(const PipelineFolder& p, const GenerateRequest& req,
                              const GenerateProgress& progress, const GenerateControl& control) {
  check_request(p, req);
  const Components c = check_components(p);
  GenerateResult res;
  pipeline::StageRunner stages(progress, control, res.stages);
  pipeline::RequestStore rs(control.store);
  const Tensor embeds = stages.run("prompt", 3, [&](pipeline::Stage& s) {
    return encode_prompt(c, req, s, rs, &res.prompt_truncated);
  });
  int64_t ref_w = 0, ref_h = 0;
  std::vector<ReferenceLatents> refs;
  if (!req.references.empty()) {
    refs = stages.run(
        "references", static_cast<int64_t>(req.references.size()),
        [&](pipeline::Stage& s) { return encode_references(c, req, s, rs, &ref_w, &ref_h); });
  }
  const std::pair<int64_t, int64_t> grid = target_grid(c, req, ref_w, ref_h);
  const int64_t gw = grid.first, gh = grid.second, m = c.vae_cfg.pixel_multiple();
  res.width = gw * m, res.height = gh * m;

  const int steps = req.steps > 0 ? req.steps : by_name("flux2").info.default_steps;
  int steps_run = 0;
  const Tensor latents = stages.run("denoise", steps, [&](pipeline::Stage& s) {
    const Model model = Model::load(c.transformer, req.dtype);
    TorchGenerator g(req.seed);
    const DType noise_dtype = model.compute_dtype() == "BF16" ? DType::kBF16 : DType::kF32;
    DenoiseInputs in;
    in.prompt.embeds = embeds;
    in.noise = flux2_vae::pack(
        randn_tensor(g, {1, c.transformer_cfg.in_channels, gh, gw}, noise_dtype).to_f32());
    in.height = gh, in.width = gw;
    in.references = refs;
    DenoiseOptions o;
    o.steps = steps;
    o.mode = req.kv_cache ? KVMode::kCached : KVMode::kRecompute;
    o.step_caches = req.step_caches;
    o.store = control.store;
    // Klein KV's references are computed at step 1 and read from the cache after it (or from
    // the reference store at every step).
    const bool refs_cached =
        req.kv_cache && !refs.empty() && p.class_name == "Flux2KleinKVPipeline";
    pipeline::DenoiseStage ds(s, control, refs.empty() ? "" : "references", refs_cached);
    std::optional<flux2_vae::Vae> preview_vae;
    ds.attach(o, [&](const Tensor& x0) {
      if (!preview_vae) preview_vae.emplace(flux2_vae::Vae::load(c.vae));
      return decode_latents(*preview_vae, x0, gh, gw, false);
    });
    const DenoiseResult r = denoise(model, in, o);
    rs.add(r);
    res.step_caches = r.step_caches;
    steps_run = static_cast<int>(r.step_seconds.size());
    s.detail = std::to_string(r.step_seconds.size()) + " steps, " +
               (r.store_hits > 0 ? "references' K/V from the reference store at every step (" +
                                       std::to_string(r.kv_bytes) + " bytes)"
                : r.kv_bytes > 0 ? "references' K/V computed at step 1 and reused after it (" +
                                       std::to_string(r.kv_bytes) + " bytes)"
                : refs.empty() ? "no references"
                               : "references recomputed every step");
    return r.latents;
  });
  res.parameters = parameters_text(req, p, res.width, res.height, steps_run);
  const Image image = stages.run("decode", 1, [&](pipeline::Stage& s) {
    const flux2_vae::Vae vae = flux2_vae::Vae::load(c.vae);
    Image im = decode_latents(vae, latents, gh, gw, req.vae_tiling);
    s.advance(1, "decoded");
    s.detail = size_str(res.width, res.height);
    return im;
  });
  res.channels = image.channels;
  res.pixels = image.pixels;
  rs.report(res);
  return res;
}

}  // namespace

GenerateLayout klein_generate_layout(const PipelineFolder& p, const GenerateRequest& req) {
  check_request(p, req);
  const Components c = check_components(p);
  GenerateLayout l;
  l.text_tokens = text_tokens(c, req);  // the prompt is padded to these rows, all of them read
  const int64_t m = c.vae_cfg.pixel_multiple();
  int64_t ref_w = 0, ref_h = 0;
  for (const std::string& path : req.references) {
    const Image img = flux2_reference_image(load_image(path), path);
    ref_w = img.width, ref_h = img.height;
    l.image_sizes.emplace_back(img.width, img.height);
    l.image_tokens.push_back((img.width / m) * (img.height / m));
  }
  const auto [gw, gh] = target_grid(c, req, ref_w, ref_h);
  l.width = gw * m, l.height = gh * m;
  l.target_tokens = gw * gh;
  l.transformer = c.transformer;
  return l;
}

void klein_check_pipeline(const PipelineFolder& p) {
  (void)check_components(p);
}

bool klein_runs_pipeline(const std::string& pipeline_class) {
  return pipeline_class == "Flux2KleinKVPipeline" || pipeline_class == "Flux2KleinPipeline";
}

GenerateResult flux2_generate(const PipelineFolder& p, const GenerateRequest& req,
                              const GenerateProgress& progress, const GenerateControl& control) {
  return generate_klein(p, req, progress, control);
}

}  // namespace flowkv::families
