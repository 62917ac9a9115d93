// The FLUX.2 transformer (Klein 4B / 9B / 9B KV, dev) as a library object.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "flowkv/profile.h"
#include "flowkv/tensor.h"
#include "flowkv/workspace.h"

namespace flowkv {

struct Flux2LoadOptions {
  // "auto" (bf16 compute when every weight is bf16, else f32), "f32" or "bf16".
  std::string dtype = "auto";
};

// One forward. Shapes in PyTorch order; ids are float tensors of integer positions.
struct Flux2Call {
  Tensor img;       // [B, N, in_channels]   target (noisy) latent tokens
  Tensor img_ids;   // [N, 4]                (T, H, W, L) positions
  Tensor txt;       // [B, L, joint_attention_dim]
  Tensor txt_ids;   // [L, 4]
  Tensor timestep;  // [B]   sigma in [0, 1]
  Tensor guidance;  // [B] or undefined
  // Debugging: check the inputs, every named intermediate and the output for NaN or infinity
  // and fail naming the first that holds one (slower: every intermediate is copied).
  bool check_finite = false;
};

class Flux2Transformer {
 public:
  // A diffusers transformer folder (single or sharded safetensors), a pipeline folder with
  // transformer/, or an original BFL single .safetensors file. Every tensor is checked
  // against the model's name table before anything is loaded.
  static Flux2Transformer load(const std::string& path, const Flux2LoadOptions& opts = {});
  // A built-in FLUX.2-shaped model with deterministic random weights ("tiny", "small").
  static Flux2Transformer builtin(const std::string& name, uint64_t seed = 0,
                                  const std::string& dtype = "f32");
  static std::vector<std::string> builtin_names();
  // Writes a built-in model as a diffusers-format folder (config.json + safetensors).
  static void write_builtin(const std::string& name, uint64_t seed, const std::string& dtype,
                            const std::string& dir);

  std::string variant() const;
  std::string config_json() const;
  std::string compute_dtype() const;  // "F32", "BF16" or "INT8"
  int64_t parameters() const;
  int64_t in_channels() const;
  int64_t text_channels() const;
  int64_t out_channels() const;
  int64_t width() const;
  int64_t layers() const;  // double + single blocks

  // The velocity for the target tokens: [B, N, out_channels].
  // `ws`: reuse one across calls to keep the heap out of the loop (a fresh one otherwise).
  Tensor forward(const Flux2Call& call, ForwardProfile* profile = nullptr,
                 Workspace* ws = nullptr) const;

  struct Impl;
  const Impl& impl() const { return *impl_; }

 private:
  std::shared_ptr<const Impl> impl_;
};

}  // namespace flowkv
