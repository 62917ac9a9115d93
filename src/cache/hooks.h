// The two narrow interfaces approximate step caches use (design.md, "Caches: two interfaces").
//
// Block hooks: the model's block loop asks, before each block, whether to run it; after each
// block it reports the streams; before the first block it hands over the probe (the first
// block's modulated input). Inside a block, the outputs of its attention and MLP sublayers can
// be reused instead of computed. Streams are the segments that change with the step (FLUX.2:
// text and target; Qwen-Image-2.1: the target): segments cached exactly (references, the
// prefix) are never skipped, so an exact cache's K/V stay exact under any policy.
//
// Step hooks: the pipeline asks whether to run a CFG branch at all this step (FasterCache's
// unconditional skipping) and lets the policy fill a skipped branch's velocity. At the loop
// level it asks whether to run the step's model calls at all (MeanCache): a skipped step runs
// no branch, and the policy writes the velocity the Euler step consumes.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/mat.h"

namespace flowkv::cache {

// Where one model call sits in the request.
struct StepContext {
  int step = 0;  // 0-based denoising step
  int num_steps = 1;
  float sigma = 1;        // the scheduler's sigma of this step
  float sigma_next = 0;   // the sigma the Euler step moves to (0 after the last step)
  float timestep = 1000;  // sigma * 1000, the scale diffusers' callbacks see
  int branch = 0;         // 0: conditional (or the only branch), 1: unconditional
  bool cfg = false;       // the request runs an unconditional branch too
  bool prefill = false;   // this call stores an exact cache: hooks must not skip
  // The latent this step denoises, as the scheduler holds it: the target's packed tokens
  // [batch, h * w, channels], grid rows first (SeaCache filters it). Valid during the call;
  // x is null where no latent is known (a scripted block stack).
  struct Latents {
    const float* x = nullptr;
    int64_t batch = 0, h = 0, w = 0, channels = 0;
  } latents;
};

// The residual streams a block loop carries, as views of the model's activations.
// Rows of batch element b of stream s start at s.x.row(b * s.batch_rows).
struct Stream {
  std::string name;  // "text", "target"
  Mat x;
  int64_t seq = 0;
  int64_t batch_rows = 0;  // 0: seq
  int64_t row(int64_t b) const { return b * (batch_rows > 0 ? batch_rows : seq); }
};

struct Streams {
  int64_t batch = 1;
  std::vector<Stream> s;
  int index_of(const std::string& name) const;
};

enum class Sublayer { kAttention, kMlp };

// A model's blocks in loop order, and what its probe is.
struct BlockInfo {
  std::string name;              // "transformer_blocks.0", "single_transformer_blocks.3"
  std::string kind;              // "double", "single", "joint"
  bool has_mlp_sublayer = true;  // FLUX.2 single blocks fuse attention and MLP in one output
};
struct Topology {
  std::vector<BlockInfo> blocks;
  std::string probe = "first block's modulated input of the target stream";
  std::string model;  // a name for messages ("flux2"); no policy selects anything by it
  // The tables the model's family publishes for step caches, by key: "teacache.coefficients"
  // (TeaCache's rescaling polynomial), "magcache.ratios" (MagCache's default ratios, when
  // calibrated) and "magcache.ratios.NAME" (ratios=NAME). Policies read tables only here.
  std::map<std::string, std::vector<double>> tables;
  // False when no model is known (check_step_caches without one): policies check their knobs
  // and leave what needs the model (its tables) to the request.
  bool model_known = true;
};

enum class BlockAction { kRun, kSkip };

class BlockHooks {
 public:
  virtual ~BlockHooks() = default;
  // Called once per model call before any block (the step is known from set_step). `probe` is
  // the first block's modulated input of the target stream (valid only during the call).
  virtual void begin(const Streams& in, Mat probe) {}
  // Run block i, or skip it (its streams stay as they are; the policy restores what the
  // skipped blocks would have added, here or in end()). May modify the streams.
  virtual BlockAction before_block(int block, Streams& s) { return BlockAction::kRun; }
  virtual void after_block(int block, Streams& s) {}
  // Whether block i reuses the given sublayer's outputs (for every stream) instead of
  // computing them; if so, fetch() fills them, else store() sees the computed ones. `out` has
  // the layout of the residual streams (one entry per stream, same rows).
  virtual bool reuse(int block, Sublayer which) { return false; }
  virtual void fetch(int block, Sublayer which, Streams& out) {}
  virtual void store(int block, Sublayer which, const Streams& out) {}
  virtual void end(Streams& s) {}
  // Whether begin() needs the probe (it costs one modulated LayerNorm).
  virtual bool wants_probe() const { return false; }
};

class StepHooks {
 public:
  virtual ~StepHooks() = default;
  // False: skip this branch's model call this step; fill_branch() then provides its output.
  virtual bool run_branch(const StepContext& ctx) { return true; }
  // A skipped unconditional branch: out = f(conditional output). grid: target latent h, w.
  virtual void fill_branch(const StepContext& ctx, const float* cond, float* out, int64_t batch,
                           int64_t tokens, int64_t channels, int64_t h, int64_t w) {}
  // Both branches were computed this step.
  virtual void observe_branches(const StepContext& ctx, const float* cond, const float* uncond,
                                int64_t batch, int64_t tokens, int64_t channels, int64_t h,
                                int64_t w) {}
  // A branch's model output (its velocity, `count` floats [batch, tokens, channels]) after a
  // call that ran, whatever its blocks did; valid during the call only (TeaCache calibration).
  virtual void observe_output(const StepContext& ctx, const float* v, int64_t count) {}

  // Loop level, once per step before any branch (ctx.branch 0; ctx.prefill: some branch stores
  // an exact cache this step). False: no model call runs this step, for any branch, and
  // fill_velocity() writes `v`, the velocity the Euler step consumes (after guidance, `count`
  // floats [batch, tokens, channels]), from `latents`, the latents the step starts from.
  virtual bool run_step(const StepContext& ctx) { return true; }
  virtual void fill_velocity(const StepContext& ctx, const float* latents, float* v,
                             int64_t count) {}
  // Every step, computed or filled, just before the Euler update x += (sigma_next - sigma) v:
  // the latents it starts from and the velocity it consumes.
  virtual void observe_step(const StepContext& ctx, const float* latents, const float* v,
                            int64_t count) {}
};

}  // namespace flowkv::cache
