// FirstBlockCache (diffusers hooks/first_block_cache.py; spec caches.md §3): block 0 always
// runs; if its residual on the target stream changed by at most `threshold` (relative L1)
// against the last fully computed call, every later block is skipped and the stack's output is
// block 0's output plus the residual the other blocks added in that last full call.
// Approximate. State per CFG branch.
#include <map>
#include <utility>

#include "cache/policy.h"
#include "cache/snapshot.h"

namespace flowkv::cache {

namespace {

class FirstBlockCache final : public Policy {
 public:
  FirstBlockCache(PolicyOptions& o, const Topology& t)
      : threshold_(o.num("threshold", 0.05, kNonNegative)),
        last_(static_cast<int>(t.blocks.size()) - 1) {}
  std::string name() const override { return "fbcache"; }
  std::string describe() const override {
    return "fbcache threshold=" + std::to_string(threshold_);
  }

  void begin(const Streams& in, Mat) override {
    State& s = state();
    const int t = in.index_of("target");
    copy_into(s.head_in, in.s[static_cast<size_t>(t)], in.batch);
    s.target = t;
    s.skipping = false;
  }

  BlockAction before_block(int block, Streams&) override {
    if (block == 0) return BlockAction::kRun;
    const bool skip = state().skipping;
    (skip ? stats_.blocks_skipped : stats_.blocks_run)++;
    return skip ? BlockAction::kSkip : BlockAction::kRun;
  }

  void after_block(int block, Streams& s) override {
    State& st = state();
    if (block == 0) {
      ++stats_.blocks_run;
      residual_into(st.r_now, s.s[static_cast<size_t>(st.target)], s.batch, st.head_in);
      // Strict ">": a change equal to the threshold skips (§14). Prefill calls always compute.
      const bool compute = st.r_ref.empty() || must_compute() || !fits(st.tail_res, s) ||
                           relative_l1(st.r_now, st.r_ref) > threshold_;
      if (compute) {
        st.head_out = snapshot(s);
        std::swap(st.r_ref, st.r_now);  // the reference moves only on computed calls (§3.3)
      }
      st.skipping = !compute;
      log(compute ? 'C' : 's');
      (compute ? stats_.calls_full : stats_.calls_skipped)++;
    }
    if (block == last_ && !st.skipping) st.tail_res = minus(snapshot(s), st.head_out);
  }

  void end(Streams& s) override {
    State& st = state();
    if (st.skipping) add_into(s, st.tail_res);
  }

 private:
  struct State {
    StreamCopy head_in, r_ref, r_now;  // r_now: this call's head residual
    Snapshot head_out, tail_res;
    int target = 0;
    bool skipping = false;
  };
  State& state() { return states_[ctx_.branch]; }

  double threshold_;
  int last_;
  std::map<int, State> states_;  // per CFG branch
};

}  // namespace

void register_fbcache() {
  register_policy({"fbcache",
                   "FirstBlockCache: skips every block after the first when the first block's "
                   "residual barely changed. Approximate. threshold (0.05).",
                   factory_of<FirstBlockCache>()});
}

}  // namespace flowkv::cache
