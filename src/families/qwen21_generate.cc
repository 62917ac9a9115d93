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
// Each stage loads its component and releases it before the next one starts.
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <optional>

#include "core/arena.h"
#include "core/random.h"
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
#include "pipeline/denoise_stage.h"
#include "pipeline/identity.h"
#include "pipeline/request_store.h"
#include "pipeline/stages.h"

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
  for (const std::string* d : {&c.transformer, &c.text_encoder, &c.vae}) {
    FLOWKV_CHECK(path_exists(config_path(*d)), *d, ": missing (model_index.json names it, but ",
                 config_path(*d), " does not exist)");
  }
  for (const char* f : {"/tokenizer.json", "/preprocessor_config.json"}) {
    FLOWKV_CHECK(path_exists(c.processor + f), c.processor, f,
                 ": missing (the Qwen3-VL processor of the pipeline)");
  }
  c.transformer_cfg = qwen::Config21::from_json(read_json_file(config_path(c.transformer)),
                                                config_path(c.transformer));
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

std::string size_str(int64_t w, int64_t h) {
  return std::to_string(w) + "x" + std::to_string(h);
}

// What encode_prompt returns for one branch, as the transformer reads it.
PromptEmbeds encode_branch(const qwen3_vl::PromptEncoder& enc, const std::string& text,
                           const std::vector<Image>& images, std::string* note) {
  Arena arena;
  const ExecContext ctx{&arena};
  const qwen3_vl::PromptEncoding e = enc.encode(ctx, text, images);
  *note = std::to_string(e.embeds.dim(1)) + " tokens (" + std::to_string(e.text_tokens) +
          " text, " + std::to_string(e.embeds.dim(1) - e.text_tokens) + " image slots)";
  return PromptEmbeds{.embeds = e.embeds, .slots = e.slots, .mask = {}};
}

// Packed latents [1, h*w, C] to an RGBA picture.
Image decode_latents(const qwen21_vae::Vae& vae, const Tensor& latents, int64_t gh, int64_t gw,
                     bool tiled) {
  const qwen21_vae::DecodeOptions d{.tiled = tiled};
  return qwen21_vae::postprocess(vae.decode(ExecContext{}, qwen21_vae::unpack(latents, gh, gw), d))
      .at(0);
}

// A prompt's image-slot mask as a tensor the reference store keeps (F32 0/1), and back.
Tensor slots_tensor(const std::vector<uint8_t>& slots) {
  Tensor t = Tensor::empty({static_cast<int64_t>(slots.size())});
  for (size_t i = 0; i < slots.size(); ++i) t.f32()[i] = slots[i] ? 1.0f : 0.0f;
  return t;
}
std::vector<uint8_t> slots_of(const Tensor& t) {
  FLOWKV_CHECK(t.dtype() == DType::kF32 && t.ndim() == 1, "reference store: bad slot mask");
  std::vector<uint8_t> s(static_cast<size_t>(t.numel()));
  for (size_t i = 0; i < s.size(); ++i) s[i] = t.f32()[i] != 0.0f;
  return s;
}

// The generation parameters, as A1111-style tools write them into a PNG.
std::string parameters_text(const GenerateRequest& req, const PipelineFolder& p, int64_t w,
                            int64_t h, int steps, bool cfg, int64_t resolution) {
  std::string s = req.prompt;
  if (cfg) s += "\nNegative prompt: " + req.negative_prompt;
  char scale[32];
  std::snprintf(scale, sizeof scale, "%g", static_cast<double>(req.cfg_scale));
  s += "\nSteps: " + std::to_string(steps) + ", Sampler: Euler (flow matching), CFG scale: " +
       (cfg ? std::string(scale) : std::string("off")) + ", Seed: " + std::to_string(req.seed) +
       ", Size: " + size_str(w, h) + ", Model: " + fs::path(p.path).filename().string() + " (" +
       p.class_name + "), Condition images: " + std::to_string(req.references.size()) +
       (req.references.empty() ? "" : ", Resolution: " + std::to_string(resolution)) +
       ", KV cache: " + (req.kv_cache ? "on" : "off");
  for (const std::string& sc : req.step_caches) s += ", Step cache: " + sc;
  return s + ", Generator: flowkv";
}

// The prompt is padded to the longest branch, not to a fixed length.
void check_text_length(const PipelineFolder& p, const GenerateRequest& req) {
  FLOWKV_CHECK(req.max_sequence_length == 0, p.path,
               ": max_sequence_length is FLUX.2 Klein's padded prompt length; Qwen-Image-2.1 "
               "pads its prompts to the longest branch");
}

GenerateResult generate_qwen21(const PipelineFolder& p, const GenerateRequest& req,
                               const GenerateProgress& progress, const GenerateControl& control) {
  check_text_length(p, req);
  const Components c = check_components(p);
  const int64_t resolution = req.resolution > 0 ? req.resolution : kDefaultResolution;
  // diffusers ignores num_inference_steps when the pipeline sets sample_sigmas; a step count
  // that disagrees is refused here, before any work, rather than dropped silently.
  FLOWKV_CHECK(c.sample_sigmas.empty() || req.steps == 0 ||
                   req.steps == static_cast<int>(c.sample_sigmas.size()),
               p.path, "/model_index.json sets ", c.sample_sigmas.size(),
               " sample_sigmas, which fix the step count; --steps ", req.steps,
               " differs (leave it out)");
  // diffusers: guidance runs when true_cfg_scale > 1 and a negative prompt is given.
  const bool cfg = req.cfg_scale > 1.0f && req.has_negative_prompt;

  FLOWKV_CHECK(static_cast<int64_t>(req.references.size()) <= limits::kMaxReferences,
               req.references.size(), " condition images; at most ", limits::kMaxReferences,
               " are taken");
  // Step 1 of __call__: the condition images at their pipeline size (RGBA), read before any
  // weight so a bad file fails first.
  std::vector<Image> conds;
  for (const std::string& path : req.references) {
    conds.push_back(qwen21_condition_image(load_image(path, PixelFormat::kRGBA), resolution,
                                           "condition image " + path));
  }
  if (!conds.empty()) {
    // Each image's prompt slots must cover its latents 2x2: checked from the processor config
    // before any weight is read (a min_pixels above the image's size would resize it again).
    std::vector<std::pair<int64_t, int64_t>> sizes;
    for (const Image& im : conds) sizes.emplace_back(im.width, im.height);
    const qwen3_vl::PromptCounts pc =
        qwen3_vl::prompt_counts(c.text_encoder, c.processor, req.prompt, sizes);
    for (size_t i = 0; i < conds.size(); ++i) {
      const int64_t tokens = (conds[i].width / 16) * (conds[i].height / 16);
      FLOWKV_CHECK(pc.image_slots[i] * kSlotTokens == tokens, "condition image ", req.references[i],
                   ": at ", size_str(conds[i].width, conds[i].height), " the processor makes ",
                   pc.image_slots[i], " prompt slots for ", tokens,
                   " latent tokens (4 each expected): its min_pixels / max_pixels "
                   "(preprocessor_config.json) resize the image again; raise --resolution");
    }
  }
  int64_t want_w = req.width, want_h = req.height;
  if (!conds.empty()) {  // the last image's calculate_dimensions, unless given
    if (want_w == 0) want_w = conds.back().width;
    if (want_h == 0) want_h = conds.back().height;
  }
  if (want_w == 0) want_w = resolution;
  if (want_h == 0) want_h = resolution;
  const int64_t gw = want_w / kMultiple * 2, gh = want_h / kMultiple * 2;  // latent tokens
  FLOWKV_CHECK(gw >= 2 && gh >= 2, "the image size ", size_str(want_w, want_h), " is smaller than ",
               kMultiple, " pixels a side");

  GenerateResult res;
  res.width = gw * (kMultiple / 2), res.height = gh * (kMultiple / 2);
  pipeline::StageRunner stages(progress, control, res.stages);

  std::vector<Image> vl_images;  // what the prompt encoder sees: alpha over white
  for (const Image& im : conds) vl_images.push_back(over_white(im));
  PromptEmbeds positive, negative;
  pipeline::RequestStore rs(control.store);
  stages.run("prompt", cfg ? 3 : 2, [&](pipeline::Stage& s) {
    // The encoder is loaded only when a branch is not in the reference store.
    std::optional<qwen3_vl::PromptEncoder> enc;
    auto branch = [&](const std::string& text, const char* name) {
      std::string note;
      auto compute = [&]() -> std::vector<Tensor> {
        if (!enc) {
          enc.emplace(qwen3_vl::PromptEncoder::load(c.text_encoder, c.processor));
          s.advance(1, "text encoder loaded");
        }
        const PromptEmbeds e = encode_branch(*enc, text, vl_images, &note);
        return {e.embeds, slots_tensor(e.slots)};
      };
      bool hit = false;
      std::vector<Tensor> t;
      if (rs.active()) {
        store::KeyBuilder key("prompt");
        pipeline::add_files_identity(key, "text encoder", c.text_encoder);
        pipeline::add_files_identity(key, "processor", c.processor);
        key.text("rule", "qwen-image-2.1 qwen3-vl prompt").text("text", text);
        key.integer("images", static_cast<int64_t>(vl_images.size()));
        for (const Image& im : vl_images) {
          key.integer("width", im.width).integer("height", im.height);
          key.integer("channels", im.channels);
          key.bytes("pixels", im.pixels.data(), im.pixels.size());
        }
        t = rs.get(key.finish(), compute, &hit);
      } else {
        t = compute();
      }
      FLOWKV_CHECK(t.size() == 2, "reference store: a prompt entry holds 2 tensors");
      if (hit) note = std::to_string(t[0].dim(1)) + " rows, from the reference store";
      s.detail += (s.detail.empty() ? "" : "; ") + std::string(name) + ": " + note;
      return PromptEmbeds{.embeds = t[0], .slots = slots_of(t[1]), .mask = {}};
    };
    positive = branch(req.prompt, "prompt");
    s.advance(2, "prompt encoded");
    if (cfg) {
      negative = branch(req.negative_prompt, "negative");
      s.advance(3, "negative prompt encoded");
    }
    return 0;
  });

  std::vector<ReferenceLatents> latents_in;
  if (!conds.empty()) {
    latents_in =
        stages.run("conditions", static_cast<int64_t>(conds.size()), [&](pipeline::Stage& s) {
          // The VAE is loaded only when an image's latents are not in the reference store.
          std::optional<qwen21_vae::Vae> vae;
          std::vector<ReferenceLatents> out;
          for (size_t i = 0; i < conds.size(); ++i) {
            bool hit = false;
            const Tensor z = rs.image_latents(
                c.vae, "qwen-image-2.1 condition: RGBA, VAE mode", conds[i],
                [&] {
                  if (!vae) vae.emplace(qwen21_vae::Vae::load(c.vae));
                  return vae->encode(ExecContext{}, qwen21_vae::preprocess(conds[i]));
                },
                &hit);
            const int64_t h = z.dim(2), w = z.dim(3);
            out.push_back({qwen21_vae::pack(z), h, w});
            s.detail += (s.detail.empty() ? "" : ", ") + size_str(conds[i].width, conds[i].height) +
                        " (" + std::to_string(h * w) + " tokens" +
                        (hit ? ", from the reference store" : "") + ")";
            s.advance(static_cast<int64_t>(i + 1), req.references[i]);
          }
          return out;
        });
  }
  // Each image's slots in the prompt must cover its latents 2x2 (the processor keeps the
  // pipeline's multiple-of-32 sizes; a processor config that resizes them again would not).
  for (const PromptEmbeds* b : {&positive, &negative}) {
    if (!b->embeds.defined()) continue;
    int64_t slots = 0, tokens = 0;
    for (uint8_t v : b->slots) slots += v;
    for (const ReferenceLatents& r : latents_in) tokens += r.height * r.width;
    FLOWKV_CHECK(slots * kSlotTokens == tokens, p.path, ": the prompt encoder gave ", slots,
                 " image slots for ", tokens,
                 " condition latent tokens (4 each expected): the processor resized the "
                 "condition images (check min_pixels / max_pixels in preprocessor_config.json)");
  }

  const int steps_default = c.sample_sigmas.empty()
                                ? (req.steps > 0 ? req.steps : by_name("qwen21").info.default_steps)
                                : static_cast<int>(c.sample_sigmas.size());
  int steps_run = 0;
  const Tensor latents = stages.run("denoise", steps_default, [&](pipeline::Stage& s) {
    const Model model = Model::load(c.transformer, req.dtype);
    TorchGenerator g(req.seed);
    const DType noise_dtype = model.compute_dtype() == "BF16" ? DType::kBF16 : DType::kF32;
    DenoiseInputs in;
    in.prompt = positive;
    if (cfg) {
      in.negative = negative;
      in.cfg_scale = req.cfg_scale;
    }
    // randn of [1, 1, C, h, w], flattened to tokens (_pack_latents).
    in.noise = qwen21_vae::pack(
        randn_tensor(g, {1, c.transformer_cfg.in_channels, gh, gw}, noise_dtype).to_f32());
    in.height = gh, in.width = gw;
    in.references = latents_in;
    DenoiseOptions o;
    if (c.sample_sigmas.empty()) {
      o.steps = steps_default;
    } else {
      o.sigmas = c.sample_sigmas;
    }
    o.mode = req.kv_cache ? KVMode::kCached : KVMode::kRecompute;
    o.step_caches = req.step_caches;
    o.store = control.store;
    const bool cached = req.kv_cache && c.transformer_cfg.causal_condition;
    pipeline::DenoiseStage ds(s, control, "prefix", cached, cfg ? " (2 branches)" : "");
    std::optional<qwen21_vae::Vae> preview_vae;
    ds.attach(o, [&](const Tensor& x0) {
      if (!preview_vae) preview_vae.emplace(qwen21_vae::Vae::load(c.vae));
      return decode_latents(*preview_vae, x0, gh, gw, false);
    });
    const DenoiseResult r = denoise(model, in, o);
    rs.add(r);
    res.step_caches = r.step_caches;
    steps_run = static_cast<int>(r.step_seconds.size());
    s.detail = std::to_string(steps_run) + " steps" + (cfg ? " x 2 branches, " : ", ") +
               (r.store_hits > 0 && r.store_misses == 0
                    ? "prefix K/V from the reference store at every step (" +
                          std::to_string(r.kv_bytes) + " bytes)"
                : r.kv_bytes > 0 ? "prefix K/V computed at step 1 and reused after it (" +
                                       std::to_string(r.kv_bytes) + " bytes)"
                                 : "prefix recomputed every step");
    return r.latents;
  });
  res.parameters = parameters_text(req, p, res.width, res.height, steps_run, cfg, resolution);
  const Image image = stages.run("decode", 1, [&](pipeline::Stage& s) {
    const qwen21_vae::Vae vae = qwen21_vae::Vae::load(c.vae);
    Image im = decode_latents(vae, latents, gh, gw, req.vae_tiling);
    s.advance(1, "decoded");
    s.detail = size_str(res.width, res.height) + " RGBA";
    return im;
  });
  res.channels = image.channels;
  res.pixels = image.pixels;
  rs.report(res);
  return res;
}

}  // namespace

GenerateLayout qwen21_generate_layout(const PipelineFolder& p, const GenerateRequest& req) {
  check_text_length(p, req);
  const Components c = check_components(p);
  const int64_t resolution = req.resolution > 0 ? req.resolution : kDefaultResolution;
  GenerateLayout l;
  l.cfg = req.cfg_scale > 1.0f && req.has_negative_prompt;
  for (const std::string& path : req.references) {
    const Image img = load_image(path, PixelFormat::kRGBA);
    l.image_sizes.push_back(
        qwen21_dimensions(resolution, img.width, img.height, "condition image " + path));
  }
  const qwen3_vl::PromptCounts pc =
      qwen3_vl::prompt_counts(c.text_encoder, c.processor, req.prompt, l.image_sizes);
  l.text_tokens = pc.text_tokens;
  for (int64_t slots : pc.image_slots) l.image_tokens.push_back(slots * kSlotTokens);
  if (l.cfg) {
    l.negative_text_tokens =
        qwen3_vl::prompt_counts(c.text_encoder, c.processor, req.negative_prompt, l.image_sizes)
            .text_tokens;
  }
  int64_t w = req.width, h = req.height;
  if (!l.image_sizes.empty()) {
    if (w == 0) w = l.image_sizes.back().first;
    if (h == 0) h = l.image_sizes.back().second;
  }
  if (w == 0) w = resolution;
  if (h == 0) h = resolution;
  l.width = w / kMultiple * kMultiple, l.height = h / kMultiple * kMultiple;
  FLOWKV_CHECK(l.width > 0 && l.height > 0, "the image size ", size_str(w, h), " is smaller than ",
               kMultiple, " pixels a side");
  l.target_tokens = (l.width / 16) * (l.height / 16);
  l.transformer = c.transformer;
  return l;
}

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

void qwen21_write_zero_pipeline(const qwen::Config21& transformer, DType dtype,
                                const std::string& dir) {
  const fs::path d(dir);
  write_zero_folder((d / "transformer").string(), transformer.to_json(),
                    qwen::weight_table(transformer), dtype);
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
  write_zero_folder((d / "text_encoder").string(), te, table, dtype);
  const qwen21_vae::Config vae;  // the class defaults are the released VAE
  write_zero_folder((d / "vae").string(), vae.to_json(), qwen21_vae::weight_table(vae), dtype);
  fs::create_directories(d / "processor");
  write_file_atomic((d / "processor/preprocessor_config.json").string(),
                    qwen3_vl_preprocessor_config().dump(2));
  fs::create_directories(d / "scheduler");
  const Json sched = {{"_class_name", "FlowMatchEulerDiscreteScheduler"},
                      {"num_train_timesteps", 1000},
                      {"shift", 1.0},
                      {"use_dynamic_shifting", true},
                      {"base_shift", 0.5},
                      {"max_shift", 0.9},
                      {"base_image_seq_len", 256},
                      {"max_image_seq_len", 8192},
                      {"shift_terminal", 0.02},
                      {"time_shift_type", "exponential"}};
  write_file_atomic((d / "scheduler/scheduler_config.json").string(), sched.dump(2));
  const Json index = {{"_class_name", "QwenImage21Pipeline"},
                      {"processor", {"transformers", "Qwen3VLProcessor"}},
                      {"scheduler", {"diffusers", "FlowMatchEulerDiscreteScheduler"}},
                      {"text_encoder", {"transformers", "Qwen3VLForConditionalGeneration"}},
                      {"transformer", {"diffusers", "QwenImage21Transformer2DModel"}},
                      {"vae", {"diffusers", "AutoencoderKLQwenImage21"}}};
  write_file_atomic((d / "model_index.json").string(), index.dump(2));
}

void qwen21_check_pipeline(const PipelineFolder& p) {
  (void)check_components(p);
}

bool qwen21_runs_pipeline(const std::string& pipeline_class) {
  return pipeline_class == "QwenImage21Pipeline";
}

GenerateResult qwen21_generate(const PipelineFolder& p, const GenerateRequest& req,
                               const GenerateProgress& progress, const GenerateControl& control) {
  return generate_qwen21(p, req, progress, control);
}

}  // namespace flowkv::families
