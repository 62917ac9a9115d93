// denoise() and kv_bytes_needed() for every family: the family's adapter driven by the one loop.
#include <algorithm>

#include "core/arena.h"
#include "families/family.h"
#include "flowkv/error.h"
#include "flowkv/model.h"
#include "pipeline/denoise.h"

namespace flowkv {

namespace {

// Steps: from the sigma grid when given, else the options, else the family's default.
DenoiseOptions resolved(const Model& m, DenoiseOptions o) {
  if (!o.sigmas.empty()) {
    const int n = static_cast<int>(o.sigmas.size());
    FLOWKV_CHECK(o.steps == 0 || o.steps == n, "denoise: ", n, " sigmas for ", o.steps, " steps");
    o.steps = n;
  } else if (o.steps == 0) {
    o.steps = m.family().default_steps;
  }
  FLOWKV_CHECK(o.steps >= 1, "denoise: at least one step, got ", o.steps);
  return o;
}

}  // namespace

DenoiseResult denoise(const Model& model, const DenoiseInputs& in, const DenoiseOptions& opts,
                      Workspace* ws) {
  const DenoiseOptions o = resolved(model, opts);
  auto adapter = model.impl().model->adapter(in, o);
  Workspace local;
  Arena& arena = (ws ? *ws : local).arena();
  pipeline::LoopOptions lo = pipeline::loop_options(o);
  lo.model_identity = model.impl().identity;
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

int64_t kv_bytes_needed(const Model& model, const DenoiseInputs& in, const DenoiseOptions& opts) {
  const DenoiseOptions o = resolved(model, opts);
  return pipeline::planned_kv_bytes(*model.impl().model->adapter(in, o));
}

}  // namespace flowkv
