// FORA (prathebaselva/FORA, boost_infer_static; spec caches.md §10): every `interval` steps the
// attention and MLP sublayers of every block are computed and their raw (pre-gate) outputs
// stored; on the steps between, the stored outputs are reused while modulation and gates are
// recomputed with the current timestep. With i = steps - 1 - step (FORA visits steps in reverse),
// a step refreshes when i == steps - 1 (the first) or i % interval == 0, which always includes the
// last step. Approximate. State per CFG branch.
#include <map>

#include "cache/policy.h"
#include "cache/snapshot.h"
#include "flowkv/error.h"

namespace flowkv::cache {

namespace {

class Fora final : public Policy {
 public:
  Fora(PolicyOptions& o, const Topology&) : interval_(o.integer("interval", 3, kCount)) {
    FLOWKV_CHECK(interval_ >= 1, "fora: interval must be >= 1, got ", interval_);
  }
  std::string name() const override { return "fora"; }
  std::string describe() const override { return "fora interval=" + std::to_string(interval_); }

  void begin(const Streams&, Mat) override {
    const int64_t i = ctx_.num_steps - 1 - ctx_.step;
    refresh_ = i == ctx_.num_steps - 1 || i % interval_ == 0 || must_compute();
    log(refresh_ ? 'C' : 'r');
    (refresh_ ? stats_.calls_full : stats_.calls_skipped)++;
  }

  bool reuse(int block, Sublayer which) override {
    const bool r = !refresh_ && stored_.count(key(block, which));
    (r ? stats_.sublayers_reused : stats_.sublayers_computed)++;
    return r;
  }
  void store(int block, Sublayer which, const Streams& out) override {
    stored_[key(block, which)] = snapshot(out);
  }
  void fetch(int block, Sublayer which, Streams& out) override {
    const Snapshot& v = stored_.at(key(block, which));
    FLOWKV_CHECK(fits(v, out), "fora: block ", block, "'s streams changed shape between steps");
    assign(out, v);
  }

 private:
  std::tuple<int, int, int> key(int block, Sublayer which) const {
    return {ctx_.branch, block, which == Sublayer::kMlp ? 1 : 0};
  }
  int64_t interval_;
  bool refresh_ = true;
  std::map<std::tuple<int, int, int>, Snapshot> stored_;  // (branch, block, sublayer)
};

}  // namespace

void register_fora() {
  register_policy({"fora",
                   "FORA: computes attention and MLP outputs every interval steps and reuses them "
                   "between (modulation and gates still recomputed). Approximate. interval (3).",
                   factory_of<Fora>()});
}

}  // namespace flowkv::cache
