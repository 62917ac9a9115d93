// Tiny random-weight models with fixed inputs, shared by the pipeline tests: FLUX.2 Klein KV
// (two references of different sizes, batch 2) and Qwen-Image-2.1 (condition images spliced
// into the prompt, a padded row, optional CFG).
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/arena.h"
#include "families/adapters.h"
#include "flowkv/model.h"
#include "models/common/random_weights.h"
#include "models/flux2/builtin.h"
#include "models/flux2/model.h"
#include "models/qwen_image/builtin.h"
#include "models/qwen_image/model21.h"
#include "pipeline/denoise.h"
#include "test_util.h"

namespace flowkv::test {

// A request as denoise() takes it, plus the loop's test hook (every step's velocities).
struct LoopRequest {
  DenoiseInputs in;
  DenoiseOptions opts;
  std::function<void(int step, const float* cond, const float* uncond, const float* v,
                     const float* latents)>
      observe;
  pipeline::LoopOptions loop() const {
    pipeline::LoopOptions l = pipeline::loop_options(opts);
    l.observe = observe;
    return l;
  }
};

// The one loop over a family's adapter, as denoise() runs it.
inline pipeline::LoopResult run(Arena& arena, const flux2::Model& m, const LoopRequest& r) {
  const auto a = families::flux2_adapter(m, r.in, r.opts);
  return pipeline::run_denoise({&arena}, *a, r.loop());
}
inline pipeline::LoopResult run(Arena& arena, const qwen::Model21& m, const LoopRequest& r) {
  const auto a = families::qwen21_adapter(m, r.in, r.opts);
  return pipeline::run_denoise({&arena}, *a, r.loop());
}
inline int64_t planned_kv_bytes(const flux2::Model& m, const LoopRequest& r) {
  return pipeline::planned_kv_bytes(*families::flux2_adapter(m, r.in, r.opts));
}
inline int64_t planned_kv_bytes(const qwen::Model21& m, const LoopRequest& r) {
  return pipeline::planned_kv_bytes(*families::qwen21_adapter(m, r.in, r.opts));
}

inline Tensor tensor(const std::vector<float>& v, Shape shape) {
  return Tensor::from_vector(v, std::move(shape));
}

struct KleinFixture {
  flux2::Config cfg;
  flux2::Model model;
  int64_t B = 2, L = 12, h = 6, w = 5;
  std::vector<float> text, noise, ref1, ref2;
  KleinFixture(DType dtype, const std::string& name = "tiny") {
    EXPECT_TRUE(flux2::builtin_config(name, &cfg));
    flux2::LoadOptions o;
    o.auto_dtype = false;
    o.compute = dtype;
    model = flux2::Model::from_source(flux2::WeightSource(flux2::random_weights(cfg, 9, dtype)),
                                      cfg, o);
    const int64_t C = cfg.in_channels;
    text.resize(B * L * cfg.joint_attention_dim);
    noise.resize(B * h * w * C);
    ref1.resize(B * 4 * 3 * C);
    ref2.resize(B * 2 * 5 * C);
    flux2::fill_normal(text.data(), text.size(), 11);
    flux2::fill_normal(noise.data(), noise.size(), 12);
    flux2::fill_normal(ref1.data(), ref1.size(), 13);
    flux2::fill_normal(ref2.data(), ref2.size(), 14);
  }
  LoopRequest request(KVMode mode, int steps) const {
    const int64_t C = cfg.in_channels;
    LoopRequest r;
    r.in.prompt.embeds = tensor(text, {B, L, cfg.joint_attention_dim});
    r.in.noise = tensor(noise, {B, h * w, C});
    r.in.height = h;
    r.in.width = w;
    // Two references of different sizes.
    r.in.references = {{tensor(ref1, {B, 4 * 3, C}), 4, 3}, {tensor(ref2, {B, 2 * 5, C}), 2, 5}};
    r.opts.steps = steps;
    r.opts.mode = mode;
    return r;
  }
};

struct Qwen21Fixture {
  qwen::Config21 cfg;
  qwen::Model21 model;
  int64_t B = 2;
  qwen::Grid target{4, 6};
  std::vector<qwen::Grid> conds;
  std::vector<float> text, ntext, cond, noise;
  std::vector<uint8_t> slots, nslots, valid;
  Qwen21Fixture(DType dt, int refs) {
    EXPECT_TRUE(qwen::builtin_config21("qwen21-tiny", &cfg));
    qwen::LoadOptions21 o;
    o.auto_dtype = false;
    o.compute = dt;
    model = qwen::Model21::from_tensors(qwen::random_weights21(cfg, 3, dt), cfg, o);
    // Prompt rows: 3 text, [ref 1: 2x4 = 2 slots], 2 text, [ref 2: 4x2 = 2 slots], 4 text.
    const std::vector<qwen::Grid> all = {{2, 4}, {4, 2}};
    for (int i = 0; i < refs; ++i) conds.push_back(all[static_cast<size_t>(i)]);
    for (int i = 0; i < 3; ++i) slots.push_back(0);
    if (refs >= 1) slots.insert(slots.end(), {1, 1});
    slots.insert(slots.end(), {0, 0});
    if (refs >= 2) slots.insert(slots.end(), {1, 1});
    slots.insert(slots.end(), {0, 0, 0, 0});
    const int64_t L = static_cast<int64_t>(slots.size());
    nslots = slots;
    valid.assign(static_cast<size_t>(B * L), 1);
    valid[static_cast<size_t>(2 * L - 1)] = 0;  // batch element 1's last prompt row is padding
    text.resize(B * L * cfg.context_in_dim);
    ntext.resize(text.size());
    int64_t n_cond = 0;
    for (const auto& g : conds) n_cond += g.tokens();
    cond.resize(B * n_cond * cfg.in_channels);
    noise.resize(B * target.tokens() * cfg.in_channels);
    fill_normal(text.data(), text.size(), 31);
    fill_normal(ntext.data(), ntext.size(), 32);
    fill_normal(cond.data(), cond.size(), 33);
    fill_normal(noise.data(), noise.size(), 34);
  }
  LoopRequest request(bool cache, bool use_cfg, int steps, bool batch_cfg = true) const {
    const int64_t L = static_cast<int64_t>(slots.size()), C = cfg.in_channels;
    LoopRequest r;
    std::vector<float> mask(valid.begin(), valid.end());
    r.in.prompt = {tensor(text, {B, L, cfg.context_in_dim}), slots, tensor(mask, {B, L})};
    if (use_cfg) {
      r.in.negative = {tensor(ntext, {B, L, cfg.context_in_dim}), nslots, Tensor()};
      r.in.cfg_scale = 3.5f;
      r.opts.batch_cfg = batch_cfg;
    }
    // The conditions, each [B, h*w, C], cut from the per-batch concatenation.
    int64_t n_cond = 0;
    for (const auto& g : conds) n_cond += g.tokens();
    for (int64_t i = 0, off = 0; i < static_cast<int64_t>(conds.size()); ++i) {
      const qwen::Grid g = conds[static_cast<size_t>(i)];
      std::vector<float> c;
      for (int64_t b = 0; b < B; ++b) {
        const float* p = cond.data() + (b * n_cond + off) * C;
        c.insert(c.end(), p, p + g.tokens() * C);
      }
      r.in.references.push_back({tensor(c, {B, g.tokens(), C}), g.h, g.w});
      off += g.tokens();
    }
    r.in.noise = tensor(noise, {B, target.tokens(), C});
    r.in.height = target.h;
    r.in.width = target.w;
    r.opts.steps = steps;
    r.opts.mode = cache ? KVMode::kCached : KVMode::kRecompute;
    return r;
  }
};

// The final latents of a run of a fixture with step caches `caches` (the policies' report into
// `stats`), for the step-cache tests' bit-for-bit comparisons. Qwen-Image-2.1's CFG branches
// run as separate calls, as they do whenever a policy is active.
inline std::vector<float> klein_run(const KleinFixture& f, KVMode mode, int steps,
                                    const std::vector<std::string>& caches,
                                    std::vector<StepCacheStats>* stats = nullptr) {
  Arena arena;
  LoopRequest r = f.request(mode, steps);
  r.opts.step_caches = caches;
  auto res = run(arena, f.model, r);
  if (stats) *stats = res.step_caches;
  return res.latents;
}
inline std::vector<float> qwen21_run(const Qwen21Fixture& f, bool cache, bool cfg, int steps,
                                     const std::vector<std::string>& caches,
                                     std::vector<StepCacheStats>* stats = nullptr) {
  Arena arena;
  LoopRequest r = f.request(cache, cfg, steps, /*batch_cfg=*/false);
  r.opts.step_caches = caches;
  auto res = run(arena, f.model, r);
  if (stats) *stats = res.step_caches;
  return res.latents;
}
inline bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && bit_equal(a.data(), b.data(), static_cast<int64_t>(a.size()));
}

}  // namespace flowkv::test
