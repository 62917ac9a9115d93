// Denoising with FLUX.2 Klein 9B KV's exact reference cache (diffusers Flux2KleinKVPipeline),
// from text embeddings, reference latents and initial noise (text encoder and VAE are outside).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "flowkv/flux2.h"
#include "flowkv/step_cache.h"
#include "flowkv/tensor.h"
#include "flowkv/workspace.h"

namespace flowkv {

struct ReferenceLatents {
  Tensor latents;  // [B, h*w, in_channels]: packed, normalised reference latents
  int64_t height = 0, width = 0;
};

enum class KVMode {
  kCached,     // step 0 computes the references and stores their K/V; later steps reuse them
  kRecompute,  // the uncached baseline: same rules, references recomputed at every step
};

struct DenoiseInputs {
  Tensor text;                    // [B, L, joint_attention_dim]
  Tensor noise;                   // [B, h*w, in_channels] packed initial latents
  int64_t height = 0, width = 0;  // target latent grid, in tokens
  std::vector<ReferenceLatents> references;
};

struct DenoiseOptions {
  int steps = 4;
  KVMode mode = KVMode::kCached;
  bool cache_text = false;       // exact text caching: refused, naming the broken rules
  bool text_kv_approx = false;   // the named approximation: reuse step-0 text K/V
  int64_t kv_budget_bytes = -1;  // refuse before the run when the cache needs more (-1: none)
  // Approximate step caches composed with the exact cache, e.g. {"taylorseer:interval=2"}
  // (see step_cache_policies()). Empty: none.
  std::vector<std::string> step_caches;
  std::function<void(int step, int steps)> on_step;
};

struct DenoiseResult {
  Tensor latents;  // [B, h*w, in_channels]
  std::vector<float> sigmas;
  std::vector<double> step_seconds;  // transformer time per step
  double transformer_seconds = 0;
  double loop_seconds = 0;   // the whole loop: set-up, schedule, transformer, scheduler steps
  int64_t kv_bytes = 0;      // the request's KV memory payload
  bool approximate = false;  // the named text-KV approximation was used
  std::vector<StepCacheStats> step_caches;
};

DenoiseResult denoise_klein_kv(const Flux2Transformer& model, const DenoiseInputs& in,
                               const DenoiseOptions& opts, Workspace* ws = nullptr);

// Bytes the request's KV memories will hold.
int64_t kv_bytes_needed(const Flux2Transformer& model, const DenoiseInputs& in,
                        const DenoiseOptions& opts);

}  // namespace flowkv
