// The one denoising loop (design.md, "One denoise loop"): the schedule and mu, the KV budget
// check, the step context and step hooks, classifier-free guidance (batched or per branch),
// the Euler update, timings and progress are written here once. A family supplies a small
// adapter: its request checked against the limits, its branches (each owning its KV memory),
// and one forward per branch. The loop knows no model and no family.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "cache/hooks.h"
#include "cache/kv_memory.h"
#include "cache/ref_store.h"
#include "core/exec_context.h"
#include "flowkv/model.h"
#include "flowkv/step_cache.h"
#include "sched/flow_match.h"

namespace flowkv::pipeline {

// One model call the loop asks of an adapter.
struct StepCall {
  int step = 0, steps = 1;
  float timestep = 1;              // the model's input time (sigma; bf16-rounded for bf16 models)
  const float* latents = nullptr;  // [B, N, C] the current latents
  cache::BlockHooks* hooks = nullptr;  // step caches of this branch, or nullptr
};

class DenoiseAdapter {
 public:
  virtual ~DenoiseAdapter() = default;

  // --- the request, before anything is allocated
  // Checks the request's sizes against the limits and its predicted memory against the
  // budget (throws flowkv::Error naming the problem).
  virtual void validate() const = 0;
  // Bytes the request's KV memories will hold (all branches), and how to name them in a
  // budget error: what the cache is, and what else helps.
  virtual int64_t planned_kv_bytes() const = 0;
  virtual std::string kv_name() const = 0;
  virtual std::string kv_advice() const = 0;

  // --- sizes and schedule
  virtual int64_t batch() const = 0;
  virtual int64_t tokens() const = 0;       // target tokens N
  virtual int64_t channels() const = 0;     // latent channels C
  virtual int64_t grid_height() const = 0;  // the target's latent grid (h * w = N)
  virtual int64_t grid_width() const = 0;
  virtual const float* noise() const = 0;
  virtual bool bf16() const = 0;  // the model computes in bf16: latents and times rounded
  virtual sched::FlowMatchConfig scheduler() const = 0;
  // The schedule's shift for this request under scheduler config `cfg`.
  virtual double mu(int steps, const sched::FlowMatchConfig& cfg) const = 0;
  virtual cache::Topology topology() const = 0;

  // --- the loop
  // Allocates the branches and their KV memories; returns their count (1, or 2 with CFG).
  // `separate`: run CFG branches as separate calls (step caches keep state per branch).
  virtual int prepare(bool separate) = 0;
  virtual bool cfg() const = 0;          // an unconditional branch is part of the request
  virtual bool batched_cfg() const = 0;  // after prepare: both branches in one forward
  virtual float cfg_scale() const = 0;
  // Guidance rescales each token's guided velocity to the conditional one's norm (Qwen-Image's
  // true CFG: comb * |cond| / |comb| over the latent channels).
  virtual bool cfg_rescale() const { return false; }
  virtual int64_t kv_bytes() const = 0;  // after prepare: the memories' payload
  virtual bool approximate() const = 0;  // a named approximation is in use
  // Whether branch b's call at `step` stores an exact cache (hooks must not skip then).
  virtual bool prefill(int branch, int step) const = 0;
  // Runs branch b; its velocity (the conditional one first when batched) lands in velocity().
  virtual void forward(const ExecContext& ctx, int branch, const StepCall& call) = 0;
  // Branch b's output: [B, N, C]; for a batched CFG branch 0, [2B, N, C] (cond, then uncond).
  virtual float* velocity(int branch) = 0;

  // --- exact memories shared across requests (the reference store), after prepare()
  // The memories whose content depends only on the request's conditioning (0: none).
  virtual int shared_memories() const { return 0; }
  // Adds to `key` everything besides the model's identity that decides memory i's content:
  // the rule, the segments' inputs (bytes), their positions, grids and modulation times.
  virtual void describe_memory(int, store::KeyBuilder&) const {}
  virtual std::shared_ptr<KVMemory> memory(int) const { return nullptr; }
  // Puts a complete memory of the same shape in memory i's place: its segments are spliced
  // from it from the first step on, and prefill() is false.
  virtual void adopt_memory(int, std::shared_ptr<KVMemory>) {}
};

struct LoopOptions {
  int steps = 0;               // ignored when sigmas are given
  std::vector<double> sigmas;  // empty: linspace(1, 1/n, n)
  // The scheduler's config when it is not the family's default (a pipeline folder's
  // scheduler_config.json).
  std::optional<sched::FlowMatchConfig> scheduler;
  int64_t kv_budget_bytes = -1;
  std::vector<std::string> step_caches;
  std::function<void(int step, int steps)> on_step;
  std::function<bool()> cancelled;  // polled before each step: true throws flowkv::Cancelled
  // The reference store, and the model's identity (weights and revision, compute type) its
  // keys start with; no store, or an empty identity (a model built in memory): not used.
  std::shared_ptr<ReferenceStore> store;
  std::string model_identity;
  // After each step: the x0 estimate latents - sigma * velocity, [B*N*C] (previews).
  std::function<void(int step, int steps, const float* x0)> on_estimate;
  std::function<void(int64_t hits, int64_t misses)> on_store_lookup;
  // Sees every step's velocities (uncond nullptr without CFG; both nullptr on a step a
  // loop-level step cache skipped), the guided (or filled) velocity and the latents after the
  // update (tests).
  std::function<void(int step, const float* cond, const float* uncond, const float* v,
                     const float* latents)>
      observe;
};

struct LoopResult {
  std::vector<float> latents;  // [B, N, C]
  sched::Schedule schedule;
  double mu = 0;
  std::vector<double> step_seconds;  // transformer time per step
  double transformer_seconds = 0;
  double loop_seconds = 0;
  int64_t kv_bytes = 0;
  bool cfg = false, batched_cfg = false, approximate = false;
  std::vector<StepCacheStats> step_caches;
  // The reference store's "kv" keys (hex) of the shared memories, and whether each was found.
  std::vector<std::string> store_keys;
  std::vector<bool> store_hit;
};

// The loop's part of the public options (steps already resolved).
inline LoopOptions loop_options(const DenoiseOptions& o) {
  LoopOptions l;
  l.steps = o.steps;
  l.sigmas = o.sigmas;
  l.kv_budget_bytes = o.kv_budget_bytes;
  l.step_caches = o.step_caches;
  l.on_step = o.on_step;
  l.cancelled = o.cancelled;
  l.store = o.store;
  l.on_store_lookup = o.on_store_lookup;
  return l;
}

// Checks the request and the budget (nothing allocated), returns the planned KV bytes.
int64_t planned_kv_bytes(const DenoiseAdapter& a);

LoopResult run_denoise(const ExecContext& ctx, DenoiseAdapter& a, const LoopOptions& opts);

}  // namespace flowkv::pipeline
