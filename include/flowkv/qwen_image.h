// Qwen-Image-2.1 as a library object (diffusers QwenImage21Transformer2DModel). Denoising with
// its exact prefix KV cache (diffusers QwenImage21Pipeline) is flowkv::denoise (flowkv/model.h).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "flowkv/model.h"
#include "flowkv/predict.h"
#include "flowkv/profile.h"
#include "flowkv/tensor.h"
#include "flowkv/workspace.h"

namespace flowkv {

// One forward. Shapes in PyTorch order.
struct Qwen21Call {
  Tensor img;                      // [B, h*w, in_channels]  target (noisy) latent tokens
  int64_t height = 0, width = 0;   // the target's latent grid, in tokens
  Tensor txt;                      // [B, L, text_channels]  the vision-language sequence
  std::vector<uint8_t> txt_slots;  // [L] or empty: 1 where a row is a condition-image slot
                                   // (each stands for 2x2 condition latent tokens)
  Tensor txt_mask;                 // [B, L] of 0/1 (padding), or undefined: every row valid
  std::vector<ReferenceLatents> conditions;  // [B, h*w, in_channels] each, in slot order
  Tensor timestep;                           // [B]   sigma in [0, 1]
  // Debugging: check the inputs, every named intermediate and the output for NaN or infinity
  // and fail naming the first that holds one (slower: every intermediate is copied).
  bool check_finite = false;
};

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

  // The velocity for the target tokens: [B, h*w, C], C = the config's patch_size^2 x
  // out_channels (in_channels for released checkpoints).
  // `ws`: reuse one across calls to keep the heap out of the loop (a fresh one otherwise).
  Tensor forward(const Qwen21Call& call, ForwardProfile* profile = nullptr,
                 Workspace* ws = nullptr) const;

  struct Impl;
  const Impl& impl() const { return *impl_; }

 private:
  std::shared_ptr<const Impl> impl_;
};

}  // namespace flowkv
