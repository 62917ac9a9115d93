// Qwen-Image-2.1 as a library object, and its denoising loop with the exact prefix KV cache
// (diffusers QwenImage21Pipeline), from prompt embeddings, condition latents and noise.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "flowkv/klein_kv.h"
#include "flowkv/predict.h"
#include "flowkv/tensor.h"
#include "flowkv/workspace.h"

namespace flowkv {

class QwenImage21Transformer {
 public:
  // A diffusers transformer folder (config.json + safetensors); dtype "auto", "f32" or "bf16".
  static QwenImage21Transformer load(const std::string& path, const std::string& dtype = "auto");
  // Built-in models with deterministic random weights ("qwen21-tiny", "qwen21-small").
  static QwenImage21Transformer builtin(const std::string& name, uint64_t seed = 0,
                                        const std::string& dtype = "f32");
  static std::vector<std::string> builtin_names();

  std::string variant() const;
  std::string config_json() const;
  std::string compute_dtype() const;
  int64_t in_channels() const;
  int64_t text_channels() const;
  bool causal_condition() const;

  struct Impl;
  const Impl& impl() const { return *impl_; }

 private:
  std::shared_ptr<const Impl> impl_;
};

struct QwenPrompt {
  Tensor embeds;               // [B, L, context_in_dim]: the vision-language sequence
  std::vector<uint8_t> slots;  // [L]: 1 where a row is a condition-image slot (2x2 latents each)
  Tensor mask;                 // [B, L] of 0/1 (padding), or undefined: every row valid
};

struct Qwen21Inputs {
  QwenPrompt prompt;
  QwenPrompt negative;                       // embeds undefined: no classifier-free guidance
  float cfg_scale = 1.0f;                    // true CFG when > 1 and a negative prompt is given
  std::vector<ReferenceLatents> conditions;  // condition-image latents [B, h*w, in_channels]
  Tensor noise;                              // [B, h*w, in_channels]
  int64_t height = 0, width = 0;             // target latent grid
};

struct Qwen21Options {
  int steps = 40;
  bool use_cache = true;       // the exact prefix cache (needs causal_condition)
  bool batch_cfg = true;       // both branches in one forward when their layouts match
  std::vector<double> sigmas;  // a fixed grid (sample_sigmas); sets the step count
  int64_t kv_budget_bytes = -1;
  // Approximate step caches composed with the prefix cache (see step_cache_policies()); with
  // any, the CFG branches run as separate calls with their own state.
  std::vector<std::string> step_caches;
  std::function<void(int step, int steps)> on_step;
};

DenoiseResult denoise_qwen21(const QwenImage21Transformer& model, const Qwen21Inputs& in,
                             const Qwen21Options& opts, Workspace* ws = nullptr);
int64_t kv_bytes_needed(const QwenImage21Transformer& model, const Qwen21Inputs& in,
                        const Qwen21Options& opts);

// The cost model for this layout: text tokens after the condition images, target last.
KVPrediction predict_qwen21(const QwenImage21Transformer& m, int64_t text_tokens,
                            const std::vector<int64_t>& condition_tokens, int64_t target_tokens,
                            int steps, bool cfg);
// From a config alone: `config` is a config.json, a checkpoint folder, or "" for the released
// shape (32 layers x 4096); bf16 K/V.
KVPrediction predict_qwen21_shape(const std::string& config, int64_t text_tokens,
                                  const std::vector<int64_t>& condition_tokens,
                                  int64_t target_tokens, int steps, bool cfg);
// True when the file or folder holds a Qwen-Image-2.1 transformer config.
bool is_qwen21_config(const std::string& path);

}  // namespace flowkv
