// Qwen-Image (and Edit-Plus 2509 / 2511): diffusers QwenImageTransformer2DModel. Every token
// reads the target and follows the current step, so no exact conditioning cache exists; step
// caches apply.
#include "families/family.h"
#include "families/adapters.h"
#include "families/flux2/impl.h"
#include "families/forward_run.h"
#include "flowkv/error.h"
#include "models/qwen_image/builtin.h"
#include "models/qwen_image/config.h"
#include "models/qwen_image/model_qwen.h"
#include "models/qwen_image/weights.h"
#include "pipeline/denoise.h"

namespace flowkv::families {

namespace {

constexpr const char* kClass = "QwenImageTransformer2DModel";

std::string describe(const qwen::ConfigQwenImage& c) {
  return "Qwen-Image (" + std::to_string(c.num_layers) + " dual-stream blocks x " +
         std::to_string(c.dim()) + ")";
}

// The released shapes, one row each: predict, export and the cacheability report read this
// table.
struct Released {
  const char* name;
  bool zero_cond_t;  // Edit-2511's references modulated from t = 0
  bool edit;         // released with QwenImageEditPlusPipeline
};
constexpr Released kReleased[] = {
    {"qwen-image", false, false},
    {"qwen-image-edit-plus", false, true},  // Qwen-Image-Edit-2509
    {"qwen-image-edit-2511", true, true},
};

qwen::ConfigQwenImage released_config(const Released& r) {
  qwen::ConfigQwenImage c;  // the class defaults are the released transformer
  c.zero_cond_t = r.zero_cond_t;
  return c;
}

// The released shape, a config.json, or a checkpoint (its config, else inferred from shapes).
qwen::ConfigQwenImage config_of_model(const std::string& model) {
  for (const Released& r : kReleased) {
    if (model == r.name) return released_config(r);
  }
  qwen::ConfigQwenImage c;
  if (qwen::builtin_config_qwen_image(model, &c)) return c;
  if (const std::optional<Json> j = config_of(model)) {
    return qwen::ConfigQwenImage::from_json(*j, model);
  }
  return qwen::config_qwen_image_of(scan_checkpoint(model));
}

// Nothing is cached: the prediction names the model and costs every step in full.
KVPrediction predict_shape(const PredictRequest& r) {
  const qwen::ConfigQwenImage c = config_of_model(r.model);
  const TokenLayout layout = joint_layout(r.text_tokens, r.ref_tokens, r.target_tokens);
  const CachePlan plan = plan_cache(layout, /*cache_exact=*/true, /*text_kv_approx=*/false);
  const cost::ModelShape shape{c.dim(), c.num_layers, c.mlp_hidden(), r.kv_bytes_per_element};
  return prediction(describe(c), shape, layout, plan, r.steps, r.cfg);
}

void inspect_files(const CheckpointScan& scan, InspectReport& r) {
  r.family = "Qwen-Image";
  try {
    const qwen::ConfigQwenImage c = qwen::config_qwen_image_of(scan, &r.config_inferred);
    r.config_json = c.to_json().dump();
    r.variant = "Qwen-Image (" + std::to_string(c.num_layers) + " dual-stream blocks, width " +
                std::to_string(c.dim()) + "); no exact conditioning cache";
    for (const std::string& p : check_against_table(scan.tensors, qwen::weight_table(c)))
      r.problems.push_back(p);
  } catch (const Error& e) {
    r.problems.push_back(e.what());
    r.variant = "Qwen-Image of an unknown configuration";
  }
}

// The family's model: a loaded transformer.
class QwenImageModel final : public FamilyModel {
 public:
  QwenImageModel(qwen::ModelQwenImage m, std::string variant, bool int8)
      : m_(std::move(m)), variant_(std::move(variant)), int8_(int8) {}
  std::string variant() const override { return variant_; }
  std::string config_json() const override { return m_.config().to_json().dump(2); }
  std::string compute_dtype() const override {
    return int8_ ? "INT8" : std::string(dtype_name(m_.compute_dtype()));
  }
  int64_t in_channels() const override { return m_.config().in_channels; }
  int64_t text_channels() const override { return m_.config().joint_attention_dim; }
  cache::Topology topology() const override { return qwen_image_topology(m_); }
  std::unique_ptr<pipeline::DenoiseAdapter> adapter(const DenoiseInputs& in,
                                                    const DenoiseOptions& opts) const override {
    return qwen_image_adapter(m_, in, opts);
  }
  // One forward of the whole image stream [target, references] at time opts.sigma; the output
  // is the target's velocity.
  Tensor forward(const DenoiseInputs& in, const ForwardOptions& opts, ForwardProfile* profile,
                 Workspace* ws) const override {
    DenoiseOptions o;
    o.steps = 1;
    return adapter_forward(*qwen_image_adapter(m_, in, o), in, opts, profile, ws);
  }
  DenoiseInputs example_inputs(const ExampleShape& s) const override {
    DenoiseInputs in;
    in.prompt = {example_tensor({s.batch, s.text_tokens, text_channels()}, s.seed + 1), {}, {}};
    if (s.cfg) {
      in.negative = {example_tensor({s.batch, s.text_tokens, text_channels()}, s.seed + 3), {}, {}};
      in.cfg_scale = 4.0f;
    }
    example_latents(in, s, in_channels());
    return in;
  }
  KVPrediction predict(int64_t text, const std::vector<int64_t>& refs, int64_t target, int steps,
                       bool cfg) const override {
    const qwen::ConfigQwenImage& c = m_.config();
    const TokenLayout layout = joint_layout(text, refs, target);
    const CachePlan plan = plan_cache(layout, true, false);
    const cost::ModelShape shape{c.dim(), c.num_layers, c.mlp_hidden(),
                                 dtype_size(m_.compute_dtype())};
    return prediction(variant_, shape, layout, plan, steps, cfg);
  }

 private:
  qwen::ModelQwenImage m_;
  std::string variant_;
  bool int8_;
};

std::shared_ptr<const FamilyModel> builtin_model(const std::string& name, uint64_t seed,
                                                 const std::string& dtype) {
  qwen::ConfigQwenImage c;
  FLOWKV_CHECK(qwen::builtin_config_qwen_image(name, &c), "no built-in Qwen-Image model '", name,
               "' (choose qwen-image-tiny)");
  const flux2::LoadOptions f = parse_dtype_option(dtype);
  qwen::LoadOptions21 o;
  o.auto_dtype = f.auto_dtype;
  o.compute = f.compute;
  o.int8 = f.int8;
  const DType store = !o.auto_dtype && o.compute == DType::kBF16 ? DType::kBF16 : DType::kF32;
  qwen::ModelQwenImage m =
      qwen::ModelQwenImage::from_tensors(qwen::random_weights_qwen_image(c, seed, store), c, o);
  return std::make_shared<QwenImageModel>(
      std::move(m), "built-in '" + name + "' (" + describe(c) + ", random weights)", f.int8);
}

void write_builtin(const std::string& name, uint64_t seed, const std::string& dtype,
                   const std::string& dir) {
  qwen::ConfigQwenImage c;
  FLOWKV_CHECK(qwen::builtin_config_qwen_image(name, &c), "no built-in Qwen-Image model '", name,
               "'");
  const auto weights = qwen::random_weights_qwen_image(c, seed, parse_dtype_option(dtype).compute);
  std::vector<TensorToWrite> list;
  for (const ExpectedTensor& e : qwen::weight_table(c)) {
    const Tensor& t = weights.at(e.name);
    list.push_back({e.name, t.dtype(), t.shape(), t.raw()});
  }
  write_diffusers_folder(dir, c.to_json(), list);
}

std::shared_ptr<const FamilyModel> load_model(const std::string& path, const std::string& dtype) {
  const flux2::LoadOptions f = parse_dtype_option(dtype);
  qwen::LoadOptions21 o;
  o.auto_dtype = f.auto_dtype;
  o.compute = f.compute;
  o.int8 = f.int8;
  qwen::ModelQwenImage m = qwen::ModelQwenImage::load(path, o);
  std::string variant = describe(m.config());
  if (m.config().zero_cond_t) variant += ", zero_cond_t (Edit-2511)";
  return std::make_shared<QwenImageModel>(std::move(m), std::move(variant), f.int8);
}

FamilyInfo info() {
  FamilyInfo i;
  i.name = "qwen-image";
  i.title = "Qwen-Image (and Edit, Edit-Plus)";
  i.exact_cache = "";  // none
  i.no_exact_cache =
      "Why: Qwen-Image attends bidirectionally over [text, target, pictures], so the text and "
      "the pictures read the noisy target at every step, and every token is modulated by the "
      "step's time (Edit-2511's zero_cond_t fixes the pictures' time at 0, but they still read "
      "the target). What it would take: a checkpoint trained so that the conditioning never "
      "reads the target and is modulated at a fixed time, as Qwen-Image-2.1 (causal_condition) "
      "and FLUX.2 Klein 9B KV are; caching this model's conditioning K/V anyway would be an "
      "approximation. Step caches apply (--cache, e.g. fbcache:threshold=0.2).";
  i.images = "reference";
  for (const Released& r : kReleased) i.released.push_back(r.name);
  i.builtins = qwen::builtin_names_qwen_image();
  i.default_builtin = "qwen-image-tiny";
  i.default_steps = 50;  // QwenImagePipeline / QwenImageEditPlusPipeline __call__
  i.bench_steps = {4, 8};
  i.bench_images = {0, 1, 2};
  i.true_cfg = true;
  i.grid_multiple = 1;
  return i;
}

}  // namespace

Family qwen_image_family() {
  Family f;
  f.info = info();
  f.detects = [](const Json& j) { return qwen::class_name(j) == kClass; };
  f.detects_tensors = [](const CheckpointScan& scan) {
    return qwen::holds_qwen_image(scan.tensors);
  };
  f.has_builtin = [](const std::string& name) {
    qwen::ConfigQwenImage c;
    return qwen::builtin_config_qwen_image(name, &c);
  };
  f.load = load_model;
  f.builtin = builtin_model;
  f.write_builtin = write_builtin;
  f.inspect = inspect_files;
  f.predict_shape = predict_shape;
  f.layout = [](const std::string& model, int64_t text, const std::vector<int64_t>& refs,
                int64_t target) -> std::optional<TokenLayout> {
    (void)config_of_model(model);  // a config that is not Qwen-Image's fails here
    return joint_layout(text, refs, target);
  };
  f.write_zeros = [](const std::string& name, const std::string& dtype, const std::string& dir) {
    const DType dt = parse_dtype_option(dtype).compute;
    for (const Released& r : kReleased) {
      if (name == std::string(r.name) + "-pipeline") {
        return qwen_image_write_zero_pipeline(released_config(r), r.edit, dt, dir);
      }
    }
    const qwen::ConfigQwenImage c = config_of_model(name);
    write_zero_folder(dir, c.to_json(), qwen::weight_table(c), dt);
  };
  f.tables = flux1_tables();
  f.runs_pipeline = [](const std::string& pipeline_class) {
    return pipeline_class == "QwenImagePipeline" || pipeline_class == "QwenImageEditPlusPipeline";
  };
  f.open_pipeline = qwen_image_open_pipeline;
  return f;
}

cache::Topology qwen_image_topology(const qwen::ModelQwenImage& m) {
  cache::Topology t = m.topology();
  t.tables = flux1_tables();
  return t;
}

}  // namespace flowkv::families
