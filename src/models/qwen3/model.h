// The Qwen3 text encoder (transformers Qwen3Model, as Qwen3ForCausalLM runs it with
// output_hidden_states=True): the FLUX.2 Klein prompt encoder. It computes hidden states only:
// no lm_head, no generation, no KV cache; layers past the last hidden state asked for at load
// are never read.
//
// Masks: query i of batch element b attends to keys j <= i whose mask is 1 (transformers'
// causal mask combined with the padding mask). With right padding, as the Klein pipeline pads
// to 512, every padded query row attends to all the real tokens, and the pipeline uses those
// rows: they are computed exactly as transformers computes them. A query row with no allowed
// key (only with left padding: a padded row before the first token) gets a zero attention
// output; transformers' result for such rows depends on its attention backend (sdpa and eager
// differ), so no reference defines them.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/exec_context.h"
#include "flowkv/tensor.h"
#include "io/checkpoint.h"
#include "models/qwen3/config.h"

namespace flowkv::qwen3 {

struct LoadOptions {
  // Compute type of the linear layers: `auto_dtype` picks BF16 when every weight read is BF16
  // (activations rounded to bf16 before each GEMM, f32 accumulation), else `compute`.
  bool auto_dtype = true;
  DType compute = DType::kF32;
  bool keep_plain = false;  // keep unpacked weights so the scalar reference path can run
  bool int8 = false;        // 8-bit integer linear layers (compute F32)
  // The highest hidden-state index the encoder will compute (Klein: 27). Layers at and past it
  // are neither validated for loading nor read; -1: every layer and the final norm.
  int64_t last_hidden_state = -1;
};

// One encode call's tokens: [B, L] ids and their attention mask (1 = token, 0 = padding; empty:
// all tokens). Positions are 0..L-1 whatever the mask says, as transformers numbers them.
struct EncodeArgs {
  std::span<const int32_t> ids;
  std::span<const int32_t> mask;
  int64_t batch = 1;
};

class Encoder {
 public:
  // A text_encoder/ folder (config.json with model.safetensors or its sharded index; diffusers
  // file names too), or a pipeline folder holding text_encoder/.
  static Encoder load(const std::string& path, const LoadOptions& opts = {});
  // From a scan with a known config; every tensor is checked against the name table.
  static Encoder from_scan(const CheckpointScan& scan, const Config& cfg, const LoadOptions& opts);

  const Config& config() const;
  DType compute_dtype() const;
  // The highest hidden-state index this encoder can compute.
  int64_t last_hidden_state() const;
  // Bytes the loaded weights occupy (embeddings as stored, linears as held, norms as f32).
  int64_t weight_bytes() const;

  // transformers' hidden_states[k] for each k of `indices` (0: the embeddings; k: the output
  // of layer k-1; num_hidden_layers: after the final norm), each an f32 [B, L, hidden_size]
  // tensor, in the order asked. Runs layers [0, max(indices)) only.
  std::vector<Tensor> hidden_states(const ExecContext& ctx, const EncodeArgs& args,
                                    std::span<const int64_t> indices) const;

  struct Weights;

 private:
  std::shared_ptr<const Weights> w_;
};

// The hidden states FLUX.2 Klein stacks (diffusers 0.42.1 Flux2KleinPipeline,
// text_encoder_out_layers default).
inline constexpr int64_t kKleinLayers[] = {9, 18, 27};

// diffusers' Flux2KleinPipeline._get_qwen3_prompt_embeds after tokenization: the hidden states
// of `layers` stacked per token on the channel axis, [B, L, n * hidden_size] (channel block i
// is layer i's state). The pipeline casts them to the text encoder's dtype: with bf16 compute
// the values are rounded to bf16 (kept in an f32 tensor).
Tensor klein_prompt_embeds(const ExecContext& ctx, const Encoder& enc, const EncodeArgs& args,
                           std::span<const int64_t> layers = kKleinLayers);

}  // namespace flowkv::qwen3
