// A transformer loaded for a pipeline, and the one denoising loop over it: what the public
// Model / denoise() and the families' generate specs share (families sit below api/).
#include <algorithm>

#include "core/arena.h"
#include "core/random.h"
#include "families/family.h"
#include "flowkv/error.h"
#include "pipeline/denoise.h"
#include "pipeline/identity.h"

namespace flowkv::families {

LoadedTransformer load_transformer(const std::string& path, const std::string& dtype) {
  const Family& f = resolve(path);
  LoadedTransformer t{&f, f.load(path, dtype), ""};
  t.identity = pipeline::component_identity(path, t.model->compute_dtype());
  return t;
}

DenoiseOptions resolve_steps(const LoadedTransformer& t, DenoiseOptions o) {
  if (!o.sigmas.empty()) {
    const int n = static_cast<int>(o.sigmas.size());
    FLOWKV_CHECK(o.steps == 0 || o.steps == n, "denoise: ", n, " sigmas for ", o.steps, " steps");
    o.steps = n;
  } else if (o.steps == 0) {
    o.steps = t.family->info.default_steps;
  }
  FLOWKV_CHECK(o.steps >= 1, "denoise: at least one step, got ", o.steps);
  return o;
}

Tensor torch_noise(const LoadedTransformer& t, uint64_t seed, int64_t channels, int64_t h,
                   int64_t w) {
  TorchGenerator g(seed);
  const DType dtype = t.model->compute_dtype() == "BF16" ? DType::kBF16 : DType::kF32;
  return randn_tensor(g, {1, channels, h, w}, dtype).to_f32();
}

DenoiseResult run_family_denoise(const LoadedTransformer& t, const DenoiseInputs& in,
                                 const DenoiseOptions& opts,
                                 const std::optional<sched::FlowMatchConfig>& scheduler,
                                 Workspace* ws) {
  const DenoiseOptions o = resolve_steps(t, opts);
  auto adapter = t.model->adapter(in, o);
  Workspace local;
  Arena& arena = (ws ? *ws : local).arena();
  pipeline::LoopOptions lo = pipeline::loop_options(o);
  lo.model_identity = t.identity;
  lo.scheduler = scheduler;
  Tensor estimate;  // one buffer for every step's estimate, allocated before the loop
  if (o.on_estimate) {
    estimate = Tensor::empty(in.noise.shape());
    lo.on_estimate = [&](int step, int steps, const float* x0) {
      std::copy_n(x0, estimate.numel(), estimate.f32());
      o.on_estimate(step, steps, estimate);
    };
  }
  const pipeline::LoopResult res = pipeline::run_denoise({&arena}, *adapter, lo);
  DenoiseResult out;
  out.latents = Tensor::from_vector(res.latents, in.noise.shape());
  out.sigmas = res.schedule.sigmas;
  out.step_seconds = res.step_seconds;
  out.transformer_seconds = res.transformer_seconds;
  out.loop_seconds = res.loop_seconds;
  out.kv_bytes = res.kv_bytes;
  out.approximate = res.approximate;
  out.cfg = res.cfg;
  out.batched_cfg = res.batched_cfg;
  out.step_caches = res.step_caches;
  out.store_keys = res.store_keys;
  for (bool hit : res.store_hit) ++(hit ? out.store_hits : out.store_misses);
  return out;
}

}  // namespace flowkv::families
