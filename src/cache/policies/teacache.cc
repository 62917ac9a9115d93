// TeaCache (ali-vilab/TeaCache, TeaCache4FLUX; spec caches.md §9): the probe is block 0's
// modulated target input; its relative L1 change since the previous call, rescaled by a
// per-model polynomial, accumulates; while the sum stays below `threshold` (strict "<") every
// block is skipped and the target gets the residual of the last computed call
// (output - input of the block stack). The first and the last step always compute; the probe is
// remembered on every call, skipped or not. Approximate. State per CFG branch (TeaCache's Wan
// script keeps cond and uncond apart the same way).
#include <cmath>
#include <map>

#include "cache/policies/stack_residual.h"
#include "cache/policy.h"
#include "cache/snapshot.h"
#include "flowkv/error.h"

namespace flowkv::cache {

namespace {

// Rescaling polynomials, highest power first. Only FLUX.1's is calibrated (TeaCache4FLUX);
// FLUX.2 and Qwen-Image-2.1 use it too until someone fits theirs (ComfyUI-TeaCache and
// vLLM-omni do the same for Qwen-Image). Override with coefficients=a/b/c/d/e.
const std::map<std::string, std::vector<double>>& coefficient_table() {
  static const std::vector<double> flux1 = {498.651651, -283.781631, 55.8554382, -3.82021401,
                                            0.264230861};
  static const std::map<std::string, std::vector<double>> t = {
      {"flux1", flux1}, {"flux2", flux1}, {"qwen21", flux1}};
  return t;
}

class TeaCache final : public Policy {
 public:
  TeaCache(PolicyOptions& o, const Topology& t)
      : threshold_(o.num("threshold", 0.6, kNonNegative)) {
    const auto& table = coefficient_table();
    const std::string model = o.str("model", t.model);
    auto it = table.find(model);
    FLOWKV_CHECK(it != table.end() || o.str("coefficients", "").size(),
                 "teacache: no coefficients for model '", model, "'; pass coefficients=a/b/c/d/e");
    coef_ = o.list("coefficients", it != table.end() ? it->second : std::vector<double>{});
    FLOWKV_CHECK(!coef_.empty(), "teacache: coefficients must not be empty");
  }
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
  register_policy({"teacache",
                   "TeaCache: skips every block while the rescaled, accumulated change of block "
                   "0's modulated input stays below threshold; first and last step compute. "
                   "Approximate. threshold (0.6), coefficients (per model; FLUX.1's), model.",
                   factory_of<TeaCache>()});
}

}  // namespace flowkv::cache
