// Qwen-Image from a prompt (and pictures) to a picture, as diffusers 0.42.1's QwenImagePipeline
// and QwenImageEditPlusPipeline do it, stage by stage:
//   prompt      text to image: the template, the tokenizer (1024 + 34 tokens at most), the
//               Qwen2.5-VL language model's last hidden state after its final norm without the
//               34 system-prompt rows, cut to max_sequence_length (512);
//               Edit-Plus: each picture resized to about 384^2 pixels (Lanczos, multiples of 32)
//               for the processor, "Picture k: <|vision_start|><|image_pad|><|vision_end|>"
//               before the prompt, the vision tower's tokens in the sequence, 64 rows dropped;
//               the positive branch, and the negative one under true CFG
//   references  (Edit-Plus) each picture resized to about 1024^2 pixels, VAE-encoded (mode),
//               normalised, packed 2x2
//   denoise     torch-seeded noise, the one denoising loop: the image stream is [target,
//               references], true CFG rescaled to the positive branch's norm per token
//   decode      unpacked, de-normalised, VAE decode, RGB pixels
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
#include "models/qwen25_vl/config.h"
#include "models/qwen25_vl/prompt_encoder.h"
#include "models/qwen25_vl/source.h"
#include "models/qwen25_vl/vision_config.h"
#include "models/qwen25_vl/vision_weights.h"
#include "models/qwen25_vl/weights.h"
#include "models/qwen_image/config.h"
#include "models/qwen_image/weights.h"
#include "models/qwen_image_vae/image_processor.h"
#include "models/qwen_image_vae/model.h"
#include "models/qwen_image_vae/weights.h"
#include "pipeline/condition_image.h"
#include "pipeline/generate.h"
#include "pipeline/identity.h"

namespace flowkv::families {

namespace {

namespace fs = std::filesystem;

constexpr int64_t kDefaultSize = 1024;       // default_sample_size 128 x vae_scale_factor 8
constexpr int64_t kMultiple = 16;            // vae_scale_factor * 2: sizes are floored to it
constexpr int64_t kConditionSide = 384;      // CONDITION_IMAGE_SIZE = 384 * 384
constexpr int64_t kVaeSide = 1024;           // VAE_IMAGE_SIZE = 1024 * 1024
constexpr int64_t kMaxSequenceLength = 512;  // QwenImagePipeline's max_sequence_length default
constexpr int64_t kMaxSequenceLimit = 1024;  // check_inputs refuses more
constexpr int64_t kMaxPictures = 3;          // Edit-Plus is trained on 1 to 3 pictures
constexpr float kDefaultCfgScale = 4.0f;     // __call__'s true_cfg_scale

std::string config_path(const std::string& dir) {
  return (fs::path(dir) / "config.json").string();
}

struct Components {
  bool edit = false;  // QwenImageEditPlusPipeline
  std::string transformer, text_encoder, tokenizer, processor, vae;
  qwen::ConfigQwenImage transformer_cfg;
  qwen_vae::Config vae_cfg;
};

// Before any weight is read: every component is there and they fit together.
Components check_components(const PipelineFolder& p) {
  Components c;
  c.edit = p.class_name == "QwenImageEditPlusPipeline";
  c.transformer = p.component("transformer").path;
  c.text_encoder = p.component("text_encoder").path;
  c.vae = p.component("vae").path;
  c.tokenizer = p.component("tokenizer").path;
  if (c.edit) c.processor = p.component("processor").path;
  FLOWKV_CHECK(path_exists(c.transformer), c.transformer, ": missing (model_index.json names it)");
  FLOWKV_CHECK(path_exists(c.text_encoder), c.text_encoder,
               ": missing (model_index.json names it)");
  FLOWKV_CHECK(path_exists(config_path(c.vae)), c.vae, ": missing (model_index.json names it, but ",
               config_path(c.vae), " does not exist)");
  if (c.edit) {
    FLOWKV_CHECK(path_exists(c.processor + "/preprocessor_config.json"), c.processor,
                 "/preprocessor_config.json: missing (the Qwen2-VL processor of the pipeline)");
  }
  const CheckpointScan ts = scan_checkpoint(c.transformer);
  c.transformer_cfg = qwen::config_qwen_image_of(ts);
  c.vae_cfg = qwen_vae::Config::from_json(read_json_file(config_path(c.vae)), config_path(c.vae));
  // The text encoder may be a folder, a GGUF written by flowkv quantize, or a llama.cpp GGUF
  // (qwen25_vl/source.h): the last has no vision tower, which Edit-Plus needs.
  const qwen25_vl::TextEncoderSource te_source = qwen25_vl::open_text_encoder(c.text_encoder);
  FLOWKV_CHECK(!c.edit || !te_source.llama_cpp, c.text_encoder,
               ": a llama.cpp GGUF of the language model holds no vision tower (llama.cpp keeps it "
               "in a separate mmproj file, which flowkv does not read), and Edit-Plus reads the "
               "pictures with it: use the diffusers text_encoder/ folder or a GGUF written from it "
               "by flowkv quantize");
  const qwen25_vl::EncoderShape te{te_source.cfg.text.hidden_size};
  const qwen::ConfigQwenImage& t = c.transformer_cfg;
  FLOWKV_CHECK(te.hidden_size == t.joint_attention_dim, p.path, ": the text encoder's hidden size ",
               te.hidden_size, " does not fit the transformer's joint_attention_dim ",
               t.joint_attention_dim, " (mismatched components)");
  FLOWKV_CHECK(t.patch_size == 2 && c.vae_cfg.z_dim * 4 == t.in_channels, p.path, ": the VAE's ",
               c.vae_cfg.z_dim, " latent channels packed 2x2 do not fit the transformer's ",
               "in_channels ", t.in_channels, " (patch_size ", t.patch_size,
               "; mismatched components)");
  FLOWKV_CHECK(t.out_channels == c.vae_cfg.z_dim, p.path, ": the transformer's out_channels ",
               t.out_channels, " are not the VAE's ", c.vae_cfg.z_dim, " latent channels");
  FLOWKV_CHECK(c.vae_cfg.scale_factor() == kMultiple / 2, p.path, ": the VAE scales by ",
               c.vae_cfg.scale_factor(), "; Qwen-Image's pipelines assume 8");
  return c;
}

using pipeline::size_str;

// What a request carries past planning: the pictures as the prompt encoder sees them.
struct QwenImagePlan {
  std::vector<Image> vl_images;
};

class QwenImageSpec final : public pipeline::GenerateSpec {
 public:
  QwenImageSpec(const PipelineFolder& p, const PipelineOptions& o)
      : p_(p), c_(check_components(p)), dtype_(o.dtype) {}

  std::string images_stage() const override { return "references"; }
  std::string cached_name() const override { return "references"; }
  std::string kv_name() const override { return "K/V"; }
  PixelFormat pixel_format() const override { return PixelFormat::kRGB; }
  int default_steps() const override { return 50; }  // __call__'s num_inference_steps
  float default_cfg_scale() const override { return kDefaultCfgScale; }

  void plan(pipeline::Plan& p, std::vector<Image> decoded) const override {
    const GenerateRequest& req = p.request;
    auto qp = std::make_shared<QwenImagePlan>();
    FLOWKV_CHECK(req.resolution == 0, p_.path,
                 ": --resolution is Qwen-Image-2.1's; Qwen-Image sizes its pictures as diffusers "
                 "does (384^2 pixels for the prompt, 1024^2 for the VAE)");
    if (!c_.edit) {
      FLOWKV_CHECK(decoded.empty(), p_.path, " is a QwenImagePipeline (text to image): it takes ",
                   "no pictures; editing needs a QwenImageEditPlusPipeline folder");
      const int64_t m = req.max_sequence_length;
      FLOWKV_CHECK(m >= 0 && m <= kMaxSequenceLimit, "max_sequence_length ", m,
                   " is over QwenImagePipeline's limit of ", kMaxSequenceLimit);
    } else {
      FLOWKV_CHECK(!decoded.empty(), p_.path,
                   " is a QwenImageEditPlusPipeline: it edits 1 to 3 pictures (-r)");
      FLOWKV_CHECK(static_cast<int64_t>(decoded.size()) <= kMaxPictures, decoded.size(),
                   " pictures; Qwen-Image-Edit-Plus takes 1 to ", kMaxPictures);
      FLOWKV_CHECK(req.max_sequence_length == 0, p_.path,
                   ": QwenImageEditPlusPipeline keeps the whole prompt (no max_sequence_length)");
    }
    p.cfg = req.cfg_scale > 1.0f && req.has_negative_prompt;
    GenerateLayout& l = p.layout;
    l.cfg = p.cfg;
    for (size_t i = 0; i < decoded.size(); ++i) {
      const std::string what = "picture " + p.names[i];
      const Image& im = decoded[i];
      const auto [cw, ch] = qwen21_dimensions(kConditionSide, im.width, im.height, what);
      const auto [vw, vh] = qwen21_dimensions(kVaeSide, im.width, im.height, what);
      qp->vl_images.push_back(resize_lanczos(im, cw, ch));
      p.images.push_back(resize_lanczos(im, vw, vh));
      l.image_sizes.emplace_back(vw, vh);
      l.image_tokens.push_back((vw / kMultiple) * (vh / kMultiple));
    }
    const int64_t max_len = max_length(req);
    l.text_tokens = counts(req.prompt, qp->vl_images, max_len).rows;
    if (p.cfg) l.negative_text_tokens = counts(req.negative_prompt, qp->vl_images, max_len).rows;
    int64_t want_w = req.width, want_h = req.height;
    if (!decoded.empty()) {  // the last picture's aspect ratio at 1024^2, unless given
      const Image& last = decoded.back();
      const auto [w, h] = qwen21_dimensions(kVaeSide, last.width, last.height, "the last picture");
      if (want_w == 0) want_w = w;
      if (want_h == 0) want_h = h;
    }
    if (want_w == 0) want_w = kDefaultSize;
    if (want_h == 0) want_h = kDefaultSize;
    p.grid_w = want_w / kMultiple, p.grid_h = want_h / kMultiple;  // packed tokens
    FLOWKV_CHECK(p.grid_w >= 1 && p.grid_h >= 1, "the image size ", size_str(want_w, want_h),
                 " is smaller than ", kMultiple, " pixels a side (one latent token)");
    l.width = p.grid_w * kMultiple, l.height = p.grid_h * kMultiple;
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
    const auto qp = std::static_pointer_cast<const QwenImagePlan>(p.family);
    const int64_t max_len = max_length(p.request);
    pipeline::PromptJob job;
    const std::string tokenizer = tokenizer_dir(), processor = c_.processor;
    const bool edit = c_.edit;
    job.describe = [qp, text, tokenizer, processor, edit, max_len](store::KeyBuilder& key) {
      pipeline::add_files_identity(key, "tokenizer", tokenizer);
      if (edit) pipeline::add_files_identity(key, "processor", processor);
      key.text("rule",
               edit ? "qwen-image edit-plus qwen2.5-vl prompt" : "qwen-image qwen2.5-vl prompt");
      key.text("text", text).integer("max length", max_len);
      key.integer("images", static_cast<int64_t>(qp->vl_images.size()));
      for (const Image& im : qp->vl_images) {
        key.integer("width", im.width).integer("height", im.height);
        key.integer("channels", im.channels);
        key.bytes("pixels", im.pixels.data(), im.pixels.size());
      }
    };
    job.encode = [this, &comps, qp, text, max_len](std::string* note) {
      const auto enc = comps.get<qwen25_vl::PromptEncoder>("text_encoder", [&] {
        return qwen25_vl::PromptEncoder::load(c_.text_encoder, tokenizer_dir(), c_.processor);
      });
      Arena arena;
      const ExecContext ctx{&arena};
      const qwen25_vl::PromptEncoding e = enc->encode(ctx, text, qp->vl_images, max_len);
      *note = std::to_string(e.embeds.dim(1)) + " tokens";
      if (!qp->vl_images.empty())
        *note += " (" + std::to_string(e.vision_tokens) + " of the pictures)";
      if (e.truncated) *note += ", cut to " + std::to_string(max_len);
      return PromptEmbeds{.embeds = e.embeds, .slots = {}, .mask = {}};
    };
    return job;
  }

  std::string image_rule() const override { return "qwen-image reference: RGB, VAE mode"; }
  Tensor encode_image(pipeline::Components& comps, const Image& image) const override {
    return vae(comps)->encode(ExecContext{}, qwen_vae::preprocess(image));
  }
  ReferenceLatents pack_image(const Tensor& z) const override {
    return {qwen_vae::pack(z), z.dim(2) / 2, z.dim(3) / 2};
  }
  bool exact_cache(const pipeline::Plan&) const override { return false; }

  // randn of [1, 1, C, 2h, 2w] in the prompt's type, packed 2x2 (_pack_latents).
  Tensor noise(pipeline::Components& comps, const pipeline::Plan& p) const override {
    return qwen_vae::pack(torch_noise(*transformer(comps), p.request.seed,
                                      c_.transformer_cfg.out_channels, 2 * p.grid_h, 2 * p.grid_w));
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
  std::string parameters_after_model(const pipeline::Plan& p) const override {
    return c_.edit ? ", Pictures: " + std::to_string(p.images.size()) : "";
  }

 private:
  // Edit-Plus tokenizes through its processor's tokenizer, as Qwen2VLProcessor does (the
  // pipeline's tokenizer/ when processor/ holds no tokenizer files).
  std::string tokenizer_dir() const {
    if (!c_.edit) return c_.tokenizer;
    for (const char* f : {"/tokenizer.json", "/vocab.json"}) {
      if (path_exists(c_.processor + f)) return c_.processor;
    }
    return c_.tokenizer;
  }
  // Text to image keeps max_sequence_length rows (512 unless asked); Edit-Plus all of them.
  int64_t max_length(const GenerateRequest& r) const {
    if (c_.edit) return 0;
    return r.max_sequence_length > 0 ? r.max_sequence_length : kMaxSequenceLength;
  }
  qwen25_vl::PromptCounts counts(const std::string& prompt, const std::vector<Image>& images,
                                 int64_t max_len) const {
    std::vector<std::pair<int64_t, int64_t>> sizes;
    for (const Image& im : images) sizes.emplace_back(im.width, im.height);
    return qwen25_vl::prompt_counts(c_.text_encoder, tokenizer_dir(), c_.processor, prompt, sizes,
                                    max_len);
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

// Qwen2.5-VL-7B-Instruct's config.json as Qwen-Image's text_encoder/ carries it (transformers
// 4.x's flat layout: hidden 3584 = joint_attention_dim).
Json qwen25_vl_7b_config() {
  return Json::parse(R"({
  "architectures": ["Qwen2_5_VLForConditionalGeneration"], "model_type": "qwen2_5_vl",
  "torch_dtype": "bfloat16", "attention_dropout": 0.0, "bos_token_id": 151643,
  "eos_token_id": 151645, "vision_start_token_id": 151652, "vision_end_token_id": 151653,
  "vision_token_id": 151654, "image_token_id": 151655, "video_token_id": 151656,
  "hidden_act": "silu", "hidden_size": 3584, "intermediate_size": 18944,
  "max_position_embeddings": 128000, "max_window_layers": 28, "num_attention_heads": 28,
  "num_hidden_layers": 28, "num_key_value_heads": 4, "rms_norm_eps": 1e-06,
  "rope_theta": 1000000.0, "sliding_window": 32768, "tie_word_embeddings": false,
  "use_cache": true, "use_sliding_window": false, "vocab_size": 152064,
  "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]},
  "vision_config": {
    "depth": 32, "hidden_act": "silu", "hidden_size": 1280, "intermediate_size": 3420,
    "num_heads": 16, "in_chans": 3, "out_hidden_size": 3584, "patch_size": 14,
    "spatial_merge_size": 2, "spatial_patch_size": 14, "window_size": 112,
    "fullatt_block_indexes": [7, 15, 23, 31], "tokens_per_second": 2,
    "temporal_patch_size": 2}})");
}

// Qwen-Image's released processor/preprocessor_config.json.
Json qwen_image_preprocessor_config() {
  return Json::parse(R"({
  "image_processor_type": "Qwen2VLImageProcessor", "do_convert_rgb": true,
  "do_normalize": true, "do_rescale": true, "do_resize": true,
  "image_mean": [0.48145466, 0.4578275, 0.40821073],
  "image_std": [0.26862954, 0.26130258, 0.27577711], "merge_size": 2, "patch_size": 14,
  "resample": 3, "rescale_factor": 0.00392156862745098, "min_pixels": 3136,
  "max_pixels": 12845056, "temporal_patch_size": 2})");
}

}  // namespace

void qwen_image_write_zero_pipeline(const qwen::ConfigQwenImage& transformer, bool edit,
                                    DType dtype, const std::string& dir) {
  const fs::path d(dir);
  write_zero_folder((d / "transformer").string(), transformer.to_json(),
                    qwen::weight_table(transformer), dtype);
  const Json te = qwen25_vl_7b_config();
  const qwen25_vl::Config tc = qwen25_vl::Config::from_json(te, "Qwen2.5-VL-7B config");
  std::vector<ExpectedTensor> table = qwen25_vl::text_weight_table(tc);
  for (const ExpectedTensor& e : qwen25_vl::vision_weight_table(
           qwen25_vl::VisionConfig::from_model_config(te, "Qwen2.5-VL-7B config"),
           qwen25_vl::kVisionPrefixV4)) {
    table.push_back(e);
  }
  write_zero_folder((d / "text_encoder").string(), te, table, dtype);
  const qwen_vae::Config vae;  // the class defaults are the released VAE
  write_zero_folder((d / "vae").string(), vae.to_json(), qwen_vae::weight_table(vae), dtype);
  fs::create_directories(d / "tokenizer");
  if (edit) {
    fs::create_directories(d / "processor");
    write_file_atomic((d / "processor/preprocessor_config.json").string(),
                      qwen_image_preprocessor_config().dump(2));
  }
  fs::create_directories(d / "scheduler");
  write_file_atomic((d / "scheduler/scheduler_config.json").string(),
                    qwen_scheduler_json().dump(2));
  Json index = {{"_class_name", edit ? "QwenImageEditPlusPipeline" : "QwenImagePipeline"},
                {"scheduler", {"diffusers", "FlowMatchEulerDiscreteScheduler"}},
                {"text_encoder", {"transformers", "Qwen2_5_VLForConditionalGeneration"}},
                {"tokenizer", {"transformers", "Qwen2Tokenizer"}},
                {"transformer", {"diffusers", "QwenImageTransformer2DModel"}},
                {"vae", {"diffusers", "AutoencoderKLQwenImage"}}};
  if (edit) index["processor"] = {"transformers", "Qwen2VLProcessor"};
  write_file_atomic((d / "model_index.json").string(), index.dump(2));
}

std::shared_ptr<const pipeline::GenerateSpec> qwen_image_open_pipeline(const PipelineFolder& p,
                                                                       const PipelineOptions& o) {
  return std::make_shared<const QwenImageSpec>(p, o);
}

}  // namespace flowkv::families
