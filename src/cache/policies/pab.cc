// Pyramid Attention Broadcast (diffusers hooks/pyramid_attention_broadcast.py; spec caches.md
// §6): each block's attention output is recomputed every `skip`-th call while the timestep lies
// strictly inside (lo, hi), and broadcast (reused) on the calls between; outside the range every
// call computes. The call counter runs over every call of the block, in or out of the range.
// FLUX.2's and Qwen-Image's attentions are all self-attention over image tokens ("spatial").
// Approximate.
//
// State per block and CFG branch. diffusers keeps one state per attention module shared by
// every cache_context, so with separate cond/uncond calls its uncond call reuses the cond
// call's output (§6.3); flowkv follows the fixed behaviour: each branch broadcasts its own.
#include <map>

#include "cache/policy.h"
#include "cache/snapshot.h"
#include "flowkv/error.h"

namespace flowkv::cache {

namespace {

class PyramidAttentionBroadcast final : public Policy {
 public:
  PyramidAttentionBroadcast(PolicyOptions& o, const Topology&)
      : skip_(o.integer("skip", 2, kCount)),
        lo_(o.num("lo", 100, kTimestepBound)),
        hi_(o.num("hi", 800, kTimestepBound)) {
    FLOWKV_CHECK(skip_ >= 1, "pab: skip must be >= 1, got ", skip_);
    FLOWKV_CHECK(lo_ < hi_, "pab: the timestep range needs lo < hi");
  }
  std::string name() const override { return "pab"; }
  std::string describe() const override {
    return "pab skip=" + std::to_string(skip_) + " lo=" + std::to_string(lo_) +
           " hi=" + std::to_string(hi_);
  }

  void begin(const Streams&, Mat) override { first_ = true; }

  bool reuse(int block, Sublayer which) override {
    if (which != Sublayer::kAttention) return false;
    Module& m = modules_[{ctx_.branch, block}];
    const double t = ctx_.timestep;
    const bool in_range = lo_ < t && t < hi_;
    const bool compute = m.cache.empty() || m.iteration == 0 || !in_range ||
                         m.iteration % skip_ == 0 || must_compute();
    ++m.iteration;
    if (first_) log(compute ? 'C' : 'r'), first_ = false;
    (compute ? stats_.sublayers_computed : stats_.sublayers_reused)++;
    return !compute;
  }
  void store(int block, Sublayer which, const Streams& out) override {
    if (which == Sublayer::kAttention) modules_[{ctx_.branch, block}].cache = snapshot(out);
  }
  void fetch(int block, Sublayer, Streams& out) override {
    const Snapshot& v = modules_.at({ctx_.branch, block}).cache;
    FLOWKV_CHECK(fits(v, out), "pab: block ", block, "'s streams changed shape between calls");
    assign(out, v);
  }

 private:
  struct Module {
    int64_t iteration = 0;
    Snapshot cache;
  };
  int64_t skip_;
  double lo_, hi_;
  bool first_ = true;
  std::map<std::pair<int, int>, Module> modules_;  // (branch, block)
};

}  // namespace

void register_pab() {
  register_policy({"pab",
                   "Pyramid Attention Broadcast: reuses each block's attention output on all but "
                   "every skip-th call while lo < timestep < hi. Approximate. skip (2), lo (100), "
                   "hi (800).",
                   factory_of<PyramidAttentionBroadcast>()});
}

}  // namespace flowkv::cache
