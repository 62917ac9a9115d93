// Qwen-Image-2.1 (diffusers QwenImage21Transformer2DModel): one stream of 32 blocks over
// [text with condition images spliced in (the prefix), target], block-causal attention, one
// shared scale/gate modulation with tanh gates; under causal_condition every prefix token is
// modulated from t = 0.
//
// The prefix and the target run as separate segments (their own GEMMs, their own attention
// calls; the target's keys come as [prefix, target] in both modes), so a target row is computed
// the same way whether the prefix is live or spliced from its memory: the prefix cache is
// bit-exact here, where diffusers' is not.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "cache/hooks.h"
#include "cache/kv_memory.h"
#include "core/exec_context.h"
#include "models/qwen_image/config.h"
#include "models/qwen_image/layout21.h"
#include "ops/linear.h"

namespace flowkv::qwen {

struct LoadOptions21 {
  bool auto_dtype = true;  // BF16 compute when every weight is BF16
  DType compute = DType::kF32;
  bool keep_plain = false;
};

struct PrefixKV {
  KVMemory* store = nullptr;         // prefill: compute the prefix and store its K/V
  const KVMemory* memory = nullptr;  // decode: the prefix is not computed; K/V come from here
};

struct Args21 {
  int64_t batch = 1;
  // The vision-language sequence: [B, L, context_in_dim] rows; slots[L] marks condition-image
  // slots (their rows are not used); text_valid [B, L] or nullptr (all valid).
  const float* text = nullptr;
  int64_t text_len = 0;
  const uint8_t* slots = nullptr;
  const uint8_t* text_valid = nullptr;
  // Condition-image latents [B, sum h*w, in_channels] (in order) and their grids.
  const float* cond = nullptr;
  std::vector<Grid> cond_grids;
  // The target latents [B, h*w, in_channels].
  const float* target = nullptr;
  Grid target_grid;
  const float* timestep = nullptr;  // [B], in [0, 1]
  PrefixKV prefix_kv;
  float* out = nullptr;         // [B, T, out_features]: the target's velocity
  float* prefix_out = nullptr;  // optional [B, P, out_features] (diffusers returns it in prefill)
  // Approximate step caches (may skip blocks or reuse sublayer outputs of the target; never the
  // prefix). nullptr: every block runs.
  cache::BlockHooks* hooks = nullptr;
};

class Model21 {
 public:
  static Model21 load(const std::string& path, const LoadOptions21& opts = {});
  static Model21 from_tensors(const std::map<std::string, Tensor>& tensors, const Config21& c,
                              const LoadOptions21& opts);

  const Config21& config() const;
  DType compute_dtype() const;
  int64_t kv_layers() const { return config().num_layers; }
  int64_t kv_width() const { return config().dim(); }
  DType kv_dtype() const { return compute_dtype(); }

  void forward(const ExecContext& ctx, const Args21& args) const;
  // The 32 (num_layers) joint blocks, for step-cache policies.
  cache::Topology topology() const;

  struct Weights;

 private:
  std::shared_ptr<const Weights> w_;
};

}  // namespace flowkv::qwen
