// What the families' API functions build the same way: a KVPrediction from a token layout and
// its cache plan (through the one cost model), and a DenoiseResult from a pipeline's result.
#pragma once

#include <string>
#include <vector>

#include "cost/cost_model.h"
#include "flowkv/klein_kv.h"
#include "flowkv/predict.h"
#include "segments/layout.h"

namespace flowkv::api {

inline KVPrediction prediction(const std::string& model, const cost::ModelShape& shape,
                               const TokenLayout& layout, const CachePlan& plan, int steps,
                               bool cfg) {
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
  return p;
}

// The fields every pipeline result has (latents, schedule, timings, KV bytes, step caches).
template <class PipelineResult>
DenoiseResult denoise_result(const PipelineResult& res, const Shape& latent_shape) {
  DenoiseResult out;
  out.latents = Tensor::from_vector(res.latents, latent_shape);
  out.sigmas = res.schedule.sigmas;
  out.step_seconds = res.step_seconds;
  out.transformer_seconds = res.transformer_seconds;
  out.loop_seconds = res.loop_seconds;
  out.kv_bytes = res.kv_bytes;
  out.step_caches = res.step_caches;
  return out;
}

}  // namespace flowkv::api
