#include "pipeline/denoise.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "flowkv/error.h"
#include "flowkv/generate.h"
#include "flowkv/tensor.h"
#include "pipeline/request_limits.h"
#include "pipeline/step_caches.h"

namespace flowkv::pipeline {

namespace {

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::vector<double> sigma_grid(const LoopOptions& o) {
  if (!o.sigmas.empty()) return o.sigmas;
  FLOWKV_CHECK(o.steps >= 1, "denoise: at least one step, got ", o.steps);
  return sched::linspace_sigmas(o.steps);
}

// Branch 0 computed, branch 1 (the unconditional one) skipped or computed: the step hooks fill
// or observe it.
void finish_branches(StepCaches& sc, cache::StepContext ctx, DenoiseAdapter& a, bool ran_uncond) {
  ctx.branch = 1;
  const int64_t B = a.batch(), N = a.tokens(), C = a.channels();
  const int64_t h = a.grid_height(), w = a.grid_width();
  if (!ran_uncond) {
    sc.policy().fill_branch(ctx, a.velocity(0), a.velocity(1), B, N, C, h, w);
  } else {
    sc.policy().observe_branches(ctx, a.velocity(0), a.velocity(1), B, N, C, h, w);
  }
}

// v = v_uncond + s * (v_cond - v_uncond); without CFG, v = v_cond. With `rescale` channels
// (Qwen-Image's true CFG), each token's guided velocity is then scaled to the norm of its
// conditional one: v *= |v_cond| / |v| over those channels.
void guide(const float* cond, const float* uncond, float scale, int64_t n, int64_t rescale,
           float* v) {
  for (int64_t i = 0; i < n; ++i) {
    if (!uncond) {
      v[i] = cond[i];
      continue;
    }
    const float d = cond[i] - uncond[i];
    const float s = scale * d;
    v[i] = uncond[i] + s;
  }
  if (!uncond || rescale <= 0) return;
  for (int64_t r = 0; r + rescale <= n; r += rescale) {
    double nc = 0, nv = 0;
    for (int64_t j = r; j < r + rescale; ++j) {
      nc += static_cast<double>(cond[j]) * cond[j];
      nv += static_cast<double>(v[j]) * v[j];
    }
    const float ratio = static_cast<float>(std::sqrt(nc)) / static_cast<float>(std::sqrt(nv));
    for (int64_t j = r; j < r + rescale; ++j) v[j] *= ratio;
  }
}

// The request's shared memories against the reference store: each found is adopted (spliced
// from the first step on), each missing one is inserted once the first step has filled it.
// The handles pin the entries until the request ends.
class StoreUse {
 public:
  StoreUse(DenoiseAdapter& a, const LoopOptions& o) : a_(a) {
    if (!o.store || o.model_identity.empty()) return;
    store_ = &store::of(*o.store);
    for (int i = 0; i < a.shared_memories(); ++i) {
      std::shared_ptr<KVMemory> m = a.memory(i);
      if (!m) continue;
      store::KeyBuilder kb("kv");
      kb.text("model", o.model_identity);
      kb.integer("memory", i);
      kb.text("kv dtype", dtype_name(m->dtype()));
      kb.integer("layers", m->layers()).integer("batch", m->batch());
      kb.integer("tokens", m->tokens()).integer("width", m->width());
      a.describe_memory(i, kb);
      const store::Key key = kb.finish();
      store::Handle h = store_->find(key);
      keys_.push_back(key.hex());
      hit_.push_back(h != nullptr);
      if (h) {
        FLOWKV_CHECK(h->tensors.size() == 1, "reference store: entry ", key.hex(), " holds ",
                     h->tensors.size(), " tensors; a K/V entry holds one");
        a.adopt_memory(i, std::make_shared<KVMemory>(h->tensors[0], m->layers(), m->batch(),
                                                     m->tokens(), m->width()));
        held_.push_back(std::move(h));
      } else {
        pending_.emplace_back(i, key);
      }
    }
  }
  // After the first step: every memory it filled goes into the store.
  void filled() {
    for (const auto& [i, key] : pending_) {
      const std::shared_ptr<KVMemory> m = a_.memory(i);
      if (!m || !m->complete()) continue;
      held_.push_back(store_->insert(key, store::Entry{{m->data()}}));
    }
    pending_.clear();
  }
  int64_t hits() const { return static_cast<int64_t>(std::count(hit_.begin(), hit_.end(), true)); }
  int64_t misses() const { return static_cast<int64_t>(hit_.size()) - hits(); }
  void report(LoopResult& r) const {
    r.store_keys = keys_;
    r.store_hit = hit_;
  }

 private:
  DenoiseAdapter& a_;
  store::Store* store_ = nullptr;
  std::vector<std::pair<int, store::Key>> pending_;
  std::vector<store::Handle> held_;
  std::vector<std::string> keys_;
  std::vector<bool> hit_;
};

}  // namespace

int64_t planned_kv_bytes(const DenoiseAdapter& a) {
  a.validate();
  return a.planned_kv_bytes();
}

LoopResult run_denoise(const ExecContext& ctx, DenoiseAdapter& a, const LoopOptions& o) {
  const double t_start = now();
  a.validate();
  check_kv_budget(a.planned_kv_bytes(), o.kv_budget_bytes, a.kv_name(), a.kv_advice());
  LoopResult res;
  StepCaches step_caches(o.step_caches, a.topology());
  const int branches = a.prepare(step_caches.active());
  StoreUse store(a, o);
  if (o.on_store_lookup) o.on_store_lookup(store.hits(), store.misses());
  res.cfg = a.cfg();
  res.batched_cfg = a.batched_cfg();
  res.approximate = a.approximate();
  res.kv_bytes = a.kv_bytes();

  // Schedule (spec §5.6): the sigma grid, the family's shift mu, the scheduler's timesteps.
  const std::vector<double> sigmas = sigma_grid(o);
  const int steps = static_cast<int>(sigmas.size());
  const sched::FlowMatchConfig scheduler = o.scheduler ? *o.scheduler : a.scheduler();
  res.mu = a.mu(steps, scheduler);
  res.schedule = sched::set_timesteps(scheduler, sigmas, res.mu);

  const int64_t B = a.batch(), N = a.tokens(), C = a.channels(), n = B * N * C;
  const bool bf16 = a.bf16();
  res.latents.assign(a.noise(), a.noise() + n);
  if (bf16) {
    for (float& v : res.latents) v = round_bf16(v);
  }
  std::vector<float> v(static_cast<size_t>(n)), x0(o.on_estimate ? static_cast<size_t>(n) : 0);
  for (int k = 0; k < steps; ++k) {
    if (o.cancelled && o.cancelled()) {
      throw Cancelled("cancelled before step " + std::to_string(k + 1) + " of " +
                      std::to_string(steps));
    }
    const size_t ks = static_cast<size_t>(k);
    StepCall call{.step = k,
                  .steps = steps,
                  .timestep = sched::model_timestep(res.schedule.timesteps[ks], bf16),
                  .latents = res.latents.data()};
    cache::StepContext sc;
    sc.step = k, sc.num_steps = steps, sc.cfg = res.cfg;
    sc.sigma = static_cast<float>(res.schedule.sigmas[ks]);
    sc.sigma_next = static_cast<float>(res.schedule.sigmas[ks + 1]);
    sc.timestep = static_cast<float>(res.schedule.timesteps[ks]);
    sc.latents = {.x = res.latents.data(),
                  .batch = B,
                  .h = a.grid_height(),
                  .w = a.grid_width(),
                  .channels = C};
    // Loop-level step caches may skip every model call of this step and provide the velocity
    // the Euler step consumes; never on a step that stores an exact cache.
    bool run_model = true;
    if (step_caches.active()) {
      for (int b = 0; b < branches; ++b) sc.prefill = sc.prefill || a.prefill(b, k);
      step_caches.at(sc);
      run_model = step_caches.policy().run_step(sc);
      sc.prefill = false;
    }
    double step_seconds = 0;
    const float* cond = nullptr;
    const float* uncond = nullptr;
    if (run_model) {
      bool ran_uncond = true;
      for (int b = 0; b < branches; ++b) {
        sc.branch = b;
        sc.prefill = a.prefill(b, k);
        call.hooks = step_caches.at(sc);
        if (call.hooks && !step_caches.policy().run_branch(sc)) {
          ran_uncond = false;  // filled from the conditional output below
          continue;
        }
        const double t0 = now();
        a.forward(ctx, b, call);
        step_seconds += now() - t0;
        if (call.hooks) step_caches.policy().observe_output(sc, a.velocity(b), n);
      }
      if (k == 0) store.filled();
      if (branches == 2 && step_caches.active()) finish_branches(step_caches, sc, a, ran_uncond);
      cond = a.velocity(0);
      uncond = !res.cfg ? nullptr : res.batched_cfg ? cond + n : a.velocity(1);
      guide(cond, uncond, a.cfg_scale(), n, a.cfg_rescale() ? C : 0, v.data());
    } else {
      step_caches.policy().fill_velocity(sc, res.latents.data(), v.data(), n);
    }
    res.step_seconds.push_back(step_seconds);
    res.transformer_seconds += step_seconds;
    if (step_caches.active()) {
      sc.branch = 0, sc.prefill = false;
      step_caches.policy().observe_step(sc, res.latents.data(), v.data(), n);
    }
    sched::euler_step(res.latents.data(), v.data(), n, res.schedule.sigmas[ks],
                      res.schedule.sigmas[ks + 1], bf16);
    if (o.observe) o.observe(k, cond, uncond, v.data(), res.latents.data());
    if (o.on_step) o.on_step(k + 1, steps);
    if (o.on_estimate) {  // x0 = x_k - sigma_k v = x_{k+1} - sigma_{k+1} v
      const float s = static_cast<float>(res.schedule.sigmas[ks + 1]);
      for (int64_t i = 0; i < n; ++i) x0[static_cast<size_t>(i)] = res.latents[i] - s * v[i];
      o.on_estimate(k + 1, steps, x0.data());
    }
  }
  res.step_caches = step_caches.stats();
  store.report(res);
  res.loop_seconds = now() - t_start;
  return res;
}

}  // namespace flowkv::pipeline
