// TeaCache (ali-vilab/TeaCache, TeaCache4FLUX; spec caches.md §9): the probe is block 0's
// modulated target input; its relative L1 change since the previous call, rescaled by a
// polynomial the model publishes, accumulates; while the sum stays below `threshold` (strict "<")
// every block is skipped and the target gets the residual of the last computed call (output - input
// of the block stack). The first and the last step always compute; the probe is remembered on every
// call, skipped or not. Approximate. State per CFG branch (TeaCache's Wan script keeps cond and
// uncond apart the same way).
//
// calibrate=1 never skips and records, at every call after a branch's first, the pair TeaCache's
// polynomial is fitted on (ali-vilab/TeaCache issue #2: np.polyfit(x, y, 4) over every step of
// many prompts): x, the relative L1 change of the probe since the branch's previous call (what
// the policy rescales), and y, that of the model's output (the velocity, seen through
// observe_output). `flowkv calibrate` fits the polynomial over many requests.
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <utility>

#include "cache/policies/stack_residual.h"
#include "cache/policy.h"
#include "cache/snapshot.h"
#include "flowkv/calibrate.h"
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
      : threshold_(o.num("threshold", 0.6, kNonNegative)),
        calibrate_(o.flag("calibrate", false)),
        // Calibration needs no polynomial: it measures what one is fitted on.
        coef_(calibrate_ ? o.list("coefficients", {}) : coefficients(o, t)) {}
  std::string name() const override { return "teacache"; }
  std::string describe() const override {
    if (calibrate_) return "teacache calibrate";
    std::string c;
    for (double v : coef_) c += (c.empty() ? "" : "/") + std::to_string(v);
    return "teacache threshold=" + std::to_string(threshold_) + " coefficients=" + c;
  }
  bool wants_probe() const override { return true; }

  void begin(const Streams& in, Mat probe) override {
    if (calibrate_) return calibrate_begin(probe);
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

  BlockAction before_block(int, Streams&) override {
    if (!calibrate_) return state().stack.block(stats_);
    stats_.blocks_run++;
    return BlockAction::kRun;
  }
  void end(Streams& s) override {
    if (!calibrate_) state().stack.finish(s);
  }

  void observe_output(const StepContext& ctx, const float* v, int64_t count) override {
    if (!calibrate_) return;
    State& st = states_[ctx.branch];
    StreamCopy& out = st.out;  // reuses its buffer: no allocation per call after the first
    out.batch = 1, out.seq = 1, out.cols = count;
    out.v.assign(v, v + count);
    if (std::isfinite(st.pending_x) && same_shape(out, st.prev_out)) {
      const double y = relative_l1(out, st.prev_out);
      if (std::isfinite(y)) {
        Pairs& p = pairs_[ctx.branch];
        p.x.push_back(st.pending_x);
        p.y.push_back(y);
      }
    }
    st.pending_x = kNone;
    std::swap(st.prev_out, out);
  }

  std::string report() const override {
    std::string out;
    for (const auto& [branch, p] : pairs_) {
      out += "\n[TeaCache] Calibration: " + std::to_string(p.x.size()) +
             " pairs (x: relative L1 change of block 0's modulated input, y: of the model "
             "output; fit y = poly(x) with flowkv calibrate)" +
             (branch == 1 ? " [uncond]" : "") + "\n";
      for (size_t i = 0; i < p.x.size(); ++i) {
        char line[80];
        std::snprintf(line, sizeof line, "%.9g %.9g\n", p.x[i], p.y[i]);
        out += line;
      }
    }
    return out;
  }
  std::vector<StepCacheSeries> measured() const override {
    std::vector<StepCacheSeries> m;
    for (const auto& [branch, p] : pairs_) {
      m.push_back({"teacache.x", branch, p.x});
      m.push_back({"teacache.y", branch, p.y});
    }
    return m;
  }

 private:
  static constexpr double kNone = std::numeric_limits<double>::quiet_NaN();
  struct State {
    double acc = 0;
    StreamCopy prev;  // the previous call's probe
    StackResidual stack;
    // Calibration: this call's x until its output arrives, the previous call's output, and the
    // buffer the next output is copied into (swapped with prev_out).
    double pending_x = kNone;
    StreamCopy prev_out, out;
  };
  struct Pairs {
    std::vector<double> x, y;
  };
  // A request's first step starts afresh (no pair spans two requests); a changed token count
  // gives no pair (relative_l1 is infinite across shapes).
  void calibrate_begin(Mat probe) {
    State& st = state();
    StreamCopy m = copy_mat(probe);
    if (ctx_.step == 0) st.prev = StreamCopy{}, st.prev_out = StreamCopy{};
    st.pending_x = st.prev.empty() ? kNone : relative_l1(m, st.prev);
    st.prev = std::move(m);
    log('C');
    stats_.calls_full++;
  }
  State& state() { return states_[ctx_.branch]; }
  double rescale(double x) const { return polyval(coef_, x); }

  double threshold_;
  bool calibrate_;
  std::vector<double> coef_;
  std::map<int, State> states_;
  std::map<int, Pairs> pairs_;  // calibration, per branch
};

}  // namespace

void register_teacache() {
  register_policy(
      {"teacache",
       "TeaCache: skips every block while the rescaled, accumulated change of block "
       "0's modulated input stays below threshold; first and last step compute. "
       "Approximate. threshold (0.6), coefficients (the model's; FLUX.1's until its own "
       "are fitted), calibrate (off: never skips, records the pairs `flowkv calibrate` fits "
       "coefficients on).",
       factory_of<TeaCache>()});
}

}  // namespace flowkv::cache
