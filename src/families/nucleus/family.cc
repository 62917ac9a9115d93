// NucleusMoE-Image: diffusers NucleusMoEImageTransformer2DModel. Only the image tokens have
// queries; the prompt enters every block as keys and values projected from the constant prompt
// embedding (never modulated, never reading the image), so its per-block K/V are the same at
// every step: the exact text K/V cache (diffusers TextKVCacheConfig).
#include <cmath>

#include "families/adapters.h"
#include "families/family.h"
#include "families/flux2/impl.h"
#include "families/forward_run.h"
#include "families/nucleus/cost.h"
#include "flowkv/error.h"
#include "models/nucleus/builtin.h"
#include "models/nucleus/config.h"
#include "models/nucleus/model.h"
#include "models/nucleus/moe.h"
#include "models/nucleus/weights.h"
#include "pipeline/denoise.h"

namespace flowkv::nucleus {

cost::ModelShape cost_shape(const Config& c, int64_t image_tokens, int64_t kv_bytes_per_element) {
  const double d = double(c.dim()), kv = double(c.kv_dim()), S = double(image_tokens);
  double mlp = 0;
  int64_t act_hidden = c.dense_inner();
  for (int64_t l = 0; l < c.num_layers; ++l) {
    if (!c.is_moe(l)) {
      mlp += 6.0 * double(c.dense_inner()) * d;
      continue;
    }
    const double E = double(c.num_experts), I = double(c.moe_intermediate_dim);
    const double cap = std::max(1.0, std::ceil(c.capacity_factor(l) * S / E));
    const double routed_rows = S > 0 ? E * cap / S : 0;  // expert rows per token
    mlp += 2.0 * 2.0 * d * E + 6.0 * I * d * (1.0 + routed_rows);
    // The gathered rows and their 2I + I activations, per token.
    act_hidden = std::max(
        act_hidden, static_cast<int64_t>(std::ceil((1.0 + routed_rows) * (d + 3.0 * I) / 3.0)));
  }
  cost::ModelShape m;
  m.width = c.dim();
  m.layers = c.num_layers;
  m.mlp_hidden = act_hidden;
  m.kv_bytes_per_element = kv_bytes_per_element;
  m.kv_width = c.kv_dim();
  m.mlp_flops = c.num_layers > 0 ? mlp / double(c.num_layers) : 0;
  m.keys_only_flops = 2.0 * (double(c.joint_attention_dim) * d + 2.0 * d * kv);
  return m;
}

}  // namespace flowkv::nucleus

namespace flowkv::families {

TokenLayout nucleus_layout(int64_t text, int64_t target) {
  TokenLayout l;
  // The text's keys and values are projections of the constant prompt embedding: constant
  // input, never modulated (the same at every time), no queries.
  Segment t{"text", SegmentKind::kText, text, true, true, 0, {}};
  t.keys_only = true;
  l.segments.push_back(t);
  // The target's queries read its own keys and the text's.
  l.segments.push_back({"target", SegmentKind::kTarget, target, false, false, 0, {1, 0}});
  return l;
}

namespace {

constexpr const char* kName = "nucleus";
constexpr const char* kClass = "NucleusMoEImageTransformer2DModel";

std::string describe(const nucleus::Config& c) {
  int64_t moe = 0;
  for (int64_t l = 0; l < c.num_layers; ++l) moe += c.is_moe(l) ? 1 : 0;
  return "NucleusMoE-Image (" + std::to_string(c.num_layers) + " blocks x " +
         std::to_string(c.dim()) + ", " + std::to_string(moe) + " of them MoE with " +
         std::to_string(c.num_experts) + " experts)";
}

// The released shapes, one row each: predict, export and the pipeline read this table.
struct Released {
  const char* name;
  const char* pipeline_class;
  int default_steps;  // the pipeline class's __call__ default
};
constexpr Released kReleased[] = {
    {"nucleus-moe-image", "NucleusMoEImagePipeline", 50},
};

// The released shape, a built-in, a config.json, or a checkpoint's config.
nucleus::Config config_of_model(const std::string& model, std::string* name) {
  for (const Released& r : kReleased) {
    if (model != r.name) continue;
    *name = describe(nucleus::Config::released()) + ", as released";
    return nucleus::Config::released();
  }
  nucleus::Config c;
  if (nucleus::builtin_config(model, &c)) {
    *name = "built-in '" + model + "' (" + describe(c) + ")";
    return c;
  }
  if (const std::optional<Json> j = config_of(model)) {
    c = nucleus::Config::from_json(*j, model);
  } else {
    const CheckpointScan scan = scan_checkpoint(model);
    FLOWKV_CHECK(scan.config, model,
                 ": a NucleusMoE-Image checkpoint needs its config.json (or a GGUF written by "
                 "flowkv quantize, which carries it)");
    c = nucleus::Config::from_json(*scan.config, model);
  }
  *name = describe(c);
  return c;
}

KVPrediction predict_of(const nucleus::Config& c, const std::string& name, int64_t text,
                        const std::vector<int64_t>& images, int64_t target, int steps, bool cfg,
                        int64_t kv_bytes) {
  FLOWKV_CHECK(images.empty(), "NucleusMoE-Image takes no conditioning images (got ", images.size(),
               ")");
  FLOWKV_CHECK(steps >= 1 && text >= 0 && target > 0,
               "steps and the target's tokens must be positive, text tokens non-negative");
  const TokenLayout layout = nucleus_layout(text, target);
  const CachePlan plan = plan_cache(layout, true, false);
  return prediction(name, nucleus::cost_shape(c, target, kv_bytes), layout, plan, steps, cfg);
}

void inspect_files(const CheckpointScan& scan, InspectReport& r) {
  r.family = "NucleusMoE-Image";
  try {
    FLOWKV_CHECK(scan.config, "no config.json");
    const nucleus::Config c = nucleus::Config::from_json(*scan.config, scan.path);
    r.config_json = c.to_json().dump();
    r.variant = describe(c) + "; exact text K/V cache available";
    for (const std::string& p : check_against_table(scan.tensors, nucleus::weight_table(c)))
      r.problems.push_back(p);
  } catch (const Error& e) {
    r.problems.push_back(e.what());
    r.variant = "NucleusMoE-Image of an unknown configuration";
  }
}

nucleus::LoadOptions options_of(const std::string& dtype) {
  const flux2::LoadOptions f = parse_dtype_option(dtype);
  nucleus::LoadOptions o;
  o.auto_dtype = f.auto_dtype;
  o.compute = f.compute;
  o.int8 = f.int8;
  return o;
}

class NucleusModel final : public FamilyModel {
 public:
  NucleusModel(nucleus::Model m, std::string variant, bool int8)
      : m_(std::move(m)), variant_(std::move(variant)), int8_(int8) {}
  std::string variant() const override { return variant_; }
  std::string config_json() const override { return m_.config().to_json().dump(2); }
  std::string compute_dtype() const override {
    return int8_ ? "INT8" : std::string(dtype_name(m_.compute_dtype()));
  }
  int64_t in_channels() const override { return m_.config().in_channels; }
  int64_t text_channels() const override { return m_.config().joint_attention_dim; }
  cache::Topology topology() const override { return nucleus_topology(m_); }
  std::unique_ptr<pipeline::DenoiseAdapter> adapter(const DenoiseInputs& in,
                                                    const DenoiseOptions& opts) const override {
    return nucleus_adapter(m_, in, opts);
  }
  // One uncached forward at time opts.sigma: the model's own output (x0 - noise; the loop
  // negates it before the Euler step).
  Tensor forward(const DenoiseInputs& in, const ForwardOptions& opts, ForwardProfile* profile,
                 Workspace* ws) const override {
    DenoiseOptions o;
    o.steps = 1;
    o.mode = KVMode::kRecompute;
    // The adapter hands the loop -v (pipeline_nucleusmoe_image.py negates before the step).
    return adapter_forward(*nucleus_adapter(m_, in, o), in, opts, profile, ws, -1.0f);
  }
  DenoiseInputs example_inputs(const ExampleShape& s) const override {
    FLOWKV_CHECK(s.references.empty(), "NucleusMoE-Image takes no conditioning images");
    DenoiseInputs in;
    in.prompt = {example_tensor({s.batch, s.text_tokens, text_channels()}, s.seed + 1), {}, {}};
    if (s.cfg) {
      in.negative = {example_tensor({s.batch, s.text_tokens, text_channels()}, s.seed + 3), {}, {}};
      in.cfg_scale = 4.0f;
    }
    example_latents(in, s, in_channels());
    return in;
  }
  KVPrediction predict(int64_t text, const std::vector<int64_t>& images, int64_t target, int steps,
                       bool cfg) const override {
    return predict_of(m_.config(), variant_, text, images, target, steps, cfg,
                      dtype_size(m_.kv_dtype()));
  }

 private:
  nucleus::Model m_;
  std::string variant_;
  bool int8_;
};

std::shared_ptr<const FamilyModel> builtin_model(const std::string& name, uint64_t seed,
                                                 const std::string& dtype) {
  nucleus::Config c;
  FLOWKV_CHECK(nucleus::builtin_config(name, &c), "no built-in NucleusMoE-Image model '", name,
               "' (choose nucleus-tiny)");
  const nucleus::LoadOptions o = options_of(dtype);
  const DType store = !o.auto_dtype && o.compute == DType::kBF16 ? DType::kBF16 : DType::kF32;
  nucleus::Model m = nucleus::Model::from_tensors(nucleus::random_weights(c, seed, store), c, o);
  return std::make_shared<NucleusModel>(
      std::move(m), "built-in '" + name + "' (" + describe(c) + ", random weights)", o.int8);
}

void write_builtin(const std::string& name, uint64_t seed, const std::string& dtype,
                   const std::string& dir) {
  nucleus::Config c;
  FLOWKV_CHECK(nucleus::builtin_config(name, &c), "no built-in NucleusMoE-Image model '", name,
               "'");
  const auto weights = nucleus::random_weights(c, seed, parse_dtype_option(dtype).compute);
  std::vector<TensorToWrite> list;
  for (const ExpectedTensor& e : nucleus::weight_table(c)) {
    const Tensor& t = weights.at(e.name);
    list.push_back({e.name, t.dtype(), t.shape(), t.raw()});
  }
  write_diffusers_folder(dir, c.to_json(), list);
}

std::shared_ptr<const FamilyModel> load_model(const std::string& path, const std::string& dtype) {
  const nucleus::LoadOptions o = options_of(dtype);
  nucleus::Model m = nucleus::Model::load(path, o);
  std::string variant = describe(m.config());
  return std::make_shared<NucleusModel>(std::move(m), std::move(variant), o.int8);
}

// diffusers keeps the routed experts pre-transposed for x @ W ([E, D, 2I], [E, I, D]); GGUF
// files hold them output-major ([E, 2I, D], [E, D, I]) so that each row is whole blocks.
std::optional<Tensor> gguf_form(const std::string& name, const Tensor& stored) {
  if (!(name.ends_with(std::string(".img_mlp.") + nucleus::wmoe::kGateUp) ||
        name.ends_with(std::string(".img_mlp.") + nucleus::wmoe::kDown)) ||
      stored.ndim() != 3) {
    return std::nullopt;
  }
  const Tensor f = stored.to_f32();
  const int64_t E = f.dim(0), R = f.dim(1), C = f.dim(2);
  Tensor t = Tensor::empty({E, C, R});
  for (int64_t e = 0; e < E; ++e) {
    const float* src = f.f32() + e * R * C;
    float* dst = t.f32() + e * R * C;
    for (int64_t r = 0; r < R; ++r) {
      for (int64_t k = 0; k < C; ++k) dst[k * R + r] = src[r * C + k];
    }
  }
  return t;
}

FamilyInfo info() {
  FamilyInfo i;
  i.name = kName;
  i.aliases = {"nucleus-moe", "nucleusmoe-image"};
  i.title = "NucleusMoE-Image";
  i.exact_cache = "text";  // every block's prompt keys and values
  i.images = "reference";
  i.takes_images = false;
  i.builtins = nucleus::builtin_names();
  i.default_builtin = "nucleus-tiny";
  for (const Released& r : kReleased) i.released.push_back(r.name);
  i.default_steps = kReleased[0].default_steps;
  i.bench_steps = {4, 8};
  i.bench_images = {0};  // text to image only
  i.true_cfg = true;
  i.grid_multiple = 1;
  return i;
}

}  // namespace

int nucleus_pipeline_default_steps(const std::string& pipeline_class) {
  for (const Released& r : kReleased) {
    if (pipeline_class == r.pipeline_class) return r.default_steps;
  }
  fail("no NucleusMoE-Image pipeline class \"", pipeline_class, "\"");
}

cache::Topology nucleus_topology(const nucleus::Model& m) {
  cache::Topology t = m.topology();
  t.tables = flux1_tables();
  return t;
}

Family nucleus_family() {
  Family f;
  f.info = info();
  f.detects = [](const Json& j) {
    return j.is_object() && j.contains("_class_name") && j.at("_class_name").is_string() &&
           j.at("_class_name").get<std::string>() == kClass;
  };
  f.has_builtin = [](const std::string& name) {
    nucleus::Config c;
    return nucleus::builtin_config(name, &c);
  };
  f.load = load_model;
  f.builtin = builtin_model;
  f.write_builtin = write_builtin;
  f.write_zeros = [](const std::string& name, const std::string& dtype, const std::string& dir) {
    const DType dt = parse_dtype_option(dtype).compute;
    for (const Released& r : kReleased) {
      if (name == std::string(r.name) + "-pipeline") {
        return nucleus_write_zero_pipeline(nucleus::Config::released(), dt, dir);
      }
    }
    std::string described;
    const nucleus::Config c = config_of_model(name, &described);
    write_zero_folder(dir, c.to_json(), nucleus::weight_table(c), dt);
  };
  f.gguf_form = gguf_form;
  f.inspect = inspect_files;
  f.predict_shape = [](const PredictRequest& r) {
    std::string name;
    const nucleus::Config c = config_of_model(r.model, &name);
    return predict_of(c, name, r.text_tokens, r.ref_tokens, r.target_tokens, r.steps, r.cfg,
                      r.kv_bytes_per_element);
  };
  f.layout = [](const std::string& model, int64_t text, const std::vector<int64_t>& images,
                int64_t target) -> std::optional<TokenLayout> {
    std::string name;
    (void)config_of_model(model, &name);  // a config that is not this family's fails here
    FLOWKV_CHECK(images.empty(), "NucleusMoE-Image takes no conditioning images");
    return nucleus_layout(text, target);
  };
  f.tables = flux1_tables();
  f.runs_pipeline = [](const std::string& pipeline_class) {
    for (const Released& r : kReleased) {
      if (pipeline_class == r.pipeline_class) return true;
    }
    return false;
  };
  f.open_pipeline = nucleus_open_pipeline;
  return f;
}

}  // namespace flowkv::families
