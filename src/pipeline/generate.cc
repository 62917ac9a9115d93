#include "pipeline/generate.h"

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <optional>

#include "flowkv/error.h"
#include "flowkv/limits.h"
#include "pipeline/denoise_stage.h"
#include "pipeline/identity.h"
#include "pipeline/request_store.h"
#include "sched/scheduler_config.h"

namespace flowkv::pipeline {

std::string size_str(int64_t w, int64_t h) {
  return std::to_string(w) + "x" + std::to_string(h);
}

std::string cfg_parameters(const Plan& p) {
  char scale[32];
  std::snprintf(scale, sizeof scale, "%g", static_cast<double>(p.request.cfg_scale));
  return std::string(", CFG scale: ") + (p.cfg ? scale : "off");
}

// --- components

std::shared_ptr<const void> ComponentStore::load_counted(
    const std::function<std::shared_ptr<const void>()>& load) {
  const auto t = std::chrono::steady_clock::now();
  std::shared_ptr<const void> v = load();
  load_micros_ +=
      std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - t)
          .count();
  ++loads_;
  return v;
}

std::shared_ptr<const void> ComponentStore::get(
    const std::string& name, const std::function<std::shared_ptr<const void>()>& load) {
  Slot* slot;
  {
    const std::lock_guard<std::mutex> g(m_);
    std::unique_ptr<Slot>& s = slots_[name];
    if (!s) s = std::make_unique<Slot>();
    slot = s.get();  // slots are never erased: the pointer stays valid
  }
  // One load per component: a second request waits for the first's load instead of loading
  // its own copy. A load that throws leaves the slot empty (the next request tries again).
  const std::lock_guard<std::mutex> g(slot->m);
  if (!slot->value) slot->value = load_counted(load);
  return slot->value;
}

void ComponentStore::release() {
  const std::lock_guard<std::mutex> g(m_);
  for (auto& [name, slot] : slots_) {
    const std::lock_guard<std::mutex> sg(slot->m);
    slot->value.reset();  // requests still running keep their own references
  }
}

PipelineStats ComponentStore::stats() const {
  PipelineStats s;
  s.component_loads = loads_;
  s.load_seconds = static_cast<double>(load_micros_) / 1e6;
  s.requests = requests_;
  const std::lock_guard<std::mutex> g(m_);
  for (const auto& [name, slot] : slots_) {
    const std::lock_guard<std::mutex> sg(slot->m);
    s.resident_components += slot->value != nullptr;
  }
  return s;
}

// --- the folder

std::optional<sched::FlowMatchConfig> pipeline_scheduler(const PipelineFolder& folder) {
  const auto it = folder.components.find("scheduler");
  if (it == folder.components.end()) return std::nullopt;
  const PipelineComponent& c = it->second;
  FLOWKV_CHECK(c.class_name == "FlowMatchEulerDiscreteScheduler", folder.path,
               "/model_index.json: scheduler ", c.class_name,
               " is not one flowkv runs (FlowMatchEulerDiscreteScheduler)");
  return sched::read_scheduler_config(c.path);
}

void check_schedule(const Plan& p, const std::optional<sched::FlowMatchConfig>& scheduler,
                    const sched::FlowMatchConfig& fallback,
                    const std::function<double(const sched::FlowMatchConfig&)>& mu) {
  const sched::FlowMatchConfig& cfg = scheduler ? *scheduler : fallback;
  const std::vector<double> sigmas = p.sigmas.empty() ? sched::linspace_sigmas(p.steps) : p.sigmas;
  (void)sched::set_timesteps(cfg, sigmas, mu(cfg));
}

// --- prepare

namespace {

Image decode_input(const InputImage& in, const std::string& name, PixelFormat format) {
  if (in.encoded.empty()) {
    const Image& d = in.decoded;
    FLOWKV_CHECK(d.channels == 3 || d.channels == 4, name, ": an image has 3 or 4 channels, not ",
                 d.channels);
    check_image_size(d.width, d.height, name);
    FLOWKV_CHECK(static_cast<int64_t>(d.pixels.size()) == d.width * d.height * d.channels, name,
                 ": ", size_str(d.width, d.height), "x", d.channels, " needs ",
                 d.width * d.height * d.channels, " values, it holds ", d.pixels.size());
    // Converted as decoding a file converts it (PIL's convert("RGB") / convert("RGBA")).
    return format == PixelFormat::kRGBA ? to_rgba(d) : to_rgb(d);
  }
  return decode_image(in.encoded.data(), in.encoded.size(), name, limits::kMaxImagePixels, format);
}

}  // namespace

Plan prepare(const GenerateSpec& spec, const GenerateRequest& request, int default_steps) {
  FLOWKV_CHECK(request.steps >= 0, "steps: ", request.steps,
               " is not a step count (at least 1; 0 or none: the pipeline's default, ",
               default_steps, ")");
  const size_t n = request.references.size() + request.images.size();
  FLOWKV_CHECK(static_cast<int64_t>(n) <= limits::kMaxReferences, n,
               " conditioning images; at most ", limits::kMaxReferences, " are taken");
  FLOWKV_CHECK(request.prompt.find('\0') == std::string::npos &&
                   request.negative_prompt.find('\0') == std::string::npos,
               "the prompt holds a NUL character");
  Plan p;
  p.request = request;
  p.request.images = {};  // decoded below; the plan keeps pixels, not the uploads' bytes
  std::vector<Image> decoded;
  for (const std::string& path : request.references) {
    decoded.push_back(load_image(path, spec.pixel_format()));
    p.names.push_back(path);
  }
  for (size_t i = 0; i < request.images.size(); ++i) {
    const InputImage& in = request.images[i];
    const std::string name =
        in.name.empty() ? "image " + std::to_string(request.references.size() + i + 1) : in.name;
    decoded.push_back(decode_input(in, name, spec.pixel_format()));
    p.names.push_back(name);
  }
  p.steps = request.steps > 0 ? request.steps : default_steps;
  if (p.request.cfg_scale == 0.0f) p.request.cfg_scale = spec.default_cfg_scale();
  spec.plan(p, std::move(decoded));
  FLOWKV_CHECK(p.steps >= 1, "steps: at least 1, got ", p.steps);
  return p;
}

// --- run

namespace {

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

// One prompt branch: from the reference store when it holds these inputs' embeddings by this
// text encoder, else encoded (and kept there). `note` says what it was.
PromptEmbeds encode_branch(const GenerateSpec& spec, RequestStore& rs, const PromptJob& job,
                           std::string* note) {
  *note = job.note;
  // The entry: the embeddings, then the image-slot mask when there is one, then the padding
  // mask when there is one (NucleusMoE-Image pads its prompts to a multiple of 8).
  auto compute = [&]() -> std::vector<Tensor> {
    const PromptEmbeds e = job.encode(note);
    if (e.mask.defined()) return {e.embeds, slots_tensor(e.slots), e.mask};
    if (e.slots.empty()) return {e.embeds};
    return {e.embeds, slots_tensor(e.slots)};
  };
  bool hit = false;
  std::vector<Tensor> t;
  if (rs.active()) {
    store::KeyBuilder key("prompt");
    add_files_identity(key, "text encoder", spec.text_encoder_path());
    job.describe(key);
    t = rs.get(key.finish(), compute, &hit);
  } else {
    t = compute();
  }
  FLOWKV_CHECK(t.size() >= 1 && t.size() <= 3,
               "reference store: a prompt entry holds 1 to 3 tensors");
  if (hit) {
    if (note->empty()) *note = std::to_string(t[0].dim(1)) + " rows";
    *note += ", from the reference store";
  }
  if (t.size() == 3) {
    FLOWKV_CHECK(t[2].dtype() == DType::kF32 && t[2].ndim() == 2 && t[2].dim(0) == t[0].dim(0) &&
                     t[2].dim(1) == t[0].dim(1),
                 "reference store: bad prompt mask");
  }
  return PromptEmbeds{.embeds = t[0],
                      .slots = t.size() >= 2 ? slots_of(t[1]) : std::vector<uint8_t>{},
                      .mask = t.size() == 3 ? t[2] : Tensor{}};
}

std::string parameters_text(const GenerateSpec& spec, const Plan& p, const std::string& path,
                            const std::string& pipeline_class, int64_t w, int64_t h, int steps) {
  const GenerateRequest& r = p.request;
  std::string s = r.prompt;
  if (p.cfg) s += "\nNegative prompt: " + r.negative_prompt;
  s += "\nSteps: " + std::to_string(steps) + ", Sampler: Euler (flow matching)" +
       spec.parameters_after_sampler(p) + ", Seed: " + std::to_string(r.seed) +
       ", Size: " + size_str(w, h) + ", Model: " + std::filesystem::path(path).filename().string() +
       " (" + pipeline_class + ")" + spec.parameters_after_model(p) +
       ", KV cache: " + (r.kv_cache ? "on" : "off");
  for (const std::string& sc : r.step_caches) s += ", Step cache: " + sc;
  return s + ", Generator: flowkv";
}

}  // namespace

GenerateResult run_generate(const GenerateSpec& spec, ComponentStore& store,
                            const std::string& pipeline_path, const std::string& pipeline_class,
                            const Plan& plan, const GenerateProgress& progress,
                            const GenerateControl& control) {
  const GenerateRequest& req = plan.request;
  GenerateResult res;
  res.width = plan.layout.width, res.height = plan.layout.height;
  StageRunner stages(progress, control, res.stages);
  RequestStore rs(control.store);
  Components c(store);
  // Each stage's components are dropped at its end under the staged policy (also when it throws).
  auto staged = [&](const std::string& name, int64_t units, auto&& fn) {
    struct EndStage {
      Components& c;
      ~EndStage() { c.end_stage(); }
    } end{c};
    return stages.run(name, units, fn);
  };

  PromptEmbeds positive, negative;
  staged("prompt", plan.cfg ? 3 : 2, [&](Stage& s) {
    const PromptJob pos = spec.prompt(c, plan, req.prompt);
    std::optional<PromptJob> neg;
    if (plan.cfg) neg.emplace(spec.prompt(c, plan, req.negative_prompt));
    res.prompt_truncated = pos.truncated;
    s.advance(1, "tokenized");
    std::string note;
    positive = encode_branch(spec, rs, pos, &note);
    s.detail = plan.cfg ? "prompt: " + note : note;
    s.advance(2, "prompt encoded");
    if (neg) {
      negative = encode_branch(spec, rs, *neg, &note);
      s.detail += "; negative: " + note;
      s.advance(3, "negative prompt encoded");
    }
    return 0;
  });

  std::vector<ReferenceLatents> latents_in;
  if (!plan.images.empty()) {
    latents_in =
        staged(spec.images_stage(), static_cast<int64_t>(plan.images.size()), [&](Stage& s) {
          std::vector<ReferenceLatents> out;
          for (size_t i = 0; i < plan.images.size(); ++i) {
            const Image& im = plan.images[i];
            bool hit = false;
            const Tensor z = rs.image_latents(
                spec.vae_path(), spec.image_rule(), im, [&] { return spec.encode_image(c, im); },
                &hit);
            out.push_back(spec.pack_image(z));
            s.detail += (s.detail.empty() ? "" : ", ") + size_str(im.width, im.height) + " (" +
                        std::to_string(out.back().height * out.back().width) + " tokens" +
                        (hit ? ", from the reference store" : "") + ")";
            s.advance(static_cast<int64_t>(i + 1), plan.names[i]);
          }
          return out;
        });
  }
  spec.check_conditioning(plan, positive, plan.cfg ? &negative : nullptr, latents_in);

  int steps_run = 0;
  const Tensor latents = staged("denoise", plan.steps, [&](Stage& s) {
    DenoiseInputs in;
    in.prompt = positive;
    if (plan.cfg) {
      in.negative = negative;
      in.cfg_scale = req.cfg_scale;
    }
    in.noise = spec.noise(c, plan);
    in.height = plan.grid_h, in.width = plan.grid_w;
    in.references = latents_in;
    DenoiseOptions o;
    if (plan.sigmas.empty()) {
      o.steps = plan.steps;
    } else {
      o.sigmas = plan.sigmas;
    }
    o.mode = req.kv_cache ? KVMode::kCached : KVMode::kRecompute;
    o.step_caches = req.step_caches;
    o.store = control.store;
    const std::string what = spec.cached_name();
    const bool cached = spec.exact_cache(plan);
    DenoiseStage ds(s, control, latents_in.empty() && !cached ? "" : what, cached,
                    plan.cfg ? " (2 branches)" : "");
    ds.attach(o, [&](const Tensor& x0) { return spec.decode(c, plan, x0, false); });
    const DenoiseResult r = spec.denoise(c, in, o);
    rs.add(r);
    res.step_caches = r.step_caches;
    steps_run = static_cast<int>(r.step_seconds.size());
    const std::string kv = spec.kv_name();
    s.detail = std::to_string(steps_run) + " steps" + (plan.cfg ? " x 2 branches, " : ", ") +
               (r.store_hits > 0 && r.store_misses == 0
                    ? kv + " from the reference store at every step (" +
                          std::to_string(r.kv_bytes) + " bytes)"
                : r.kv_bytes > 0 ? kv + " computed at step 1 and reused after it (" +
                                       std::to_string(r.kv_bytes) + " bytes)"
                : latents_in.empty() && !cached ? "no " + spec.images_stage()
                                                : what + " recomputed every step");
    return r.latents;
  });
  res.parameters =
      parameters_text(spec, plan, pipeline_path, pipeline_class, res.width, res.height, steps_run);
  const Image image = staged("decode", 1, [&](Stage& s) {
    Image im = spec.decode(c, plan, latents, req.vae_tiling);
    s.advance(1, "decoded");
    const std::string note = spec.decode_note();
    s.detail = size_str(res.width, res.height) + (note.empty() ? "" : " " + note);
    return im;
  });
  res.channels = image.channels;
  res.pixels = image.pixels;
  rs.report(res);
  store.count_request();
  return res;
}

}  // namespace flowkv::pipeline
