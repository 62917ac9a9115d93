// Qwen-Image-2.1: diffusers QwenImage21Transformer2DModel. Its exact cache keeps the prefix
// (condition images and text, block-causal) when the checkpoint has causal_condition.
#include "families/family.h"
#include "core/checked.h"
#include "families/adapters.h"
#include "families/flux2/impl.h"
#include "families/forward_run.h"
#include "families/qwen21/cost.h"
#include "families/qwen21/impl.h"
#include "flowkv/error.h"
#include "models/qwen_image/builtin.h"
#include "models/qwen_image/config.h"
#include "models/qwen_image/layout21.h"
#include "models/qwen_image/weights.h"
#include "pipeline/denoise.h"
#include "pipeline/request_limits.h"

namespace flowkv::qwen {

cost::ModelShape cost_shape(const Config21& c, int64_t kv_bytes_per_element) {
  return {c.dim(), c.num_layers, c.mlp_hidden(), kv_bytes_per_element};
}

}  // namespace flowkv::qwen

namespace flowkv {

namespace families {

namespace {

constexpr const char* kName = "qwen21";
constexpr const char* kClass = "QwenImage21Transformer2DModel";

std::string describe(const qwen::Config21& c) {
  return "Qwen-Image-2.1 (" + std::to_string(c.num_layers) + " blocks, width " +
         std::to_string(c.dim()) +
         (c.causal_condition ? ", causal_condition" : ", no causal_condition") + ")";
}

// Text after the condition images (each a run of 2x2-latent slots), target last.
KVPrediction predict_of(const qwen::Config21& c, const std::string& name, int64_t text,
                        const std::vector<int64_t>& conds, int64_t target, int steps, bool cfg,
                        int64_t kv_bytes) {
  FLOWKV_CHECK(steps >= 1 && text >= 0 && target > 0,
               "steps and the target's tokens must be positive, text tokens non-negative");
  pipeline::check_request_limits({.steps = steps,
                                  .images = static_cast<int64_t>(conds.size()),
                                  .tokens = pipeline::sum_tokens(text, conds, target)});
  std::vector<uint8_t> slots;
  std::vector<qwen::Grid> grids;
  for (int64_t n : conds) {
    FLOWKV_CHECK(n % 4 == 0, "a condition image needs a multiple of 4 latent tokens");
    slots.insert(slots.end(), static_cast<size_t>(n / 4), 1);
    grids.push_back({n / 4, 4});
  }
  slots.insert(slots.end(), static_cast<size_t>(text), 0);
  FLOWKV_CHECK(target % 4 == 0, "the target needs a multiple of 4 latent tokens");
  const qwen::Layout21 l = qwen::build_layout21(static_cast<int64_t>(slots.size()), slots.data(),
                                                grids, {target / 4, 4});
  const TokenLayout layout = qwen::token_layout21(l, c.causal_condition);
  const CachePlan plan = plan_cache(layout, true, false);
  return prediction(name, qwen::cost_shape(c, kv_bytes), layout, plan, steps, cfg);
}

qwen::LoadOptions21 options21(const std::string& dtype) {
  const flux2::LoadOptions f = parse_dtype_option(dtype);
  qwen::LoadOptions21 o;
  o.auto_dtype = f.auto_dtype;
  o.compute = f.compute;
  o.int8 = f.int8;
  return o;
}

void need(const Tensor& t, int ndim, const std::string& what) {
  FLOWKV_CHECK(t.defined() && t.ndim() == ndim && t.dtype() == DType::kF32, what,
               " must be an F32 ", ndim, "-D tensor",
               t.defined() ? ", got " + shape_str(t.shape()) : "");
}

// The call's shapes against the model; returns the batch.
int64_t check_call(const Qwen21Call& call, const qwen::Config21& c) {
  need(call.img, 3, "img");
  need(call.txt, 3, "txt");
  need(call.timestep, 1, "timestep");
  const int64_t b = call.img.dim(0), l = call.txt.dim(1);
  const int64_t n = pipeline::grid_tokens(call.height, call.width, "the target grid");
  FLOWKV_CHECK(call.img.dim(1) == n && call.img.dim(2) == c.in_channels, "img is ",
               shape_str(call.img.shape()), "; expected [B, ", call.height, "*", call.width, ", ",
               c.in_channels, "]");
  FLOWKV_CHECK(call.txt.dim(0) == b && call.txt.dim(2) == c.context_in_dim, "txt is ",
               shape_str(call.txt.shape()), "; expected [", b, ", L, ", c.context_in_dim, "]");
  FLOWKV_CHECK(call.txt_slots.empty() || static_cast<int64_t>(call.txt_slots.size()) == l,
               "txt_slots has ", call.txt_slots.size(), " entries for ", l, " txt rows");
  if (call.txt_mask.defined()) {
    FLOWKV_CHECK(
        call.txt_mask.ndim() == 2 && call.txt_mask.dim(0) == b && call.txt_mask.dim(1) == l,
        "txt_mask is ", shape_str(call.txt_mask.shape()), "; expected [", b, ", ", l, "]");
  }
  for (size_t i = 0; i < call.conditions.size(); ++i) {
    const ReferenceLatents& cond = call.conditions[i];
    const std::string what = "conditions[" + std::to_string(i) + "]";
    need(cond.latents, 3, what);
    const int64_t tokens = pipeline::grid_tokens(cond.height, cond.width, what + "'s grid");
    FLOWKV_CHECK(cond.latents.dim(0) == b && cond.latents.dim(1) == tokens &&
                     cond.latents.dim(2) == c.in_channels,
                 what, " is ", shape_str(cond.latents.shape()), "; expected [", b, ", ",
                 cond.height, "*", cond.width, ", ", c.in_channels, "]");
  }
  FLOWKV_CHECK(call.timestep.dim(0) == b, "timestep has ", call.timestep.dim(0),
               " values for a batch of ", b);
  return b;
}

// The sequence as segments: [text, conditions..., target], the prefix computed (no cache).
qwen::Args21 args_of(const Qwen21Call& call, const qwen::Model21& m,
                     const std::vector<uint8_t>& valid) {
  qwen::Args21 a;
  a.batch = call.img.dim(0);
  const SegmentTime prefix_time = m.prefix_time();
  a.segments.push_back({.kind = SegmentKind::kText,
                        .name = "text",
                        .rows = call.txt.f32(),
                        .tokens = call.txt.dim(1),
                        .slots = call.txt_slots.empty() ? nullptr : call.txt_slots.data(),
                        .valid = valid.empty() ? nullptr : valid.data(),
                        .time = prefix_time});
  for (size_t i = 0; i < call.conditions.size(); ++i) {
    const ReferenceLatents& cond = call.conditions[i];
    a.segments.push_back({.kind = SegmentKind::kReference,
                          .name = "condition " + std::to_string(i + 1),
                          .rows = cond.latents.f32(),
                          .tokens = cond.latents.dim(1),
                          .grid = {cond.height, cond.width},
                          .time = prefix_time});
  }
  a.segments.push_back({.kind = SegmentKind::kTarget,
                        .name = "target",
                        .rows = call.img.f32(),
                        .tokens = call.img.dim(1),
                        .grid = {call.height, call.width}});
  a.timestep = call.timestep.f32();
  return a;
}

// The family's model: the loaded transformer, shared with any QwenImage21Transformer handle over
// it.
class Qwen21Model final : public FamilyModel {
 public:
  explicit Qwen21Model(std::shared_ptr<const Qwen21Impl> t) : t_(std::move(t)) {}
  std::string variant() const override { return t_->variant; }
  std::string config_json() const override { return model().config().to_json().dump(2); }
  std::string compute_dtype() const override { return qwen21_compute_dtype(*t_); }
  int64_t in_channels() const override { return model().config().in_channels; }
  int64_t text_channels() const override { return model().config().context_in_dim; }
  cache::Topology topology() const override { return qwen21_topology(model()); }
  std::unique_ptr<pipeline::DenoiseAdapter> adapter(const DenoiseInputs& in,
                                                    const DenoiseOptions& opts) const override {
    return qwen21_adapter(model(), in, opts);
  }
  Tensor forward(const DenoiseInputs& in, const ForwardOptions& opts, ForwardProfile* profile,
                 Workspace* ws) const override {
    FLOWKV_CHECK(in.noise.defined() && in.noise.ndim() == 3, "noise must be a [B, h*w, ",
                 in_channels(), "] tensor");
    Qwen21Call c;
    c.img = in.noise;
    c.height = in.height, c.width = in.width;
    c.txt = in.prompt.embeds;
    c.txt_slots = in.prompt.slots;
    c.txt_mask = in.prompt.mask;
    c.conditions = in.references;
    c.timestep = Tensor::from_vector(
        std::vector<float>(static_cast<size_t>(in.noise.dim(0)), opts.sigma), {in.noise.dim(0)});
    c.check_finite = opts.check_finite;
    return qwen21_forward(*t_, c, profile, ws);
  }
  DenoiseInputs example_inputs(const ExampleShape& s) const override;
  KVPrediction predict(int64_t text, const std::vector<int64_t>& conds, int64_t target, int steps,
                       bool cfg) const override {
    return predict_of(model().config(), t_->variant, text, conds, target, steps, cfg,
                      dtype_size(model().kv_dtype()));
  }

 private:
  const qwen::Model21& model() const { return t_->model; }
  std::shared_ptr<const Qwen21Impl> t_;
};

// The prompt rows hold the condition images' slots (an h x w image is h*w/4 slots) before the
// text rows; the negative prompt has the same layout, so CFG can batch both branches.
DenoiseInputs Qwen21Model::example_inputs(const ExampleShape& s) const {
  auto check = [](int64_t tokens) {
    FLOWKV_CHECK(tokens % 4 == 0,
                 "Qwen-Image-2.1 grids need a multiple of 4 tokens (2x2 per slot), got ", tokens);
  };
  check(s.height * s.width);
  std::vector<uint8_t> slots;
  for (const auto& [h, w] : s.references) {
    check(h * w);
    slots.insert(slots.end(), static_cast<size_t>(h * w / 4), 1);
  }
  slots.insert(slots.end(), static_cast<size_t>(s.text_tokens), 0);
  const int64_t rows = static_cast<int64_t>(slots.size());
  DenoiseInputs in;
  in.prompt = {example_tensor({s.batch, rows, text_channels()}, s.seed + 1), slots, {}};
  if (s.cfg) {
    in.negative = {example_tensor({s.batch, rows, text_channels()}, s.seed + 3), slots, {}};
    in.cfg_scale = 4.0f;
  }
  example_latents(in, s, in_channels());
  return in;
}

// The released Qwen-Image-2.1 shapes, one row each: predict, export, the cacheability report and
// the generate defaults read this table.
struct Released {
  const char* name;
  bool causal_condition;       // the block-causal prefix it is trained under
  const char* pipeline_class;  // the diffusers pipeline it is released with
  int default_steps;           // that pipeline's __call__ num_inference_steps
};
constexpr Released kReleased[] = {
    {"qwen-image-2.1", true, "QwenImage21Pipeline", 40},
    {"qwen-image-2.1-no-causal", false, "QwenImage21Pipeline", 40},
};

// A released shape, a built-in model, or the config of a config.json / checkpoint (inferred from
// its shapes when it has none).
qwen::Config21 config_of_model(const std::string& model, std::string* name) {
  for (const Released& r : kReleased) {
    if (model != r.name) continue;
    qwen::Config21 c;  // the class defaults are the released transformer
    c.causal_condition = r.causal_condition;
    *name = describe(c) + ", as released";
    return c;
  }
  qwen::Config21 c;
  if (qwen::builtin_config21(model, &c)) {
    *name = "built-in '" + model + "' (" + describe(c) + ")";
    return c;
  }
  const std::optional<Json> j = config_of(model);
  c = j ? qwen::Config21::from_json(*j, model) : qwen::config21_of(scan_checkpoint(model));
  *name = describe(c);
  return c;
}

// Condition images first, each reading what precedes it and itself; the text after them,
// causal; the target reads everything. Under causal_condition the prefix is modulated from
// t = 0.
std::optional<TokenLayout> layout_of(const std::string& model, int64_t text,
                                     const std::vector<int64_t>& conds, int64_t target) {
  std::string name;
  const bool causal = config_of_model(model, &name).causal_condition;
  const int k = static_cast<int>(conds.size());
  TokenLayout l;
  std::vector<int> before;
  for (int i = 0; i < k; ++i) {
    Segment s{"condition " + std::to_string(i + 1),
              SegmentKind::kReference,
              conds[static_cast<size_t>(i)],
              true,
              causal,
              0,
              before};
    s.reads.push_back(i);
    before.push_back(i);
    l.segments.push_back(s);
  }
  Segment t{"text", SegmentKind::kText, text, true, causal, 0, before};
  t.reads.push_back(k);
  t.causal = true;
  before.push_back(k);
  l.segments.push_back(t);
  Segment g{"target", SegmentKind::kTarget, target, false, false, 0, before};
  g.reads.push_back(k + 1);
  l.segments.push_back(g);
  return l;
}

void inspect_files(const CheckpointScan& scan, InspectReport& r) {
  r.family = "Qwen-Image-2.1";
  try {
    const qwen::Config21 c = qwen::config21_of(scan, &r.config_inferred);
    r.config_json = c.to_json().dump();
    r.variant =
        "Qwen-Image-2.1 (" + std::to_string(c.num_layers) + " blocks, width " +
        std::to_string(c.dim()) + "); exact prefix cache " +
        (c.causal_condition ? "available (causal_condition)" : "unavailable (no causal_condition)");
    // Not a problem of the files, but an assumption the user should see.
    if (r.config_inferred) {
      r.variant +=
          " [no config: causal_condition assumed true, as released; put a config.json "
          "beside the weights if it was trained without]";
    }
    for (const std::string& p : check_against_table(scan.tensors, qwen::weight_table(c)))
      r.problems.push_back(p);
  } catch (const Error& e) {
    r.problems.push_back(e.what());
    r.variant = "Qwen-Image-2.1 of an unknown configuration";
  }
}

void write_builtin(const std::string& name, uint64_t seed, const std::string& dtype,
                   const std::string& dir) {
  qwen::Config21 c;
  FLOWKV_CHECK(qwen::builtin_config21(name, &c), "no built-in Qwen-Image-2.1 model '", name, "'");
  const auto weights = qwen::random_weights21(c, seed, parse_dtype_option(dtype).compute);
  std::vector<TensorToWrite> list;
  for (const ExpectedTensor& e : qwen::weight_table(c)) {
    const Tensor& t = weights.at(e.name);
    list.push_back({e.name, t.dtype(), t.shape(), t.raw()});
  }
  write_diffusers_folder(dir, c.to_json(), list);
}

FamilyInfo info() {
  FamilyInfo i;
  i.name = kName;
  i.title = "Qwen-Image-2.1";
  i.exact_cache = "prefix (text + condition images)";
  i.images = "condition image";
  i.builtins = qwen::builtin_names21();
  i.default_builtin = "qwen21-small";
  for (const Released& r : kReleased) i.released.push_back(r.name);
  i.default_steps = kReleased[0].default_steps;
  i.bench_steps = {4, 8};
  i.bench_images = {0, 1, 2};
  i.true_cfg = true;
  i.grid_multiple = 4;
  return i;
}

std::shared_ptr<const FamilyModel> wrap(std::shared_ptr<const Qwen21Impl> t) {
  return std::make_shared<Qwen21Model>(std::move(t));
}

}  // namespace

std::shared_ptr<const Qwen21Impl> load_qwen21(const std::string& path, const std::string& dtype) {
  auto impl = std::make_shared<Qwen21Impl>();
  const qwen::LoadOptions21 o = options21(dtype);
  impl->model = qwen::Model21::load(path, o);
  impl->int8 = o.int8;
  impl->variant = describe(impl->model.config());
  return impl;
}

std::shared_ptr<const Qwen21Impl> builtin_qwen21(const std::string& name, uint64_t seed,
                                                 const std::string& dtype) {
  qwen::Config21 c;
  FLOWKV_CHECK(qwen::builtin_config21(name, &c), "no built-in Qwen-Image-2.1 model '", name,
               "' (choose qwen21-tiny or qwen21-small)");
  const qwen::LoadOptions21 o = options21(dtype);
  const DType store = !o.auto_dtype && o.compute == DType::kBF16 ? DType::kBF16 : DType::kF32;
  auto impl = std::make_shared<Qwen21Impl>();
  impl->model = qwen::Model21::from_tensors(qwen::random_weights21(c, seed, store), c, o);
  impl->int8 = o.int8;
  impl->variant = "built-in '" + name + "' (" + describe(c) + ", random weights)";
  return impl;
}

std::string qwen21_compute_dtype(const Qwen21Impl& t) {
  return t.int8 ? "INT8" : std::string(dtype_name(t.model.compute_dtype()));
}

Tensor qwen21_forward(const Qwen21Impl& impl, const Qwen21Call& call, ForwardProfile* profile,
                      Workspace* ws) {
  const qwen::Model21& m = impl.model;
  const qwen::Config21& c = m.config();
  const int64_t b = check_call(call, c);
  std::vector<int64_t> images;
  for (const ReferenceLatents& cond : call.conditions) images.push_back(cond.latents.dim(1));
  pipeline::RequestSize size{
      .batch = b,
      .images = static_cast<int64_t>(images.size()),
      // Each slot row stands for 4 tokens: the text rows bound the sequence from below.
      .tokens = pipeline::sum_tokens(call.txt.dim(1), images, call.img.dim(1))};
  pipeline::check_request_limits(size);
  pipeline::check_request_memory(qwen::cost_shape(c, 2), size);
  std::vector<uint8_t> valid;
  if (call.txt_mask.defined()) {
    const Tensor f = call.txt_mask.to_f32();
    for (int64_t i = 0; i < f.numel(); ++i) valid.push_back(f.f32()[i] != 0);
  }
  Tensor out = Tensor::empty({b, call.img.dim(1), c.out_features()});
  qwen::Args21 a = args_of(call, m, valid);
  a.out = out.f32();
  ForwardRun run(ws, call.check_finite, profile);
  run.input("img", call.img);
  run.input("txt", call.txt);
  run.input("timestep", call.timestep);
  for (size_t i = 0; i < call.conditions.size(); ++i)
    run.input("conditions[" + std::to_string(i) + "]", call.conditions[i].latents);
  m.forward(run.context(), a);
  run.finish(out);
  return out;
}

LoadedTransformer qwen21_loaded(std::shared_ptr<const Qwen21Impl> t) {
  return {&by_name(kName), wrap(std::move(t)), ""};
}

int qwen21_pipeline_default_steps(const std::string& pipeline_class) {
  for (const Released& r : kReleased) {
    if (pipeline_class == r.pipeline_class) return r.default_steps;
  }
  fail("no Qwen-Image-2.1 pipeline class \"", pipeline_class, "\"");
}

cache::Topology qwen21_topology(const qwen::Model21& m) {
  cache::Topology t = m.topology();
  t.tables = flux1_tables();
  return t;
}

Family qwen21_family() {
  Family f;
  f.info = info();
  f.detects = [](const Json& j) { return qwen::class_name(j) == kClass; };
  f.detects_tensors = [](const CheckpointScan& scan) { return qwen::holds_qwen21(scan.tensors); };
  f.has_builtin = [](const std::string& name) {
    qwen::Config21 c;
    return qwen::builtin_config21(name, &c);
  };
  f.load = [](const std::string& path, const std::string& dtype) {
    return wrap(load_qwen21(path, dtype));
  };
  f.builtin = [](const std::string& name, uint64_t seed, const std::string& dtype) {
    return wrap(builtin_qwen21(name, seed, dtype));
  };
  f.write_builtin = write_builtin;
  f.write_zeros = [](const std::string& name, const std::string& dtype, const std::string& dir) {
    if (name.ends_with("-pipeline")) {  // a whole pipeline folder
      std::string described;
      const qwen::Config21 c = config_of_model(name.substr(0, name.size() - 9), &described);
      return qwen21_write_zero_pipeline(c, parse_dtype_option(dtype).compute, dir);
    }
    std::string described;
    const qwen::Config21 c = config_of_model(name, &described);
    write_zero_folder(dir, c.to_json(), qwen::weight_table(c), parse_dtype_option(dtype).compute);
  };
  f.inspect = inspect_files;
  f.predict_shape = [](const PredictRequest& r) {
    std::string name;
    const qwen::Config21 c = config_of_model(r.model, &name);
    return predict_of(c, name, r.text_tokens, r.ref_tokens, r.target_tokens, r.steps, r.cfg,
                      r.kv_bytes_per_element);
  };
  f.layout = layout_of;
  f.tables = flux1_tables();
  f.runs_pipeline = [](const std::string& pipeline_class) {
    for (const Released& r : kReleased) {
      if (pipeline_class == r.pipeline_class) return true;
    }
    return false;
  };
  f.open_pipeline = qwen21_open_pipeline;
  return f;
}

}  // namespace families

}  // namespace flowkv
