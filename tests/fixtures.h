// Tiny random-weight models with fixed inputs, shared by the pipeline tests: FLUX.2 Klein KV
// (two references of different sizes, batch 2) and Qwen-Image-2.1 (condition images spliced
// into the prompt, a padded row, optional CFG).
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "models/common/random_weights.h"
#include "models/flux2/builtin.h"
#include "models/flux2/model.h"
#include "models/qwen_image/builtin.h"
#include "models/qwen_image/model21.h"
#include "pipeline/klein_kv.h"
#include "pipeline/qwen21.h"

namespace flowkv::test {

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
  pipeline::KleinKVRequest request(pipeline::RefMode mode, int steps) const {
    pipeline::KleinKVRequest r;
    r.batch = B;
    r.text = text.data();
    r.text_tokens = L;
    r.noise = noise.data();
    r.height = h;
    r.width = w;
    r.refs = {{ref1.data(), 4, 3}, {ref2.data(), 2, 5}};  // two references of different sizes
    r.steps = steps;
    r.mode = mode;
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
  pipeline::Qwen21Request request(bool cache, bool cfg, int steps, bool batch_cfg = true) const {
    pipeline::Qwen21Request r;
    r.batch = B;
    const int64_t L = static_cast<int64_t>(slots.size());
    r.prompt = {text.data(), L, slots.data(), valid.data()};
    if (cfg) {
      r.negative = {ntext.data(), L, nslots.data(), nullptr};
      r.cfg_scale = 3.5f;
      r.batch_cfg = batch_cfg;
    }
    r.cond = cond.data();
    r.cond_grids = conds;
    r.noise = noise.data();
    r.target = target;
    r.steps = steps;
    r.use_cache = cache;
    return r;
  }
};

}  // namespace flowkv::test
