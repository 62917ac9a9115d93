// DBCache, "dual block cache" (cache-dit; diffusers documents it in optimization/cache_dit.md,
// spec caches.md §12): the first Fn blocks always run and measure the change; the last Bn blocks
// always run and correct; the blocks between are skipped when the residual of the first Fn
// blocks (target stream) changed by less than `threshold` (relative L1, strict "<") against the
// last call that computed them, and replaced by the residual they added in that call.
// Approximate. First `warmup` calls of a branch always compute; max_cached and max_continuous
// cap the skipped calls (-1: no cap). Fn=1, Bn=0 is FirstBlockCache with a strict "<".
#include <map>
#include <utility>

#include "cache/policy.h"
#include "cache/snapshot.h"
#include "flowkv/error.h"

namespace flowkv::cache {

namespace {

class DualBlockCache final : public Policy {
 public:
  DualBlockCache(PolicyOptions& o, const Topology& t)
      : fn_(static_cast<int>(o.integer("fn", 8, kCount))),
        bn_(static_cast<int>(o.integer("bn", 0, {0, 100000}))),
        threshold_(o.num("threshold", 0.08, kNonNegative)),
        warmup_(o.integer("warmup", 8, {0, 100000})),
        max_cached_(o.integer("max_cached", -1, kCountOrNone)),
        max_continuous_(o.integer("max_continuous", -1, kCountOrNone)),
        blocks_(static_cast<int>(t.blocks.size())) {
    FLOWKV_CHECK(fn_ >= 1 && bn_ >= 0 && fn_ + bn_ < blocks_, "dbcache: fn=", fn_, " and bn=", bn_,
                 " leave no block to cache in a model of ", blocks_,
                 " blocks (need fn >= 1, bn >= 0, fn + bn < ", blocks_, ")");
    FLOWKV_CHECK(warmup_ >= 0, "dbcache: warmup must be >= 0");
  }
  std::string name() const override { return "dbcache"; }
  std::string describe() const override {
    return "dbcache fn=" + std::to_string(fn_) + " bn=" + std::to_string(bn_) +
           " threshold=" + std::to_string(threshold_) + " warmup=" + std::to_string(warmup_) +
           " max_cached=" + std::to_string(max_cached_) +
           " max_continuous=" + std::to_string(max_continuous_);
  }

  void begin(const Streams& in, Mat) override {
    State& st = state();
    st.target = in.index_of("target");
    copy_into(st.head_in, in.s[static_cast<size_t>(st.target)], in.batch);
    st.skipping = false;
  }

  BlockAction before_block(int block, Streams&) override {
    const bool skip = state().skipping && block >= fn_ && block < blocks_ - bn_;
    (skip ? stats_.blocks_skipped : stats_.blocks_run)++;
    return skip ? BlockAction::kSkip : BlockAction::kRun;
  }

  void after_block(int block, Streams& s) override {
    State& st = state();
    if (block == fn_ - 1) decide(st, s);
    if (block == blocks_ - bn_ - 1 && !st.skipping)
      st.middle_res = minus(snapshot(s), st.front_out);
  }

 private:
  struct State {
    int64_t calls = 0, cached = 0, continuous = 0;
    StreamCopy head_in, front_now, front_ref;  // Fn residuals: this call's, the last computed
    Snapshot front_out, middle_res;
    int target = 0;
    bool skipping = false;
  };
  State& state() { return states_[ctx_.branch]; }

  // After the Fn front blocks: skip the middle (applying its last residual now) or run it.
  void decide(State& st, Streams& s) {
    residual_into(st.front_now, s.s[static_cast<size_t>(st.target)], s.batch, st.head_in);
    const bool capped = (max_cached_ >= 0 && st.cached >= max_cached_) ||
                        (max_continuous_ >= 0 && st.continuous >= max_continuous_);
    const bool skip = st.calls >= warmup_ && !must_compute() && !capped && !st.front_ref.empty() &&
                      fits(st.middle_res, s) &&
                      relative_l1(st.front_now, st.front_ref) < threshold_;
    ++st.calls;
    st.skipping = skip;
    log(skip ? 's' : 'C');
    (skip ? stats_.calls_skipped : stats_.calls_full)++;
    if (skip) {
      ++st.cached, ++st.continuous;
      add_into(s, st.middle_res);
    } else {
      st.continuous = 0;
      std::swap(st.front_ref, st.front_now);
      st.front_out = snapshot(s);
    }
  }

  int fn_, bn_;
  double threshold_;
  int64_t warmup_, max_cached_, max_continuous_;
  int blocks_;
  std::map<int, State> states_;  // per CFG branch
};

}  // namespace

void register_dbcache() {
  register_policy({"dbcache",
                   "DBCache (cache-dit): the first fn and last bn blocks always run; the middle "
                   "blocks are skipped while the front blocks' residual stays within threshold. "
                   "Approximate. fn (8), bn (0), threshold (0.08), warmup (8 calls), max_cached "
                   "(-1), max_continuous (-1).",
                   factory_of<DualBlockCache>()});
}

}  // namespace flowkv::cache
