#include "pipeline/qwen21.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>

#include "core/checked.h"
#include "flowkv/error.h"
#include "pipeline/request_limits.h"
#include "pipeline/step_caches.h"

namespace flowkv::pipeline {

namespace {

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

bool has_cfg(const Qwen21Request& r) {
  return r.negative.text && r.cfg_scale > 1.0f;
}

int64_t prefix_tokens(const Qwen21Prompt& p, const Qwen21Request& r) {
  return qwen::build_layout21(p.len, p.slots, r.cond_grids, r.target).P;
}

bool same_layout(const Qwen21Prompt& a, const Qwen21Prompt& b) {
  if (a.len != b.len) return false;
  for (int64_t i = 0; i < a.len; ++i) {
    if ((a.slots && a.slots[i]) != (b.slots && b.slots[i])) return false;
  }
  return true;
}

// One branch's (or the batched pair's) inputs as the model takes them, owning what had to be
// concatenated, and its memory.
struct Branch {
  int64_t batch = 0;
  std::vector<float> text, cond;  // only when two prompts are batched together
  std::vector<uint8_t> valid;
  qwen::Args21 args;
  std::unique_ptr<KVMemory> memory;
  std::vector<float> out;
};

void fill_branch(Branch& br, const qwen::Model21& m, const Qwen21Request& r,
                 std::initializer_list<const Qwen21Prompt*> prompts) {
  const auto& c = m.config();
  const int64_t B = r.batch, n = static_cast<int64_t>(prompts.size());
  const Qwen21Prompt& first = **prompts.begin();
  int64_t n_cond = 0;
  for (const auto& g : r.cond_grids) n_cond += g.tokens();
  br.batch = B * n;
  qwen::Args21& a = br.args;
  a.batch = br.batch;
  a.text_len = first.len;
  a.slots = first.slots;
  a.cond_grids = r.cond_grids;
  a.target_grid = r.target;
  if (n == 1) {
    a.text = first.text;
    a.text_valid = first.valid;
    a.cond = r.cond;
  } else {
    bool any_mask = false;
    for (const Qwen21Prompt* p : prompts) any_mask |= p->valid != nullptr;
    for (const Qwen21Prompt* p : prompts) {
      br.text.insert(br.text.end(), p->text, p->text + B * p->len * c.context_in_dim);
      if (any_mask) {
        if (p->valid)
          br.valid.insert(br.valid.end(), p->valid, p->valid + B * p->len);
        else
          br.valid.insert(br.valid.end(), static_cast<size_t>(B * p->len), 1);
      }
      if (r.cond) br.cond.insert(br.cond.end(), r.cond, r.cond + B * n_cond * c.in_channels);
    }
    a.text = br.text.data();
    a.text_valid = any_mask ? br.valid.data() : nullptr;
    a.cond = r.cond ? br.cond.data() : nullptr;
  }
  br.out.resize(static_cast<size_t>(br.batch * r.target.tokens() * c.out_features()));
  a.out = br.out.data();
  if (r.use_cache && c.causal_condition) {
    br.memory = std::make_unique<KVMemory>(m.kv_layers(), br.batch, prefix_tokens(first, r),
                                           m.kv_width(), m.kv_dtype());
  }
}

int64_t planned_kv_bytes_unchecked(const qwen::Model21& m, const Qwen21Request& r) {
  if (!r.use_cache || !m.config().causal_condition) return 0;
  int64_t tokens = prefix_tokens(r.prompt, r);
  if (has_cfg(r)) tokens += prefix_tokens(r.negative, r);  // one cache per branch
  return KVMemory::payload_bytes(m.kv_layers(), r.batch, tokens, m.kv_width(), m.kv_dtype());
}

// The request's sizes, its limits and its predicted memory, before anything is allocated.
void validate(const qwen::Model21& m, const Qwen21Request& r) {
  FLOWKV_CHECK(r.batch > 0 && r.prompt.text && r.noise, "denoise: prompt and noise are required");
  FLOWKV_CHECK(!r.sigmas.empty() || r.steps >= 1, "denoise: at least one step, got ", r.steps);
  // Text rows, condition-image tokens and the target: at least the sequence's length.
  int64_t tokens =
      checked_add(std::max(r.prompt.len, r.negative.text ? r.negative.len : 0),
                  grid_tokens(r.target.h, r.target.w, "the target grid"), "sequence tokens");
  for (const qwen::Grid& g : r.cond_grids) {
    tokens =
        checked_add(tokens, grid_tokens(g.h, g.w, "a condition-image grid"), "sequence tokens");
  }
  RequestSize size{.batch = has_cfg(r) && r.batch_cfg ? checked_mul(r.batch, 2, "batch") : r.batch,
                   .steps = r.sigmas.empty() ? r.steps : static_cast<int64_t>(r.sigmas.size()),
                   .images = static_cast<int64_t>(r.cond_grids.size()),
                   .tokens = tokens};
  check_request_limits(size);
  size.kv_bytes = planned_kv_bytes_unchecked(m, r);
  const auto& c = m.config();
  check_request_memory({c.dim(), c.num_layers, c.mlp_hidden(), dtype_size(m.kv_dtype())}, size);
}

}  // namespace

int64_t planned_kv_bytes(const qwen::Model21& m, const Qwen21Request& r) {
  validate(m, r);
  return planned_kv_bytes_unchecked(m, r);
}

Qwen21Result run_qwen21(const ExecContext& ctx, const qwen::Model21& m, const Qwen21Request& r) {
  const double t_start = now();
  const auto& c = m.config();
  validate(m, r);
  Qwen21Result res;
  res.cfg = has_cfg(r);
  const int64_t need = planned_kv_bytes_unchecked(m, r);
  check_kv_budget(
      need, r.kv_budget_bytes,
      res.cfg ? "the prefix KV cache (one cache per CFG branch)" : "the prefix KV cache",
      "shorten the prompt or the condition images, or run uncached (use_cache false)");
  // Branches: cond alone, or cond and uncond (batched when their layouts match).
  std::vector<Branch> branches(1);
  StepCaches step_caches(r.step_caches, m.topology());
  res.batched_cfg =
      res.cfg && r.batch_cfg && !step_caches.active() && same_layout(r.prompt, r.negative);
  if (res.batched_cfg) {
    fill_branch(branches[0], m, r, {&r.prompt, &r.negative});
  } else {
    fill_branch(branches[0], m, r, {&r.prompt});
    if (res.cfg) {
      branches.emplace_back();
      fill_branch(branches[1], m, r, {&r.negative});
    }
  }
  for (const Branch& b : branches) res.kv_bytes += b.memory ? b.memory->bytes() : 0;

  const std::vector<double> sigmas = r.sigmas.empty() ? sched::linspace_sigmas(r.steps) : r.sigmas;
  const int steps = static_cast<int>(sigmas.size());
  const int64_t T = r.target.tokens(), B = r.batch, C = c.in_channels;
  res.mu = sched::linear_mu(T, r.scheduler);
  res.schedule = sched::set_timesteps(r.scheduler, sigmas, res.mu);
  const bool bf16 = m.compute_dtype() == DType::kBF16;
  res.latents.assign(r.noise, r.noise + B * T * C);
  if (bf16) {
    for (float& v : res.latents) v = round_bf16(v);
  }
  std::vector<float> target_in, timestep, v(static_cast<size_t>(B * T * C));
  for (int k = 0; k < steps; ++k) {
    const float t = sched::model_timestep(res.schedule.timesteps[static_cast<size_t>(k)], bf16);
    double step_seconds = 0;
    std::vector<bool> ran(branches.size(), true);
    cache::StepContext sc;
    sc.step = k, sc.num_steps = steps, sc.cfg = res.cfg;
    sc.sigma = res.schedule.sigmas[static_cast<size_t>(k)];
    sc.timestep = res.schedule.timesteps[static_cast<size_t>(k)];
    for (size_t bi = 0; bi < branches.size(); ++bi) {
      Branch& br = branches[bi];
      sc.branch = static_cast<int>(bi);
      sc.prefill = br.memory && k == 0;
      if (step_caches.active()) {
        step_caches.policy().set_step(sc);
        ran[bi] = step_caches.policy().run_branch(sc);
        if (!ran[bi]) continue;  // filled from the conditional output below
      }
      const int64_t reps = br.batch / B;  // the same latents for every prompt in the batch
      target_in.clear();
      for (int64_t i = 0; i < reps; ++i)
        target_in.insert(target_in.end(), res.latents.begin(), res.latents.end());
      timestep.assign(static_cast<size_t>(br.batch), t);
      qwen::Args21 a = br.args;
      a.target = target_in.data();
      a.timestep = timestep.data();
      if (br.memory && k == 0) a.prefix_kv.store = br.memory.get();
      if (br.memory && k > 0) a.prefix_kv.memory = br.memory.get();
      a.hooks = step_caches.at(sc);
      const double t0 = now();
      m.forward(ctx, a);
      step_seconds += now() - t0;
    }
    if (branches.size() == 2 && step_caches.active()) {
      sc.branch = 1;
      const float* cv = branches[0].out.data();
      float* uv = branches[1].out.data();
      if (!ran[1]) {
        step_caches.policy().fill_branch(sc, cv, uv, B, T, C, r.target.h, r.target.w);
      } else {
        step_caches.policy().observe_branches(sc, cv, uv, B, T, C, r.target.h, r.target.w);
      }
    }
    res.step_seconds.push_back(step_seconds);
    res.transformer_seconds += step_seconds;
    // v = v_neg + s * (v_cond - v_neg) (no norm rescale in 2.1).
    const float* cond_v = branches[0].out.data();
    const float* uncond_v = !res.cfg          ? nullptr
                            : res.batched_cfg ? branches[0].out.data() + B * T * C
                                              : branches[1].out.data();
    for (int64_t i = 0; i < B * T * C; ++i) {
      if (!uncond_v) {
        v[i] = cond_v[i];
        continue;
      }
      const float d = cond_v[i] - uncond_v[i];
      const float s = r.cfg_scale * d;
      v[i] = uncond_v[i] + s;
    }
    sched::euler_step(res.latents.data(), v.data(), B * T * C,
                      res.schedule.sigmas[static_cast<size_t>(k)],
                      res.schedule.sigmas[static_cast<size_t>(k + 1)], bf16);
    if (r.observe) r.observe(k, cond_v, uncond_v, v.data(), res.latents.data());
    if (r.on_step) r.on_step(k + 1, steps);
  }
  res.step_caches = step_caches.stats();
  res.loop_seconds = now() - t_start;
  return res;
}

}  // namespace flowkv::pipeline
