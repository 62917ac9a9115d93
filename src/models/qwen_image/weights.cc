#include "models/qwen_image/weights.h"

namespace flowkv::qwen {

std::vector<ExpectedTensor> weight_table(const Config21& c) {
  const int64_t d = c.dim(), m = c.mlp_hidden(), hd = c.attention_head_dim;
  using namespace w21;
  std::vector<ExpectedTensor> t = {
      {kTime1, {d, 256}},
      {kTime2, {d, d}},
      {kTextNorm, {c.context_in_dim}},
      {kTextIn, {d, c.context_in_dim}},
      {kTextOut, {d, d}},
      {kImgIn, {d, c.in_channels * c.patch_size * c.patch_size}},
      {kModulation, {4 * d, d}},
      {kNormOut, {d, d}},
      {kProjOut, {c.out_features(), d}},
  };
  for (int64_t i = 0; i < c.num_layers; ++i) {
    for (const char* n : {kToQ, kToK, kToV, kToOut}) t.push_back({block_name(i, n), {d, d}});
    t.push_back({block_name(i, kNormQ), {hd}});
    t.push_back({block_name(i, kNormK), {hd}});
    t.push_back({block_name(i, kGate), {m, d}});
    t.push_back({block_name(i, kProj), {m, d}});
    t.push_back({block_name(i, kOut), {d, m}});
  }
  return t;
}

std::vector<ExpectedTensor> weight_table(const ConfigQwenImage& c) {
  const int64_t d = c.dim(), f = c.mlp_hidden(), hd = c.attention_head_dim;
  using namespace wqi;
  std::vector<ExpectedTensor> t;
  auto linear = [&](const std::string& base, int64_t out, int64_t in) {
    t.push_back({base + ".weight", {out, in}});
    t.push_back({base + ".bias", {out}});
  };
  linear(kTime1, d, 256);
  linear(kTime2, d, d);
  t.push_back({kTxtNorm, {c.joint_attention_dim}});
  linear(kImgIn, d, c.in_channels);
  linear(kTxtIn, d, c.joint_attention_dim);
  linear(kNormOut, 2 * d, d);
  linear(kProjOut, c.out_features(), d);
  for (int64_t i = 0; i < c.num_layers; ++i) {
    linear(block_name(i, kImgMod), 6 * d, d);
    linear(block_name(i, kTxtMod), 6 * d, d);
    for (const char* n : {kToQ, kToK, kToV, kAddQ, kAddK, kAddV, kToOut, kToAddOut}) {
      linear(block_name(i, n), d, d);
    }
    linear(block_name(i, kImgMlpIn), f, d);
    linear(block_name(i, kImgMlpOut), d, f);
    linear(block_name(i, kTxtMlpIn), f, d);
    linear(block_name(i, kTxtMlpOut), d, f);
    for (const char* n : {kNormQ, kNormK, kNormAddedQ, kNormAddedK})
      t.push_back({block_name(i, n), {hd}});
  }
  return t;
}

}  // namespace flowkv::qwen
