// TeaCache (ali-vilab/TeaCache, TeaCache4FLUX; spec caches.md §9): the probe is block 0's
// modulated target input; its relative L1 change since the previous call, rescaled by a
// polynomial the model publishes, accumulates; while the sum stays below `threshold` (strict "<")
// every block is skipped and the target gets the residual of the last computed call (output - input
// of the block stack). The first and the last step always compute; the probe is remembered on every
// call, skipped or not. Approximate. State per CFG branch (TeaCache's Wan script keeps cond and
// uncond apart the same way).
#include <cmath>
#include <map>

#include "cache/policies/stack_residual.h"
#include "cache/policy.h"
#include "cache/snapshot.h"
#include "flowkv/error.h"

namespace flowkv::cache {

namespace {

// The rescaling polynomial (highest power first): the coefficients=a/b/c/d/e knob, else the one
// the model's family publishes in its topology ("teacache.coefficients").
std::vector<double> coefficients(PolicyOptions& o, const Topology& t) {
  const auto it = t.tables.find("teacache.coefficients");
  std::vector<double> c =
      o.list("coefficients", it != t.tables.end() ? it->second : std::vector<double>{});
  FLOWKV_CHECK(!c.empty() || !t.model_known, "teacache: ",
               t.model.empty() ? std::string("this model") : "model '" + t.model + "'",
               " publishes no coefficients; pass coefficients=a/b/c/d/e");
  return c;
}

class TeaCache final : public Policy {
 public:
  TeaCache(PolicyOptions& o, const Topology& t)
      : threshold_(o.num("threshold", 0.6, kNonNegative)), coef_(coefficients(o, t)) {}
  std::string name() const override { return "teacache"; }
  std::string describe() const override {
    std::string c;
    for (double v : coef_) c += (c.empty() ? "" : "/") + std::to_string(v);
    return "teacache threshold=" + std::to_string(threshold_) + " coefficients=" + c;
  }
  bool wants_probe() const override { return true; }

  void begin(const Streams& in, Mat probe) override {
    State& st = state();
    StreamCopy m = copy_mat(probe);
    bool compute = true;
    if (ctx_.step == 0 || ctx_.step == ctx_.num_steps - 1 || must_compute() || st.prev.empty() ||
        !st.stack.usable(in)) {
      st.acc = 0;
    } else {
      st.acc += rescale(relative_l1(m, st.prev));
      if (st.acc < threshold_) {
        compute = false;
      } else {
        st.acc = 0;
      }
    }
    st.prev = std::move(m);  // updated on every call
    st.stack.start(in, !compute);
    log(compute ? 'C' : 's');
    (compute ? stats_.calls_full : stats_.calls_skipped)++;
  }

  BlockAction before_block(int, Streams&) override { return state().stack.block(stats_); }
  void end(Streams& s) override { state().stack.finish(s); }

 private:
  struct State {
    double acc = 0;
    StreamCopy prev;  // the previous call's probe
    StackResidual stack;
  };
  State& state() { return states_[ctx_.branch]; }
  double rescale(double x) const {  // numpy poly1d: Horner from the highest power
    double y = 0;
    for (double c : coef_) y = y * x + c;
    return y;
  }

  double threshold_;
  std::vector<double> coef_;
  std::map<int, State> states_;
};

}  // namespace

void register_teacache() {
  register_policy(
      {"teacache",
       "TeaCache: skips every block while the rescaled, accumulated change of block "
       "0's modulated input stays below threshold; first and last step compute. "
       "Approximate. threshold (0.6), coefficients (the model's; FLUX.1's until its own "
       "are fitted).",
       factory_of<TeaCache>()});
}

}  // namespace flowkv::cache
