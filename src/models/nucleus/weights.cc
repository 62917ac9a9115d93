#include "models/nucleus/weights.h"

#include "models/nucleus/moe.h"

namespace flowkv::nucleus {

std::vector<ExpectedTensor> weight_table(const Config& c, bool output_major) {
  const int64_t d = c.dim(), kv = c.kv_dim(), hd = c.attention_head_dim, C = c.joint_attention_dim;
  const int64_t E = c.num_experts, I = c.moe_intermediate_dim;
  using namespace wn;
  std::vector<ExpectedTensor> t;
  auto linear = [&](const std::string& base, int64_t out, int64_t in) {
    t.push_back({base + ".weight", {out, in}});
    t.push_back({base + ".bias", {out}});
  };
  linear(kTime1, 4 * d, d);
  linear(kTime2, d, 4 * d);
  t.push_back({kTimeNorm, {d}});
  t.push_back({kTxtNorm, {C}});
  linear(kImgIn, d, c.in_channels);
  linear(kNormOut, 2 * d, d);
  t.push_back({kProjOut, {c.out_features(), d}});
  for (int64_t i = 0; i < c.num_layers; ++i) {
    auto n = [&](const char* leaf) { return block_name(i, leaf); };
    linear(n(kImgMod), 4 * d, d);
    linear(n(kEncoderProj), d, C);
    t.push_back({n(kToQ), {d, d}});
    for (const char* k : {kToK, kToV, kAddK, kAddV}) t.push_back({n(k), {kv, d}});
    t.push_back({n(kToOut), {d, d}});
    for (const char* k : {kNormQ, kNormK, kNormAddedQ, kNormAddedK}) t.push_back({n(k), {hd}});
    if (!c.is_moe(i)) {
      const int64_t f = c.dense_inner();
      t.push_back({n(kMlpIn), {2 * f, d}});
      t.push_back({n(kMlpOut), {d, f}});
      continue;
    }
    const std::string p = block_name(i, kMoE);
    t.push_back({p + wmoe::kRouter, {E, 2 * d}});
    if (output_major) {
      t.push_back({p + wmoe::kGateUp, {E, 2 * I, d}});
      t.push_back({p + wmoe::kDown, {E, d, I}});
    } else {
      t.push_back({p + wmoe::kGateUp, {E, d, 2 * I}});
      t.push_back({p + wmoe::kDown, {E, I, d}});
    }
    t.push_back({p + wmoe::kSharedIn, {2 * I, d}});
    t.push_back({p + wmoe::kSharedOut, {d, I}});
  }
  return t;
}

}  // namespace flowkv::nucleus
