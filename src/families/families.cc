// The one list of families, and finding a family by name, config, files or model name.
#include <algorithm>
#include <filesystem>

#include "families/adapters.h"
#include "families/family.h"
#include "families/forward_run.h"
#include "flowkv/error.h"
#include "io/mapped_file.h"
#include "pipeline/denoise.h"
#include "pipeline/request_limits.h"

namespace flowkv::families {

const std::vector<Family>& registry() {
  // The order families are listed and asked in (their config class names never overlap).
  static const std::vector<Family> r = {flux2_family(), qwen_image_family(), qwen21_family(),
                                        nucleus_family()};
  return r;
}

namespace {

bool contains(const std::vector<std::string>& v, const std::string& s) {
  return std::find(v.begin(), v.end(), s) != v.end();
}

std::string joined(const std::function<void(const Family&, std::vector<std::string>&)>& pick) {
  std::vector<std::string> all;
  for (const Family& f : registry()) pick(f, all);
  std::string s;
  for (const std::string& x : all) s += (s.empty() ? "" : ", ") + x;
  return s;
}

bool has_class_name(const Json& config) {
  return config.is_object() && config.contains("_class_name") && config["_class_name"].is_string();
}

}  // namespace

const Family& by_name(const std::string& name) {
  for (const Family& f : registry()) {
    if (f.info.name == name || contains(f.info.aliases, name)) return f;
  }
  fail("unknown model family '", name, "' (known: ", joined([](const Family& f, auto& v) {
         v.push_back(f.info.name);
         v.insert(v.end(), f.info.aliases.begin(), f.info.aliases.end());
       }),
       ")");
}

const Family* for_config(const Json& config) {
  for (const Family& f : registry()) {
    if (f.detects(config)) return &f;
  }
  return nullptr;
}

const Family* for_scan(const CheckpointScan& scan) {
  if (scan.config && has_class_name(*scan.config)) return for_config(*scan.config);
  for (const Family& f : registry()) {
    if (f.detects_tensors && f.detects_tensors(scan)) return &f;
  }
  return nullptr;
}

std::optional<Json> config_of(const std::string& path) {
  if (path.empty() || !path_exists(path)) return std::nullopt;
  if (path_kind(path) == PathKind::kFile) {
    if (path.size() > 5 && path.substr(path.size() - 5) == ".json") return read_json_file(path);
    return std::nullopt;
  }
  for (const char* sub : {"config.json", "transformer/config.json"}) {
    const std::string p = (std::filesystem::path(path) / sub).string();
    if (path_exists(p)) return read_json_file(p);
  }
  return std::nullopt;
}

const Family& resolve(const std::string& model) {
  for (const Family& f : registry()) {
    if (f.has_builtin(model) || contains(f.info.released, model)) return f;
  }
  FLOWKV_CHECK(path_exists(model), "unknown model '", model, "': give a built-in model (",
               joined([](const Family& f, auto& v) {
                 v.insert(v.end(), f.info.builtins.begin(), f.info.builtins.end());
               }),
               "), a released shape (", joined([](const Family& f, auto& v) {
                 v.insert(v.end(), f.info.released.begin(), f.info.released.end());
               }),
               "), a config.json, or a checkpoint folder or file");
  const std::optional<Json> config = config_of(model);
  const Family* f = nullptr;
  if (config && has_class_name(*config)) {
    f = for_config(*config);
  } else if (!(path_kind(model) == PathKind::kFile && config)) {
    f = for_scan(scan_checkpoint(model));  // no _class_name: the tensors tell
  }
  if (!f) {
    const std::string cls = config && has_class_name(*config)
                                ? "\"" + (*config)["_class_name"].get<std::string>() + "\""
                                : "no _class_name";
    fail(model, ": not a transformer flowkv knows (", cls, "); it runs ",
         joined([](const Family& f, auto& v) { v.push_back(f.info.title); }));
  }
  return *f;
}

namespace {

// MeanCache's schedules as UnicomAI/MeanCache publishes them (main() of Mc_qwenimage.py,
// Mc_qwenimage_2512.py and MC_zimage.py at 2e12280; 50 steps): "meancache.schedule.NAME" lists
// the steps that run the model, "meancache.spans.NAME" the JVP span of the steps skipped after
// each (the reference's edge_source: chain 0, v_diff_mean 1, v_diff_mean_jvp1_sK K). Searched
// on Qwen-Image, Qwen-Image-2512 and Z-Image, not on FLUX.2 or Qwen-Image-2.1: a user names
// them (meancache:schedule=qwen-image-b10), nothing picks them by default.
void add_meancache_reference_schedules(Tables& t) {
  const Tables schedules = {
      {"meancache.schedule.qwen-image-b25",
       {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 24, 32, 40, 43, 45, 47, 48, 49}},
      {"meancache.spans.qwen-image-b25",
       {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 5, 5, 5, 0, 0}},
      {"meancache.schedule.qwen-image-b17",
       {0, 1, 2, 3, 4, 5, 6, 7, 8, 10, 17, 24, 31, 38, 45, 48, 49}},
      {"meancache.spans.qwen-image-b17", {0, 0, 0, 0, 0, 0, 0, 0, 2, 1, 1, 1, 1, 1, 4, 0}},
      {"meancache.schedule.qwen-image-b10", {0, 1, 3, 7, 14, 21, 28, 35, 42, 49}},
      {"meancache.spans.qwen-image-b10", {0, 2, 1, 1, 1, 1, 1, 1, 4}},
      {"meancache.schedule.qwen-image-2512-b25",
       {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 23, 31, 37, 44, 45, 46, 47, 48, 49}},
      {"meancache.spans.qwen-image-2512-b25",
       {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2, 2, 2, 1, 1, 1, 5, 5, 0}},
      {"meancache.schedule.qwen-image-2512-b17",
       {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 11, 19, 27, 35, 43, 47, 49}},
      {"meancache.spans.qwen-image-2512-b17", {0, 0, 0, 0, 0, 0, 0, 0, 0, 2, 1, 1, 1, 1, 5, 5}},
      {"meancache.schedule.qwen-image-2512-b10", {0, 2, 4, 7, 14, 21, 28, 35, 42, 49}},
      {"meancache.spans.qwen-image-2512-b10", {1, 3, 1, 1, 1, 1, 1, 1, 4}},
      {"meancache.schedule.z-image-b25", {0,  1,  2,  3,  4,  5,  6,  8,  10, 11, 12, 13, 15,
                                          16, 17, 18, 20, 22, 29, 37, 42, 45, 47, 48, 49}},
      {"meancache.spans.z-image-b25",
       {0, 0, 0, 0, 0, 0, 2, 2, 0, 0, 0, 2, 0, 0, 0, 5, 5, 1, 1, 1, 5, 5, 0, 0}},
      {"meancache.schedule.z-image-b20",
       {0, 1, 2, 3, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 30, 38, 43, 46, 48, 49}},
      {"meancache.spans.z-image-b20", {0, 0, 0, 0, 2, 2, 2, 2, 2, 5, 4, 5, 5, 1, 1, 1, 5, 2, 0}},
      {"meancache.schedule.z-image-b17",
       {0, 1, 2, 3, 4, 6, 8, 10, 12, 14, 19, 27, 35, 43, 46, 48, 49}},
      {"meancache.spans.z-image-b17", {0, 0, 0, 0, 2, 2, 2, 2, 2, 1, 1, 1, 1, 5, 2, 0}},
      {"meancache.schedule.z-image-b15", {0, 1, 2, 3, 5, 7, 10, 12, 17, 25, 33, 41, 45, 48, 49}},
      {"meancache.spans.z-image-b15", {0, 0, 0, 2, 2, 2, 2, 1, 1, 1, 1, 5, 4, 0}},
      {"meancache.schedule.z-image-b13", {0, 1, 2, 3, 5, 9, 15, 22, 29, 36, 43, 47, 49}},
      {"meancache.spans.z-image-b13", {0, 0, 0, 2, 1, 1, 1, 1, 1, 1, 5, 2}},
  };
  t.insert(schedules.begin(), schedules.end());
}

}  // namespace

Tables flux1_tables() {
  // TeaCache's rescaling polynomial, highest power first: only FLUX.1's is calibrated
  // (TeaCache4FLUX); FLUX.2 and Qwen-Image-2.1 use it too until someone fits theirs
  // (ComfyUI-TeaCache and vLLM-omni do the same for Qwen-Image). Override with
  // teacache:coefficients=a/b/c/d/e.
  // MagCache's ratios=flux1: diffusers' FLUX_MAG_RATIOS, measured on FLUX.1 at 28 steps. Not a
  // default ("magcache.ratios"): they were not measured on these models, so a user names them.
  Tables t = {
      {"teacache.coefficients", {498.651651, -283.781631, 55.8554382, -3.82021401, 0.264230861}},
      {"magcache.ratios.flux1",
       {1.0,     1.21094, 1.11719, 1.07812, 1.0625,  1.03906, 1.03125, 1.03906, 1.02344, 1.03125,
        1.02344, 0.98047, 1.01562, 1.00781, 1.0,     1.00781, 1.0,     1.00781, 1.0,     1.0,
        0.99609, 0.99609, 0.98047, 0.98828, 0.96484, 0.95703, 0.93359, 0.89062}}};
  add_meancache_reference_schedules(t);
  return t;
}

void example_latents(DenoiseInputs& in, const ExampleShape& s, int64_t channels) {
  in.noise = example_tensor({s.batch, s.height * s.width, channels}, s.seed + 2);
  in.height = s.height, in.width = s.width;
  for (size_t i = 0; i < s.references.size(); ++i) {
    const auto [h, w] = s.references[i];
    in.references.push_back({example_tensor({s.batch, h * w, channels}, s.seed + 10 + i), h, w});
  }
}

std::vector<ImageGrid> check_latents(const DenoiseInputs& in, int64_t channels,
                                     const std::string& images) {
  FLOWKV_CHECK(in.noise.defined() && in.noise.ndim() == 3 && in.noise.dtype() == DType::kF32 &&
                   in.noise.dim(2) == channels &&
                   in.noise.dim(1) == pipeline::grid_tokens(in.height, in.width, "the target grid"),
               "noise must be F32 [B, ", in.height, "*", in.width, ", ", channels, "]");
  const int64_t B = in.noise.dim(0);
  std::vector<ImageGrid> grids;
  for (const ReferenceLatents& ref : in.references) {
    FLOWKV_CHECK(ref.latents.defined() && ref.latents.ndim() == 3 &&
                     ref.latents.dtype() == DType::kF32 && ref.latents.dim(0) == B &&
                     ref.latents.dim(1) ==
                         pipeline::grid_tokens(ref.height, ref.width, "a " + images + " grid") &&
                     ref.latents.dim(2) == channels,
                 images, " latents must be F32 [", B, ", h*w, ", channels, "]");
    grids.push_back({ref.height, ref.width});
  }
  return grids;
}

Json qwen_scheduler_json() {
  return {{"_class_name", "FlowMatchEulerDiscreteScheduler"},
          {"num_train_timesteps", 1000},
          {"shift", 1.0},
          {"use_dynamic_shifting", true},
          {"base_shift", 0.5},
          {"max_shift", 0.9},
          {"base_image_seq_len", 256},
          {"max_image_seq_len", 8192},
          {"shift_terminal", 0.02},
          {"time_shift_type", "exponential"}};
}

Tensor example_tensor(Shape shape, uint64_t seed) {
  Tensor t = Tensor::empty(std::move(shape));
  uint64_t s = seed * 0x9e3779b97f4a7c15ull + 0x632be59bd9b4e019ull;
  for (int64_t i = 0; i < t.numel(); ++i) {  // xorshift: inputs only need to be varied and fixed
    s ^= s << 13, s ^= s >> 7, s ^= s << 17;
    t.f32()[i] = static_cast<float>(static_cast<double>(s >> 11) * 0x1.0p-52 - 1.0);
  }
  return t;
}

KVPrediction prediction(const std::string& model, const cost::ModelShape& shape,
                        const TokenLayout& layout, const CachePlan& plan, int steps, bool cfg) {
  const std::vector<bool> none(layout.segments.size(), false);
  const cost::StepCost u = cost::step_cost(shape, layout, none);
  const cost::StepCost k = cost::step_cost(shape, layout, plan.cached);
  KVPrediction p;
  p.model = model;
  p.width = shape.width;
  p.layers = shape.layers;
  p.steps = steps;
  p.branches = cfg ? 2 : 1;
  p.kv_bytes_per_element = static_cast<int>(shape.kv_bytes_per_element);
  int64_t cached_tokens = 0;
  for (size_t i = 0; i < layout.segments.size(); ++i) {
    SegmentFlops s;
    s.name = layout.segments[i].name;
    s.tokens = layout.segments[i].tokens;
    s.cached = plan.cached[i];
    s.uncached_flops = p.branches * (u.segments[i].linear + u.segments[i].attention);
    s.cached_flops = p.branches * (k.segments[i].linear + k.segments[i].attention);
    if (s.cached) cached_tokens += s.tokens;
    p.segments.push_back(s);
  }
  p.uncached_step_flops = p.branches * u.total();
  p.cached_step_flops = p.branches * k.total();
  p.speedup = cost::predicted_speedup(u.total(), k.total(), steps);
  p.kv_bytes = cost::kv_payload_bytes(shape, cached_tokens, p.branches);
  int64_t tokens = 0;
  for (const auto& seg : layout.segments) tokens += seg.tokens;
  p.activation_bytes = cost::activation_bytes(shape, p.branches, tokens);
  return p;
}

TokenLayout joint_layout(int64_t text, const std::vector<int64_t>& images, int64_t target) {
  const int k = static_cast<int>(images.size());
  std::vector<int> all;
  for (int i = 0; i < k + 2; ++i) all.push_back(i);
  TokenLayout l;
  l.segments.push_back({"text", SegmentKind::kText, text, true, false, 0, all});
  for (int i = 0; i < k; ++i) {
    l.segments.push_back({"ref " + std::to_string(i + 1), SegmentKind::kReference,
                          images[static_cast<size_t>(i)], true, false, 0, all});
  }
  l.segments.push_back({"target", SegmentKind::kTarget, target, false, false, 0, all});
  return l;
}

PromptRows prompt_rows(const PromptEmbeds& p, int64_t batch, int64_t width) {
  FLOWKV_CHECK(p.embeds.defined() && p.embeds.ndim() == 3 && p.embeds.dtype() == DType::kF32 &&
                   p.embeds.dim(0) == batch && p.embeds.dim(2) == width,
               "prompt embeddings must be F32 [", batch, ", L, ", width, "], got ",
               p.embeds.defined() ? shape_str(p.embeds.shape()) : std::string("none"));
  const int64_t L = p.embeds.dim(1);
  FLOWKV_CHECK(L > 0, "the prompt embeddings have no rows");
  PromptRows out{p.embeds.f32(), L, {}};
  if (p.mask.defined()) {
    FLOWKV_CHECK(p.mask.numel() == batch * L, "prompt mask has ", p.mask.numel(), " values for ",
                 batch, " x ", L, " rows");
    const Tensor f = p.mask.to_f32();
    bool all = true;
    for (int64_t i = 0; i < f.numel(); ++i) {
      out.valid.push_back(f.f32()[i] != 0);
      all = all && out.valid.back();
    }
    if (all) out.valid.clear();  // the pipelines pass no mask when every row is valid
  }
  return out;
}

StackedPrompts stack_prompts(const std::vector<const PromptRows*>& prompts, int64_t batch,
                             int64_t width) {
  StackedPrompts s;
  bool any_mask = false;
  for (const PromptRows* p : prompts) {
    FLOWKV_CHECK(p->len == prompts.front()->len, "stacked prompts must have one length");
    any_mask |= !p->valid.empty();
  }
  for (const PromptRows* p : prompts) {
    s.text.insert(s.text.end(), p->text, p->text + batch * p->len * width);
    if (!any_mask) continue;
    if (!p->valid.empty())
      s.valid.insert(s.valid.end(), p->valid.begin(), p->valid.end());
    else
      s.valid.insert(s.valid.end(), static_cast<size_t>(batch * p->len), 1);
  }
  return s;
}

Tensor adapter_forward(pipeline::DenoiseAdapter& a, const DenoiseInputs& in,
                       const ForwardOptions& opts, ForwardProfile* profile, Workspace* ws,
                       float sign) {
  a.validate();
  a.prepare(true);
  ForwardRun run(ws, opts.check_finite, profile);
  run.input("noise", in.noise);
  run.input("prompt", in.prompt.embeds);
  const pipeline::StepCall call{
      .step = 0, .steps = 1, .timestep = opts.sigma, .latents = in.noise.f32()};
  a.forward(run.context(), 0, call);
  const int64_t n = a.batch() * a.tokens() * a.channels();
  Tensor out = Tensor::empty({a.batch(), a.tokens(), a.channels()});
  for (int64_t i = 0; i < n; ++i) out.f32()[i] = sign * a.velocity(0)[i];
  run.finish(out);
  return out;
}

}  // namespace flowkv::families
