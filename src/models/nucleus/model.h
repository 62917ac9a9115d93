// NucleusMoE-Image (diffusers 0.42.1 NucleusMoEImageTransformer2DModel): a single stream of
// blocks over the image tokens only; the prompt enters each block as keys and values of its own
// (encoder_proj, add_k_proj / add_v_proj), read after the image keys under a key-only mask.
// Grouped-query attention; per-block [scale1, gate1, scale2, gate2] modulation with gates
// clamped to [-2, 2] then tanh; dense SwiGLU MLPs in the first blocks and mixture-of-experts
// MLPs (moe.h) in the others.
//
// The text K/V depend on the prompt, the weights and the grid (text RoPE positions start at
// max(h/2, w/2)), never on the timestep or the latents: they are an exact KV memory (diffusers'
// hooks/text_kv_cache.py). Attention reads them the same way whether they were computed this
// call or spliced: the live path rounds them into a memory of the same dtype first, so
// compute-and-store then splice gives the bits of compute.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "cache/hooks.h"
#include "core/exec_context.h"
#include "flowkv/tensor.h"
#include "models/nucleus/config.h"
#include "segments/segment_input.h"

namespace flowkv::nucleus {

struct LoadOptions {
  bool auto_dtype = true;  // BF16 compute when every weight is BF16
  DType compute = DType::kF32;
  bool keep_plain = false;
  bool int8 = false;  // 8-bit integer arithmetic in the linear layers (compute F32)
};

// One forward's arguments. Segments (segments/segment_input.h):
//  - exactly one kText: rows [B, L, joint_attention_dim], the prompt embeddings before
//    txt_norm; valid [B, L] or nullptr (every row valid); kv: route kCompute,
//    kComputeAndStore (into `store`: kv_layers() x B x L x kv_width() in kv_dtype()) or kSplice
//    (every block's text K/V read from `memory`; rows are not read). 1 <= L, and
//    max(h/2, w/2) + L <= 4096 (the reference's RoPE tables).
//  - exactly one kTarget: rows [B, h*w, in_channels] (packed latents), grid {h, w} in tokens,
//    route kCompute.
struct Args {
  int64_t batch = 1;
  std::vector<SegmentInput> segments;
  const float* timestep = nullptr;  // [B], in [0, 1]
  float* out = nullptr;             // [B, h*w, patch^2 * out_channels]
  // Approximate step caches (may skip blocks or reuse sublayer outputs of the image stream).
  cache::BlockHooks* hooks = nullptr;
};

class Model {
 public:
  // A diffusers transformer folder (config.json and safetensors shards, F32 or BF16; MoE
  // experts as diffusers stores them) or a GGUF file written by `flowkv quantize` (config in
  // its flowkv.config metadata; MoE experts output-major).
  static Model load(const std::string& path, const LoadOptions& opts = {});
  // Tensors named as the checkpoint's, MoE experts as diffusers stores them.
  static Model from_tensors(const std::map<std::string, Tensor>& tensors, const Config& c,
                            const LoadOptions& opts = {});

  const Config& config() const;
  DType compute_dtype() const;
  int64_t kv_layers() const { return config().num_layers; }
  int64_t kv_width() const { return config().kv_dim(); }
  DType kv_dtype() const { return compute_dtype(); }
  // Bytes the weights occupy as held.
  int64_t weight_bytes() const;

  void forward(const ExecContext& ctx, const Args& args) const;
  // The num_layers blocks of the image stream, for step-cache policies (text is no stream: it
  // enters every block as constant K/V).
  cache::Topology topology() const;

  struct Weights;

 private:
  std::shared_ptr<const Weights> w_;
};

}  // namespace flowkv::nucleus
