// Qwen-Image-2.1 (diffusers QwenImage21Transformer2DModel): one stream of 32 blocks over
// [text with condition images spliced in (the prefix), target], block-causal attention, one
// shared scale/gate modulation with tanh gates; under causal_condition every prefix token is
// modulated from t = 0.
//
// The prefix and the target run as separate segments (their own GEMMs, their own attention
// calls; the target's keys come as [prefix, target] in both modes), so a target row is computed
// the same way whether the prefix is live or spliced from its memory: the prefix cache is
// bit-exact here, where diffusers' is not. A live prefix is computed lazily: a block of it runs
// only when its K/V are stored or read by a target block that attends this call.
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
#include "segments/segment_input.h"

namespace flowkv::qwen {

struct LoadOptions21 {
  bool auto_dtype = true;  // BF16 compute when every weight is BF16
  DType compute = DType::kF32;
  bool keep_plain = false;
  bool int8 = false;  // 8-bit integer arithmetic in the linear layers (compute F32)
};

// One forward's arguments. The sequence is a list of segments (segments/segment_input.h):
//  - at most one text segment (kText): the vision-language rows [B, L, context_in_dim], slots
//    [L] (1 where a row is a condition-image slot of 2x2 latent tokens; those rows are not
//    used), valid [B, L] or nullptr (every row valid);
//  - the condition images (kReference), in the order of their slots: rows [B, h*w,
//    in_channels] and grid;
//  - one target (kTarget): rows [B, h*w, in_channels], grid, the step's time, route compute.
// The prefix - the text with the condition images spliced into its slots - is computed, stored
// and spliced as ONE KV memory: the text segment carries its route and memory, and every
// condition segment must declare the same route (its own store/memory unset or the text's).
// Text and conditions are modulated from the fixed time 0 under causal_condition, else by the
// step's time (prefix_time() says which). In splice the prefix's rows are not read, but its
// tokens, slots, validity and grids still place the target (RoPE) and mask its keys.
struct Args21 {
  int64_t batch = 1;
  std::vector<SegmentInput> segments;
  const float* timestep = nullptr;  // [B], in [0, 1]
  float* out = nullptr;             // [B, T, out_features]: the target's velocity
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
  // The time that modulates the prefix segments (text, conditions) of this checkpoint.
  SegmentTime prefix_time() const { return {config().causal_condition, 0.0f}; }
  // The 32 (num_layers) joint blocks, for step-cache policies.
  cache::Topology topology() const;

  struct Weights;

 private:
  std::shared_ptr<const Weights> w_;
};

}  // namespace flowkv::qwen
