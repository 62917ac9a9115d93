// The FLUX.2 transformer (diffusers Flux2Transformer2DModel): FLUX.2 Klein 4B / 9B / 9B KV
// and FLUX.2 dev. One forward computes what diffusers computes, in f32 activations with f32 or
// bf16 weights.
//
// Segments. The target (noisy image) tokens are always computed. Text is computed, or - for
// the named approximation text-kv-approx - read from a memory. Reference images follow the
// Klein KV rules (they attend to references only and are modulated from a fixed timestep):
// computed live (optionally storing their K/V), or not computed at all with their K/V read from
// a memory. Live references are computed lazily: a block of theirs runs only when its K/V are
// stored or read by a text or target block that attends this call.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "cache/hooks.h"
#include "cache/kv_memory.h"
#include "core/exec_context.h"
#include "models/flux2/config.h"
#include "models/flux2/weights.h"
#include "ops/linear.h"
#include "segments/segment_input.h"

namespace flowkv::flux2 {

struct LoadOptions {
  // Compute type of the linear layers. kF32 always works; kBF16 multiplies bf16-rounded
  // activations with bf16 weights and accumulates in f32. `auto_dtype` picks BF16 when every
  // weight in the files is BF16, else F32.
  bool auto_dtype = true;
  DType compute = DType::kF32;
  bool keep_plain = false;  // keep unpacked weights so the scalar reference path can run
  bool int8 = false;        // 8-bit integer arithmetic in the linear layers (compute F32)
};

// One forward's arguments. The sequence is a list of segments (segments/segment_input.h):
//  - exactly one target (kTarget): rows [B, N, in_channels], ids [N, 4] (T, H, W, L), modulated
//    by the step's time, route kCompute;
//  - one text segment (kText): rows [B, L, joint_attention_dim], ids [L, 4], the step's time.
//    Route kCompute, kComputeAndStore, or - for the named approximation text-kv-approx -
//    kSplice (rows and ids then unused);
//  - any number of references (kReference), under the Klein KV rules: rows [B, R_i,
//    in_channels], ids [R_i, 4], one fixed time. They run as ONE reference stream (concatenated
//    in the order given; they attend to references only), so they share one time and one KV
//    route, and one memory that holds all their K/V in that order.
// Each live segment runs through its own GEMM and attention calls, so a target row sees exactly
// the same computation whether the references are live or spliced from memory.
struct ForwardArgs {
  int64_t batch = 1;
  std::vector<SegmentInput> segments;
  // Per batch element: sigma in [0, 1] (the model multiplies by 1000), guidance or nullptr.
  const float* timestep = nullptr;
  const float* guidance = nullptr;
  // Output velocity [B, N, out_features].
  float* out = nullptr;
  // Approximate step caches (may skip blocks or reuse sublayer outputs of the text and target
  // streams; never the references). nullptr: every block runs.
  cache::BlockHooks* hooks = nullptr;
};

class Model {
 public:
  // Loads a diffusers folder, pipeline folder or BFL single file; validates every tensor.
  static Model load(const std::string& path, const LoadOptions& opts = {});
  // Builds from an opened source with a known config (validated against its table).
  static Model from_source(const WeightSource& src, const Config& cfg, const LoadOptions& opts);

  const Config& config() const;
  DType compute_dtype() const;
  // Number of K/V layers (double blocks, then single blocks) and their width.
  int64_t kv_layers() const { return config().num_blocks(); }
  int64_t kv_width() const { return config().dim(); }
  // The dtype cached K/V are kept in: what the attention of this model reads.
  DType kv_dtype() const { return compute_dtype(); }
  int64_t weight_bytes() const;

  void forward(const ExecContext& ctx, const ForwardArgs& args) const;
  // Double blocks then single blocks, for step-cache policies.
  cache::Topology topology() const;

  struct Weights;  // defined in model_weights.h

 private:
  std::shared_ptr<const Weights> w_;
};

// Selects the compute dtype LoadOptions asks for, given the files' dtypes.
DType choose_compute_dtype(const WeightSource& src, const LoadOptions& opts);

}  // namespace flowkv::flux2
