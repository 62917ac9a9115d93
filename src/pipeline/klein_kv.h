// The Flux2KleinKVPipeline denoising loop (diffusers pipeline_flux2_klein_kv.py) from given
// text embeddings, reference latents and initial noise: the scheduler of sched/, step 0 as
// prefill (references computed, their K/V stored), later steps as decode (references spliced
// from the request's KV memory). The uncached baseline recomputes the references every step
// under the same rules. Text encoder and VAE are outside.
#pragma once

#include <functional>
#include <vector>

#include "core/exec_context.h"
#include "flowkv/step_cache.h"
#include "models/flux2/model.h"
#include "sched/flow_match.h"
#include "segments/layout.h"

namespace flowkv::pipeline {

struct Reference {
  const float* latents = nullptr;  // packed, normalised: [B, h*w, in_channels]
  int64_t height = 0, width = 0;   // latent grid (tokens)
};

enum class RefMode { kCached, kRecompute };

struct KleinKVRequest {
  int64_t batch = 1;
  const float* text = nullptr;  // [B, L, joint_attention_dim]
  int64_t text_tokens = 0;
  const float* noise = nullptr;  // [B, h*w, in_channels] packed initial latents
  int64_t height = 0, width = 0;
  std::vector<Reference> refs;
  int steps = 4;
  RefMode mode = RefMode::kCached;
  bool cache_text = false;      // exact text caching: refused with the broken rule named
  bool text_kv_approx = false;  // the named approximation: step-0 text K/V reused
  float ref_timestep = 0.0f;
  int64_t kv_budget_bytes = -1;  // -1: no limit
  sched::FlowMatchConfig scheduler = sched::flux2_scheduler_config();
  std::vector<double> sigmas;  // empty: linspace(1, 1/n, n)
  // Approximate step caches, "name[:k=v,...]" each (fresh state for this request). They see the
  // text and target streams; the references always run (or come from the exact cache).
  std::vector<std::string> step_caches;
  std::function<void(int step, int steps)> on_step;  // progress
  // Sees every step's velocity and the latents after its update (tests).
  std::function<void(int step, const float* velocity, const float* latents)> observe;
};

struct KleinKVResult {
  std::vector<float> latents;  // [B, h*w, in_channels]
  sched::Schedule schedule;
  double mu = 0;
  std::vector<double> step_seconds;  // transformer time per step
  double transformer_seconds = 0;
  double loop_seconds = 0;
  int64_t kv_bytes = 0;  // KV memory payload held by the request
  CachePlan plan;
  std::vector<StepCacheStats> step_caches;
};

// Bytes the request's KV memories would hold, checked against the budget before any work.
int64_t planned_kv_bytes(const flux2::Model& m, const KleinKVRequest& r);

KleinKVResult run_klein_kv(const ExecContext& ctx, const flux2::Model& m, const KleinKVRequest& r);

}  // namespace flowkv::pipeline
