// FLUX.2 (Klein 4B / 9B / 9B KV, dev): diffusers Flux2Transformer2DModel, or an original BFL
// single file recognised by its tensors. Its exact cache keeps the Klein KV references.
#include "families/family.h"
#include <filesystem>
#include "core/checked.h"
#include "families/adapters.h"
#include "families/flux2/cost.h"
#include "families/flux2/impl.h"
#include "families/forward_run.h"
#include "flowkv/error.h"
#include "io/atomic_file.h"
#include "io/mapped_file.h"
#include "io/pipeline_folder.h"
#include "models/flux2/builtin.h"
#include "models/flux2/config.h"
#include "models/flux2/layout.h"
#include "models/flux2/weights.h"
#include "models/flux2_vae/config.h"
#include "models/flux2_vae/weights.h"
#include "models/qwen3/config.h"
#include "models/qwen3/weights.h"
#include "pipeline/denoise.h"
#include "pipeline/identity.h"
#include "pipeline/request_limits.h"

namespace flowkv {

flux2::LoadOptions parse_dtype_option(const std::string& dtype) {
  flux2::LoadOptions o;
  if (dtype == "auto") return o;
  o.auto_dtype = false;
  if (dtype == "f32" || dtype == "F32") {
    o.compute = DType::kF32;
  } else if (dtype == "bf16" || dtype == "BF16") {
    o.compute = DType::kBF16;
  } else if (dtype == "int8" || dtype == "INT8") {
    o.compute = DType::kF32;
    o.int8 = true;
  } else {
    fail("unknown dtype '", dtype, "': use auto, f32, bf16 or int8");
  }
  return o;
}

}  // namespace flowkv

namespace flowkv {

namespace flux2 {
cost::ModelShape cost_shape(const Config& c, int64_t kv_bytes_per_element) {
  return {c.dim(), c.num_blocks(), c.mlp_hidden(), kv_bytes_per_element};
}
}  // namespace flux2

namespace families {

namespace {

constexpr const char* kName = "flux2";

// The released FLUX.2 shapes, one row each (their transformer configs: flux2::released_config).
// Detection of the reference rule, predict, the cacheability report, the zero-weight export and
// the generate defaults all read this table.
struct Released {
  const char* name;
  const char* pipeline_class;  // the diffusers pipeline it is released with
  Flux2References rule;        // how its transformer reads references
  int default_steps;           // that pipeline's __call__ num_inference_steps
  float guidance_scale;        // its guidance_scale default (0: it has none)
};
constexpr Released kReleased[] = {
    {"klein-9b-kv", "Flux2KleinKVPipeline", Flux2References::kKleinKV, 4, 0.0f},
    {"klein-4b", "Flux2KleinPipeline", Flux2References::kJoint, 50, 4.0f},
    {"klein-9b", "Flux2KleinPipeline", Flux2References::kJoint, 50, 4.0f},
    {"dev", "Flux2Pipeline", Flux2References::kJoint, 50, 4.0f},
};

const Released* released(const std::string& name) {
  for (const Released& r : kReleased) {
    if (name == r.name) return &r;
  }
  return nullptr;
}

KVPrediction predict_of(const flux2::Config& c, const std::string& name, int64_t text,
                        const std::vector<int64_t>& refs, int64_t target, int steps, bool cfg,
                        int64_t kv_bytes, Flux2References rule = Flux2References::kKleinKV) {
  FLOWKV_CHECK(steps >= 1, "steps must be at least 1");
  FLOWKV_CHECK(text > 0 && target > 0, "text and target token counts must be positive");
  pipeline::check_request_limits({.steps = steps,
                                  .images = static_cast<int64_t>(refs.size()),
                                  .tokens = pipeline::sum_tokens(text, refs, target)});
  const TokenLayout layout = rule == Flux2References::kKleinKV
                                 ? flux2::klein_kv_layout(text, refs, target)
                                 : joint_layout(text, refs, target);
  const CachePlan plan = plan_cache(layout, /*cache_exact=*/true, /*text_kv_approx=*/false);
  return prediction(name, flux2::cost_shape(c, kv_bytes), layout, plan, steps, cfg);
}

// Ids as the Klein pipeline builds them: target (0, y, x, 0), text (0, 0, 0, l).
Tensor target_ids(int64_t h, int64_t w) {
  Tensor ids = Tensor::zeros({h * w, 4});
  for (int64_t y = 0; y < h; ++y) {
    for (int64_t x = 0; x < w; ++x) {
      ids.f32()[(y * w + x) * 4 + 1] = static_cast<float>(y);
      ids.f32()[(y * w + x) * 4 + 2] = static_cast<float>(x);
    }
  }
  return ids;
}
Tensor text_ids(int64_t l) {
  Tensor ids = Tensor::zeros({l, 4});
  for (int64_t i = 0; i < l; ++i) ids.f32()[i * 4 + 3] = static_cast<float>(i);
  return ids;
}

flux2::Config builtin_or_fail(const std::string& name) {
  flux2::Config c;
  if (!flux2::builtin_config(name, &c)) {
    std::string names;
    for (const auto& n : flux2::builtin_names()) names += (names.empty() ? "" : ", ") + n;
    fail("no built-in model '", name, "' (choose one of: ", names, ")");
  }
  return c;
}

// The family's model: the loaded transformer, shared with any Flux2Transformer handle over it.
class Flux2Model final : public FamilyModel {
 public:
  Flux2Model(std::shared_ptr<const Flux2Impl> t, Flux2References refs)
      : t_(std::move(t)), refs_(refs) {}
  std::string variant() const override { return t_->variant; }
  std::string config_json() const override { return model().config().to_json().dump(2); }
  std::string compute_dtype() const override { return flux2_compute_dtype(*t_); }
  int64_t in_channels() const override { return model().config().in_channels; }
  int64_t text_channels() const override { return model().config().joint_attention_dim; }
  cache::Topology topology() const override { return flux2_topology(model()); }
  std::unique_ptr<pipeline::DenoiseAdapter> adapter(const DenoiseInputs& in,
                                                    const DenoiseOptions& opts) const override {
    return flux2_adapter(model(), in, opts, refs_);
  }
  Tensor forward(const DenoiseInputs& in, const ForwardOptions& opts, ForwardProfile* profile,
                 Workspace* ws) const override;
  DenoiseInputs example_inputs(const ExampleShape& s) const override;
  KVPrediction predict(int64_t text, const std::vector<int64_t>& refs, int64_t target, int steps,
                       bool cfg) const override {
    return predict_of(model().config(), t_->variant, text, refs, target, steps, cfg,
                      dtype_size(model().kv_dtype()), refs_);
  }

 private:
  const flux2::Model& model() const { return t_->model; }
  std::shared_ptr<const Flux2Impl> t_;
  Flux2References refs_;
};

Tensor Flux2Model::forward(const DenoiseInputs& in, const ForwardOptions& opts,
                           ForwardProfile* profile, Workspace* ws) const {
  FLOWKV_CHECK(in.references.empty(),
               "forward: FLUX.2's forward takes the prompt and the target; references are "
               "denoise()'s");
  FLOWKV_CHECK(in.noise.defined() && in.noise.ndim() == 3, "noise must be a [B, h*w, ",
               in_channels(), "] tensor");
  FLOWKV_CHECK(in.prompt.embeds.defined() && in.prompt.embeds.ndim() == 3,
               "prompt embeddings must be a [B, L, ", text_channels(), "] tensor");
  FLOWKV_CHECK(in.noise.dim(1) == pipeline::grid_tokens(in.height, in.width, "the target grid"),
               "noise has ", in.noise.dim(1), " tokens for a ", in.height, "x", in.width, " grid");
  Flux2Call c;
  c.img = in.noise;
  c.img_ids = target_ids(in.height, in.width);
  c.txt = in.prompt.embeds;
  c.txt_ids = text_ids(in.prompt.embeds.dim(1));
  c.timestep = Tensor::from_vector(
      std::vector<float>(static_cast<size_t>(in.noise.dim(0)), opts.sigma), {in.noise.dim(0)});
  c.check_finite = opts.check_finite;
  return flux2_forward(*t_, c, profile, ws);
}

DenoiseInputs Flux2Model::example_inputs(const ExampleShape& s) const {
  FLOWKV_CHECK(!s.cfg, "FLUX.2 runs no unconditional branch (its guidance is distilled)");
  DenoiseInputs in;
  in.prompt.embeds = example_tensor({s.batch, s.text_tokens, text_channels()}, s.seed + 1);
  example_latents(in, s, in_channels());
  return in;
}

// A released shape, a built-in model, a config.json or a checkpoint (its config, or inferred
// from its tensors).
flux2::Config config_of_model(const std::string& model, std::string* name) {
  flux2::Config c;
  if (flux2::released_config(model, &c)) {
    *name = flux2::variant_name(c);
    return c;
  }
  if (flux2::builtin_config(model, &c)) {
    *name = "built-in '" + model + "' (" + flux2::variant_name(c) + ")";
    return c;
  }
  if (path_kind(model) == PathKind::kFile && model.size() > 5 &&
      model.substr(model.size() - 5) == ".json") {
    c = flux2::Config::from_json(read_json_file(model), model);
  } else {
    const CheckpointScan scan = scan_checkpoint(model);
    if (scan.config) {
      c = flux2::Config::from_json(*scan.config, scan.path + "/config.json");
    } else {
      c = flux2::infer_config(scan.tensors);
      c.validate(scan.path + " (config inferred from shapes)");
    }
  }
  *name = flux2::variant_name(c);
  return c;
}

// Klein 9B KV is trained for its reference layout; the others append references to the image
// stream. A config cannot tell Klein 9B from Klein 9B KV (one architecture): no rules then.
std::optional<TokenLayout> layout_of(const std::string& model, int64_t text,
                                     const std::vector<int64_t>& refs, int64_t target) {
  const Released* r = released(model);
  if (!r) return std::nullopt;
  return r->rule == Flux2References::kKleinKV ? flux2::klein_kv_layout(text, refs, target)
                                              : joint_layout(text, refs, target);
}

void inspect_files(const CheckpointScan& scan, InspectReport& r) {
  const flux2::WeightSource src(scan);
  if (scan.single_file && src.bfl_layout()) r.layout = "BFL original single file";
  r.parameters = 0;
  for (const auto& [name, t] : src.tensors()) r.parameters += shape_numel(t.shape);
  r.family = "FLUX.2";
  flux2::Config found;
  try {
    found = flux2::infer_config(src.tensors());
  } catch (const Error& e) {
    r.problems.push_back(e.what());
    r.variant = "FLUX.2 whose tensors cannot be read as a model";
    return;
  }
  flux2::Config cfg = found;
  r.config_inferred = true;
  if (scan.config) {
    try {
      cfg = flux2::Config::from_json(*scan.config, scan.path + "/config.json");
      r.config_inferred = false;
    } catch (const Error& e) {
      r.problems.push_back(e.what());
    }
  }
  try {
    cfg.validate(r.config_inferred ? scan.path + " (config inferred from shapes)"
                                   : scan.path + "/config.json");
  } catch (const Error& e) {
    r.problems.push_back(e.what());
    r.variant = "FLUX.2 with an impossible configuration";
    return;
  }
  r.variant = flux2::variant_name(cfg);
  r.config_json = cfg.to_json().dump();
  for (const std::string& k : src.unmapped()) r.problems.push_back("unknown BFL key: " + k);
  if (!r.config_inferred) {
    for (const std::string& s : flux2::config_disagreements(cfg, found, src.tensors())) {
      r.problems.push_back(s);
    }
  }
  for (const std::string& s : check_against_table(src.tensors(), flux2::weight_table(cfg))) {
    r.problems.push_back(s);
  }
}

FamilyInfo info() {
  FamilyInfo i;
  i.name = kName;
  i.aliases = {"klein"};
  i.title = "FLUX.2 (Klein 4B / 9B / 9B KV, dev)";
  i.exact_cache = "reference";
  i.images = "reference";
  i.builtins = flux2::builtin_names();
  i.default_builtin = "small";
  for (const Released& r : kReleased) i.released.push_back(r.name);
  i.default_steps = 4;
  i.bench_steps = {4, 8, 28};
  i.bench_images = {1, 2, 3};
  i.true_cfg = false;
  i.text_kv_approx = true;
  return i;
}

// A released Klein shape as a whole pipeline folder of zero weights (sparse files): transformer,
// its Qwen3 text encoder, the released VAE, the scheduler and model_index.json. The tokenizer is
// not weights: copy a real tokenizer/ folder in (docs/bench.md says how).
void write_zero_pipeline(const std::string& shape, const std::string& dtype,
                         const std::string& dir) {
  flux2::Config c;
  const Released* rel = released(shape);
  FLOWKV_CHECK(rel && std::string(rel->pipeline_class).rfind("Flux2Klein", 0) == 0 &&
                   flux2::released_config(shape, &c),
               "no released Klein shape '", shape,
               "' to write as a pipeline (klein-9b-kv-pipeline, klein-9b-pipeline, "
               "klein-4b-pipeline)");
  const DType dt = parse_dtype_option(dtype).compute;
  namespace fs = std::filesystem;
  write_zero_folder((fs::path(dir) / "transformer").string(), c.to_json(), flux2::weight_table(c),
                    dt);
  qwen3::Config te;
  FLOWKV_CHECK(
      qwen3::released_config(c.joint_attention_dim == 3 * 2560 ? "qwen3-4b" : "qwen3-8b", &te),
      "no Qwen3 encoder for joint_attention_dim ", c.joint_attention_dim);
  write_zero_folder((fs::path(dir) / "text_encoder").string(), te.to_json(),
                    qwen3::weight_table(te), dt);
  const flux2_vae::Config vae;  // the released VAE
  write_zero_folder((fs::path(dir) / "vae").string(), vae.to_json(), flux2_vae::weight_table(vae),
                    dt);
  fs::create_directories(fs::path(dir) / "scheduler");
  const Json sched = {{"_class_name", "FlowMatchEulerDiscreteScheduler"},
                      {"num_train_timesteps", 1000},
                      {"shift", 3.0},
                      {"use_dynamic_shifting", true},
                      {"base_shift", 0.5},
                      {"max_shift", 1.15},
                      {"base_image_seq_len", 256},
                      {"max_image_seq_len", 4096}};
  write_file_atomic((fs::path(dir) / "scheduler/scheduler_config.json").string(), sched.dump(2));
  const bool kv = rel->rule == Flux2References::kKleinKV;
  Json index = {{"_class_name", rel->pipeline_class},
                {"scheduler", {"diffusers", "FlowMatchEulerDiscreteScheduler"}},
                {"text_encoder", {"transformers", "Qwen3ForCausalLM"}},
                {"tokenizer", {"transformers", "Qwen2Tokenizer"}},
                {"transformer", {"diffusers", "Flux2Transformer2DModel"}},
                {"vae", {"diffusers", "AutoencoderKLFlux2"}}};
  if (!kv) index["is_distilled"] = true;
  write_file_atomic((fs::path(dir) / "model_index.json").string(), index.dump(2));
}

std::shared_ptr<const FamilyModel> wrap(std::shared_ptr<const Flux2Impl> t,
                                        Flux2References refs = Flux2References::kKleinKV) {
  return std::make_shared<Flux2Model>(std::move(t), refs);
}

// The reference rule of a checkpoint: its pipeline's class says it (model_index.json of the
// folder, or of the pipeline a transformer folder sits in). A bare transformer keeps Klein KV's
// rules, the only ones flowkv caches exactly; the pipeline folder is what tells Klein 9B KV from
// Klein 9B, whose transformers share one architecture.
Flux2References references_of(const std::string& path) {
  const std::optional<PipelineFolder> p = find_pipeline_folder(path);
  if (!p) return Flux2References::kKleinKV;
  return flux2_pipeline_rule(p->class_name, p->path);
}

}  // namespace

flux2::Config flux2_checkpoint_config(const std::string& path) {
  std::string name;
  return config_of_model(path, &name);
}

Flux2References flux2_pipeline_rule(const std::string& pipeline_class, const std::string& where) {
  std::string known;
  for (const Released& r : kReleased) {
    if (pipeline_class == r.pipeline_class) return r.rule;
    if (known.find(r.pipeline_class) == std::string::npos)
      known += (known.empty() ? "" : ", ") + std::string(r.pipeline_class);
  }
  fail(where, "/model_index.json: pipeline class \"", pipeline_class,
       "\" is not a FLUX.2 pipeline flowkv knows (", known, ")");
}

int flux2_pipeline_default_steps(const std::string& pipeline_class) {
  for (const Released& r : kReleased) {
    if (pipeline_class == r.pipeline_class) return r.default_steps;
  }
  fail("no FLUX.2 pipeline class \"", pipeline_class, "\"");
}

std::shared_ptr<const Flux2Impl> load_flux2(const std::string& path, const std::string& dtype) {
  auto impl = std::make_shared<Flux2Impl>();
  const flux2::LoadOptions o = parse_dtype_option(dtype);
  impl->model = flux2::Model::load(path, o);
  impl->int8 = o.int8;
  impl->variant = flux2::variant_name(impl->model.config());
  return impl;
}

std::shared_ptr<const Flux2Impl> builtin_flux2(const std::string& name, uint64_t seed,
                                               const std::string& dtype) {
  const flux2::Config c = builtin_or_fail(name);
  const flux2::LoadOptions o = parse_dtype_option(dtype);
  const DType store = !o.auto_dtype && o.compute == DType::kBF16 ? DType::kBF16 : DType::kF32;
  const flux2::WeightSource src(flux2::random_weights(c, seed, store));
  auto impl = std::make_shared<Flux2Impl>();
  impl->model = flux2::Model::from_source(src, c, o);
  impl->int8 = o.int8;
  impl->variant = "built-in '" + name + "' (" + flux2::variant_name(c) + ", random weights)";
  return impl;
}

void write_flux2_builtin(const std::string& name, uint64_t seed, const std::string& dtype,
                         const std::string& dir) {
  const flux2::Config c = builtin_or_fail(name);
  const DType store = parse_dtype_option(dtype).compute;
  const auto weights = flux2::random_weights(c, seed, store);
  std::vector<TensorToWrite> list;
  for (const ExpectedTensor& e : flux2::weight_table(c)) {
    const Tensor& t = weights.at(e.name);
    list.push_back({e.name, t.dtype(), t.shape(), t.raw()});
  }
  write_diffusers_folder(dir, c.to_json(), list);
}

std::string flux2_compute_dtype(const Flux2Impl& t) {
  return t.int8 ? "INT8" : std::string(dtype_name(t.model.compute_dtype()));
}

Tensor flux2_forward(const Flux2Impl& impl, const Flux2Call& call, ForwardProfile* profile,
                     Workspace* ws) {
  const flux2::Config& c = impl.model.config();
  auto need = [](const Tensor& t, int ndim, const char* what) {
    FLOWKV_CHECK(t.defined() && t.ndim() == ndim && t.dtype() == DType::kF32, what,
                 " must be an F32 ", ndim, "-D tensor",
                 t.defined() ? ", got " + shape_str(t.shape()) : "");
  };
  need(call.img, 3, "img");
  need(call.txt, 3, "txt");
  need(call.img_ids, 2, "img_ids");
  need(call.txt_ids, 2, "txt_ids");
  need(call.timestep, 1, "timestep");
  const int64_t b = call.img.dim(0), n = call.img.dim(1), l = call.txt.dim(1);
  FLOWKV_CHECK(call.img.dim(2) == c.in_channels, "img has ", call.img.dim(2),
               " channels per token; this model takes ", c.in_channels);
  FLOWKV_CHECK(call.txt.dim(0) == b && call.txt.dim(2) == c.joint_attention_dim, "txt is ",
               shape_str(call.txt.shape()), "; expected [", b, ", L, ", c.joint_attention_dim, "]");
  FLOWKV_CHECK(call.img_ids.dim(0) == n && call.img_ids.dim(1) == 4, "img_ids is ",
               shape_str(call.img_ids.shape()), "; expected [", n, ", 4]");
  FLOWKV_CHECK(call.txt_ids.dim(0) == l && call.txt_ids.dim(1) == 4, "txt_ids is ",
               shape_str(call.txt_ids.shape()), "; expected [", l, ", 4]");
  FLOWKV_CHECK(call.timestep.dim(0) == b, "timestep has ", call.timestep.dim(0),
               " values for a batch of ", b);
  if (call.guidance.defined()) {
    need(call.guidance, 1, "guidance");
    FLOWKV_CHECK(call.guidance.dim(0) == b, "guidance needs one value per batch element");
  }
  pipeline::RequestSize size{.batch = b, .tokens = checked_add(n, l, "forward tokens")};
  pipeline::check_request_limits(size);
  pipeline::check_request_memory(flux2::cost_shape(c, 2), size);
  Tensor out = Tensor::empty({b, n, c.out_features()});
  flux2::ForwardArgs a;
  a.batch = b;
  a.segments = {
      {.kind = SegmentKind::kText,
       .name = "text",
       .rows = call.txt.f32(),
       .tokens = l,
       .ids = call.txt_ids.f32()},
      {.kind = SegmentKind::kTarget,
       .name = "target",
       .rows = call.img.f32(),
       .tokens = n,
       .ids = call.img_ids.f32()},
  };
  a.timestep = call.timestep.f32();
  a.guidance = call.guidance.defined() ? call.guidance.f32() : nullptr;
  a.out = out.f32();
  ForwardRun run(ws, call.check_finite, profile);
  for (const auto& [t, name] : {std::pair{&call.img, "img"},
                                {&call.txt, "txt"},
                                {&call.timestep, "timestep"},
                                {&call.guidance, "guidance"}}) {
    run.input(name, *t);
  }
  impl.model.forward(run.context(), a);
  run.finish(out);
  return out;
}

LoadedTransformer flux2_loaded(std::shared_ptr<const Flux2Impl> t, Flux2References refs) {
  return {&by_name(kName), wrap(std::move(t), refs), ""};
}

LoadedTransformer load_flux2_transformer(const std::string& path, const std::string& dtype,
                                         bool klein_kv_rules) {
  LoadedTransformer t{&by_name(kName),
                      wrap(load_flux2(path, dtype),
                           klein_kv_rules ? Flux2References::kKleinKV : Flux2References::kJoint),
                      ""};
  t.identity = pipeline::component_identity(path, t.model->compute_dtype());
  return t;
}

cache::Topology flux2_topology(const flux2::Model& m) {
  cache::Topology t = m.topology();
  t.tables = flux1_tables();
  return t;
}

Family flux2_family() {
  Family f;
  f.info = info();
  f.detects = [](const Json& j) {
    return j.is_object() && j.contains("_class_name") && j["_class_name"].is_string() &&
           j["_class_name"].get<std::string>() == "Flux2Transformer2DModel";
  };
  f.detects_tensors = [](const CheckpointScan& scan) {
    const flux2::WeightSource src(scan);
    return src.tensors().count("double_stream_modulation_img.linear.weight") > 0 ||
           src.tensors().count("single_stream_modulation.linear.weight") > 0;
  };
  f.has_builtin = [](const std::string& name) {
    flux2::Config c;
    return flux2::builtin_config(name, &c);
  };
  f.load = [](const std::string& path, const std::string& dtype) {
    return wrap(load_flux2(path, dtype), references_of(path));
  };
  f.builtin = [](const std::string& name, uint64_t seed, const std::string& dtype) {
    return wrap(builtin_flux2(name, seed, dtype));
  };
  f.write_builtin = write_flux2_builtin;
  f.write_zeros = [](const std::string& name, const std::string& dtype, const std::string& dir) {
    if (name.size() > 9 && name.substr(name.size() - 9) == "-pipeline") {
      return write_zero_pipeline(name.substr(0, name.size() - 9), dtype, dir);
    }
    flux2::Config c;
    FLOWKV_CHECK(flux2::released_config(name, &c) || flux2::builtin_config(name, &c),
                 "no released shape or built-in FLUX.2 model '", name, "'");
    write_zero_folder(dir, c.to_json(), flux2::weight_table(c), parse_dtype_option(dtype).compute);
  };
  f.inspect = inspect_files;
  f.predict_shape = [](const PredictRequest& r) {
    std::string name;
    const flux2::Config c = config_of_model(r.model, &name);
    // A released shape's rule is known; a config or checkpoint keeps Klein KV's (the one rule
    // flowkv caches exactly; a checkpoint's pipeline folder decides it at generate).
    const Released* rel = released(r.model);
    return predict_of(c, name, r.text_tokens, r.ref_tokens, r.target_tokens, r.steps, r.cfg,
                      r.kv_bytes_per_element, rel ? rel->rule : Flux2References::kKleinKV);
  };
  f.layout = layout_of;
  f.tables = flux1_tables();
  // The Klein pipelines of the release table generate (Flux2Pipeline, dev's, does not).
  f.runs_pipeline = [](const std::string& pipeline_class) {
    for (const Released& r : kReleased) {
      if (pipeline_class == r.pipeline_class) return pipeline_class.starts_with("Flux2Klein");
    }
    return false;
  };
  f.open_pipeline = klein_open_pipeline;
  return f;
}

}  // namespace families

}  // namespace flowkv
