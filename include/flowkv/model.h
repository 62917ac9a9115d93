// Any registered model family through one handle: load a checkpoint or a built-in model,
// denoise, predict, run one forward. The family is detected from config.json (or the built-in
// name); nothing here names a family. FLUX.2 (Klein, Klein KV, dev) and Qwen-Image-2.1 are
// registered today; docs/architecture.md says how to add one.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "flowkv/predict.h"
#include "flowkv/profile.h"
#include "flowkv/step_cache.h"
#include "flowkv/store.h"
#include "flowkv/tensor.h"
#include "flowkv/workspace.h"

namespace flowkv {

class Flux2Transformer;
class QwenImage21Transformer;

// What a family offers, for tools to choose defaults and describe it without naming it.
struct FamilyInfo {
  std::string name;                  // short name: "flux2", "qwen21" (bench --family)
  std::vector<std::string> aliases;  // other names family_info() takes ("klein")
  std::string title;                 // "FLUX.2 (Klein 4B / 9B / 9B KV, dev)"
  std::string exact_cache;  // what its exact cache keeps: "reference", "prefix (text + ...)"
  std::string images;       // what its conditioning images are called: "reference", "condition"
  std::vector<std::string> builtins;  // built-in models (random weights)
  std::string default_builtin;        // the one benchmarks use by default
  std::vector<std::string> released;  // released shapes `predict` knows by name
  int default_steps = 4;              // DenoiseOptions::steps = 0 means this
  std::vector<int> bench_steps;       // benchmark defaults
  std::vector<int> bench_images;
  bool true_cfg = false;        // runs an unconditional branch (negative prompt, cfg_scale)
  bool text_kv_approx = false;  // offers the named approximation text-kv-approx
  int64_t grid_multiple = 1;    // latent grids' token count must be a multiple of this
  bool takes_images = true;     // a request may carry conditioning images (NucleusMoE-Image: no)
  // Without an exact cache: why none applies and what it would take (predict prints it).
  std::string no_exact_cache;
};

// Every registered family, in registration order. (Not `families()`: that is the internal
// namespace flowkv::families of the registry.)
std::vector<FamilyInfo> registered_families();
// By short name or alias; throws a flowkv::Error listing the names when there is none.
const FamilyInfo& family_info(const std::string& name);
// The family of a checkpoint (folder, pipeline folder, config.json or single file), a built-in
// model name or a released shape name. Throws naming what was looked at when none matches.
const FamilyInfo& detect_family(const std::string& model);

// Latents of one conditioning image: a reference (FLUX.2 Klein) or a condition image
// (Qwen-Image-2.1).
struct ReferenceLatents {
  Tensor latents;  // [B, h*w, in_channels]: packed, normalised latents
  int64_t height = 0, width = 0;
};

// A prompt as the transformer takes it.
struct PromptEmbeds {
  Tensor embeds;               // [B, L, text_channels]
  std::vector<uint8_t> slots;  // [L] or empty: 1 where a row is a condition-image slot
                               // (Qwen-Image-2.1's vision-language sequence, 2x2 latents each)
  Tensor mask;                 // [B, L] of 0/1 (padding), or undefined: every row valid
};

struct DenoiseInputs {
  PromptEmbeds prompt;
  PromptEmbeds negative;                     // embeds undefined: no classifier-free guidance
  float cfg_scale = 1.0f;                    // true CFG when > 1 and a negative prompt is given
  std::vector<ReferenceLatents> references;  // conditioning images, in order
  Tensor noise;                              // [B, h*w, in_channels] packed initial latents
  int64_t height = 0, width = 0;             // target latent grid, in tokens
};

enum class KVMode {
  kCached,     // the first step computes the cacheable segments and stores their K/V; later
               // steps splice them from the request's memory (exact)
  kRecompute,  // the uncached baseline: the same rules, everything recomputed every step
};

// One options struct for every family's denoising loop.
struct DenoiseOptions {
  int steps = 0;               // 0: the family's default (FamilyInfo::default_steps)
  std::vector<double> sigmas;  // a fixed sigma grid (sample_sigmas); sets the step count
  KVMode mode = KVMode::kCached;
  bool cache_text = false;       // ask for exact text caching: refused naming the broken rules
                                 // where the text is not cacheable
  bool text_kv_approx = false;   // the named approximation: reuse step-0 text K/V
  bool batch_cfg = true;         // both CFG branches in one forward when their layouts match
  int64_t kv_budget_bytes = -1;  // refuse before the run when the caches need more (-1: none)
  // Approximate step caches composed with the exact cache, e.g. {"taylorseer:interval=2"}
  // (see step_cache_policies()). Empty: none.
  std::vector<std::string> step_caches;
  std::function<void(int step, int steps)> on_step;  // progress, after each step
  // Polled before each step: true stops the loop with flowkv::Cancelled (generate.h).
  std::function<bool()> cancelled;
  // Called after each step with the x0 estimate latents - sigma * velocity, [B, h*w, C]
  // packed as the latents (previews); the tensor is reused: valid during the call only.
  std::function<void(int step, int steps, const Tensor& x0)> on_estimate;
  // The exact conditioning K/V shared across requests (store.h): a request whose conditioning
  // was seen before splices it from the first step on, bit-identical to computing it.
  std::shared_ptr<ReferenceStore> store;
  // Called once the store has been asked, before the first step: how many of the request's
  // conditioning memories it held.
  std::function<void(int64_t hits, int64_t misses)> on_store_lookup;
};

struct DenoiseResult {
  Tensor latents;  // [B, h*w, in_channels]
  std::vector<float> sigmas;
  std::vector<double> step_seconds;  // transformer time per step
  double transformer_seconds = 0;
  double loop_seconds = 0;   // the whole loop: set-up, schedule, transformer, scheduler steps
  int64_t kv_bytes = 0;      // the request's KV memory payload (all branches)
  bool approximate = false;  // the named text-KV approximation was used
  bool cfg = false;          // an unconditional branch ran
  bool batched_cfg = false;  // both branches ran as one batched forward
  std::vector<StepCacheStats> step_caches;
  // The reference store's "kv" keys this run used (hex SHA-256), and how many were found.
  std::vector<std::string> store_keys;
  int64_t store_hits = 0, store_misses = 0;
};

// Writes a built-in model as a diffusers-format folder (config.json + safetensors) that load()
// reads back; dtype "f32" or "bf16". Throws when its family cannot write one.
// Writes a released shape (e.g. "klein-9b-kv") or built-in with all-zero weights as a diffusers
// folder whose data are holes of sparse files (no disk used for them): real-size memory and
// load checks without the real weights. dtype "f32" or "bf16".
void export_zero_weights(const std::string& name, const std::string& dtype, const std::string& dir);
void export_builtin(const std::string& name, uint64_t seed, const std::string& dtype,
                    const std::string& dir);

class Model {
 public:
  // A checkpoint of any registered family (diffusers folder, pipeline folder with
  // transformer/, sharded or single safetensors, GGUF); dtype (the compute) "auto", "f32",
  // "bf16" or "int8" (8-bit integer arithmetic in the linear layers).
  static Model load(const std::string& path, const std::string& dtype = "auto");
  // A built-in model with deterministic random weights (see FamilyInfo::builtins).
  static Model builtin(const std::string& name, uint64_t seed = 0,
                       const std::string& dtype = "f32");
  // The family handles convert implicitly.
  Model(const Flux2Transformer& m);        // NOLINT(google-explicit-constructor)
  Model(const QwenImage21Transformer& m);  // NOLINT(google-explicit-constructor)

  const FamilyInfo& family() const;
  std::string variant() const;
  std::string config_json() const;
  std::string compute_dtype() const;  // "F32", "BF16" or "INT8"
  int64_t in_channels() const;
  int64_t text_channels() const;

  struct Impl;
  const Impl& impl() const { return *impl_; }
  explicit Model(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}

 private:
  std::shared_ptr<const Impl> impl_;
};

DenoiseResult denoise(const Model& model, const DenoiseInputs& in, const DenoiseOptions& opts,
                      Workspace* ws = nullptr);
// Bytes the request's KV memories will hold (checked like denoise, nothing allocated).
int64_t kv_bytes_needed(const Model& model, const DenoiseInputs& in, const DenoiseOptions& opts);

// One uncached forward of the conditional branch at sigma (in [0, 1]): the velocity
// [B, h*w, in_channels]. check_finite: fail naming the first intermediate holding NaN or inf.
struct ForwardOptions {
  float sigma = 0.75f;
  bool check_finite = false;
};
Tensor forward(const Model& model, const DenoiseInputs& in, const ForwardOptions& opts = {},
               ForwardProfile* profile = nullptr, Workspace* ws = nullptr);

// Deterministic random inputs of a request's shape (benchmarks, smoke tests).
struct ExampleShape {
  int64_t batch = 1;
  int64_t text_tokens = 64;
  int64_t height = 16, width = 16;                      // target grid, in tokens
  std::vector<std::pair<int64_t, int64_t>> references;  // (height, width) grids
  bool cfg = false;                                     // a negative prompt and cfg_scale 4
  uint64_t seed = 0;
};
DenoiseInputs example_inputs(const Model& model, const ExampleShape& shape);

// Checks step-cache specs against this model: names, knob values, and what needs the model
// (DBCache's block counts, the tables TeaCache and MagCache read). Throws a flowkv::Error.
void check_step_caches(const std::vector<std::string>& specs, const Model& model);

// The cost model for this model's token layout (text, conditioning images, target).
KVPrediction predict(const Model& model, int64_t text_tokens,
                     const std::vector<int64_t>& image_tokens, int64_t target_tokens, int steps,
                     bool cfg);

}  // namespace flowkv
