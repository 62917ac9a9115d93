// A call whose whole block stack is skipped and replaced by the residual (output - input) the
// stack added to the target on the last computed call: TeaCache and MagCache. One per branch.
#pragma once

#include "cache/policy.h"
#include "cache/snapshot.h"

namespace flowkv::cache {

class StackResidual {
 public:
  // Whether a residual is stored and fits this call's target (a changed token count computes).
  bool usable(const Streams& in) const {
    const Stream& t = in.s[static_cast<size_t>(in.index_of("target"))];
    return !residual_.empty() && residual_.batch == in.batch && residual_.seq == t.seq &&
           residual_.cols == t.x.cols;
  }
  // Starts a call: skip the stack, or compute it (remembering its input).
  void start(const Streams& in, bool skip) {
    target_ = in.index_of("target");
    skipping_ = skip;
    if (!skip) copy_into(input_, in.s[static_cast<size_t>(target_)], in.batch);
  }
  bool skipping() const { return skipping_; }
  // The block loop's question, counted in `stats`.
  BlockAction block(PolicyStats& stats) const {
    (skipping_ ? stats.blocks_skipped : stats.blocks_run)++;
    return skipping_ ? BlockAction::kSkip : BlockAction::kRun;
  }
  // Ends a call: adds the stored residual to the target, or stores the computed one.
  void finish(Streams& s) {
    Stream& target = s.s[static_cast<size_t>(target_)];
    if (skipping_) {
      add_into(target, s.batch, residual_);
    } else {
      residual_into(residual_, target, s.batch, input_);
    }
  }
  const StreamCopy& residual() const { return residual_; }

 private:
  StreamCopy input_, residual_;
  int target_ = 0;
  bool skipping_ = false;
};

}  // namespace flowkv::cache
