// MagCache (diffusers hooks/mag_cache.py; spec caches.md §5): from a table of per-step
// magnitude ratios (the residual's norm against the previous step's), the error of reusing the
// last residual accumulates; while it stays within `threshold` and at most `max_skip` steps in a
// row, every block (block 0 included) is skipped and the target gets
// input + residual of the last computed step. The text stream passes through unchanged, as in
// diffusers. The first int(retention * n + 0.5) steps never skip. Approximate.
//
// calibrate=1 never skips and measures the ratios (the mean over tokens of
// ||r_t|| / (||r_{t-1}|| + 1e-8)), printed after the run in the form diffusers prints them.
// Ratios come as ratios=a/b/c/..., or by the name of a table the model's family publishes in its
// topology (ratios=flux1: diffusers' FLUX_MAG_RATIOS, measured on FLUX.1 at 28 steps), and are
// resampled to the run's step count with diffusers' nearest_interp. Arithmetic in float32 as
// diffusers does with list input. State per branch.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>

#include "cache/policies/stack_residual.h"
#include "cache/policy.h"
#include "cache/snapshot.h"
#include "flowkv/error.h"

namespace flowkv::cache {

namespace {

// ", published: a, b" for the named ratio tables of the topology, or "".
std::string published_names(const Topology& t) {
  const std::string prefix = "magcache.ratios.";
  std::string names;
  for (const auto& [key, values] : t.tables) {
    if (key.rfind(prefix, 0) == 0) names += (names.empty() ? "" : ", ") + key.substr(prefix.size());
  }
  return names.empty() ? "" : " (published: " + names + ")";
}

// The ratios: the ratios= knob as a list (a/b/c/...) or as the name of a table the model's
// family publishes ("magcache.ratios.NAME"); without the knob, the family's own calibrated
// ratios ("magcache.ratios") when it publishes them.
std::vector<double> ratios_of(PolicyOptions& o, const Topology& t) {
  const std::string given = o.str("ratios", "");
  char* end = nullptr;
  (void)std::strtod(given.c_str(), &end);
  // A list starts with a number (nan and inf included: the list parser refuses them).
  if (!given.empty() && end != given.c_str())
    return PolicyOptions::parse("r=" + given).list("r", {});
  const auto it = t.tables.find(given.empty() ? "magcache.ratios" : "magcache.ratios." + given);
  if (it != t.tables.end()) return it->second;
  FLOWKV_CHECK(given.empty() || !t.model_known, "magcache: this model publishes no ratios named '",
               given, "'", published_names(t));
  return {};
}

// diffusers' nearest_interp: idx = round_half_even(float32(i) * float32((S-1)/(T-1))).
std::vector<float> nearest_interp(const std::vector<double>& src, int n) {
  std::vector<float> out;
  const int S = static_cast<int>(src.size());
  if (n == 1) return {static_cast<float>(src.back())};
  const float scale = static_cast<float>(S - 1) / static_cast<float>(n - 1);
  for (int i = 0; i < n; ++i) {
    const float x = static_cast<float>(i) * scale;
    const int idx = static_cast<int>(std::nearbyint(x));  // default rounding: half to even
    out.push_back(static_cast<float>(src[static_cast<size_t>(std::min(idx, S - 1))]));
  }
  return out;
}

// Python's repr of a float32 value widened to double (the form diffusers' print shows).
std::string python_float(float v) {
  char buf[64];
  for (int prec = 1; prec <= 17; ++prec) {
    std::snprintf(buf, sizeof buf, "%.*g", prec, static_cast<double>(v));
    if (std::strtod(buf, nullptr) == static_cast<double>(v)) break;
  }
  std::string s = buf;
  if (s.find_first_of(".en") == std::string::npos) s += ".0";
  return s;
}

class MagCache final : public Policy {
 public:
  MagCache(PolicyOptions& o, const Topology& t)
      : threshold_(static_cast<float>(o.num("threshold", 0.06, kNonNegative))),
        max_skip_(o.integer("max_skip", 3, {0, 100000})),
        retention_(o.num("retention", 0.2, kFraction)),
        calibrate_(o.flag("calibrate", false)),
        ratios_(ratios_of(o, t)) {
    FLOWKV_CHECK(calibrate_ || !ratios_.empty() || !t.model_known,
                 "magcache needs its magnitude ratios: (1) run once with magcache:calibrate=1 "
                 "(it prints the ratios), (2) pass them as magcache:ratios=1.0/1.37/..., or use "
                 "a table the model publishes by name",
                 published_names(t),
                 " (flux1: measured on FLUX.1 at 28 steps; other models differ)");
    FLOWKV_CHECK(max_skip_ >= 0 && retention_ >= 0,
                 "magcache: max_skip and retention must be >= 0");
  }
  std::string name() const override { return "magcache"; }
  std::string describe() const override {
    return "magcache threshold=" + std::to_string(threshold_) +
           " max_skip=" + std::to_string(max_skip_) + " retention=" + std::to_string(retention_) +
           (calibrate_ ? " calibrate" : " ratios=" + std::to_string(ratios_.size()) + " values");
  }

  void begin(const Streams& in, Mat) override {
    State& st = state();
    const int n = ctx_.num_steps;
    if (!calibrate_ && st.ratios.size() != static_cast<size_t>(n))
      st.ratios = nearest_interp(ratios_, n);
    bool compute = true;
    if (!calibrate_) {
      const int i = st.step_index;
      const float ratio =
          i < static_cast<int>(st.ratios.size()) ? st.ratios[static_cast<size_t>(i)] : 1.0f;
      const int retain = static_cast<int>(retention_ * n + 0.5);
      if (i >= retain) {
        st.acc_ratio *= ratio;
        st.acc_steps += 1;
        st.acc_err += std::fabs(1.0f - st.acc_ratio);
        // "<=" on both tests (§14); a residual of another shape is never applied.
        if (st.stack.usable(in) && !must_compute() && st.acc_err <= threshold_ &&
            st.acc_steps <= max_skip_) {
          compute = false;
        } else {
          st.acc_ratio = 1.0f, st.acc_steps = 0, st.acc_err = 0.0f;
        }
      }
    }
    st.stack.start(in, !compute);
    log(compute ? 'C' : 's');
    (compute ? stats_.calls_full : stats_.calls_skipped)++;
  }

  BlockAction before_block(int, Streams&) override { return state().stack.block(stats_); }

  void end(Streams& s) override {
    State& st = state();
    if (calibrate_) {  // diffusers: 1.0 for the first computed step, then the norm ratio
      const StreamCopy previous = st.stack.residual();
      st.stack.finish(s);
      const StreamCopy& r = st.stack.residual();
      st.calibration.push_back(previous.empty() || !same_shape(r, previous)
                                   ? 1.0f
                                   : static_cast<float>(mean_norm_ratio(r, previous)));
    } else {
      st.stack.finish(s);
    }
    advance(st);
  }

  std::string report() const override {
    std::string out;
    for (const auto& [branch, lines] : printed_) out += lines;
    return out;
  }
  std::vector<StepCacheSeries> measured() const override { return measured_; }

 private:
  struct State {
    int step_index = 0, acc_steps = 0;
    float acc_ratio = 1.0f, acc_err = 0.0f;
    std::vector<float> ratios, calibration;
    StackResidual stack;
  };
  State& state() { return states_[ctx_.branch]; }

  // diffusers' advance(): after num_steps tail calls the state resets (and calibration prints).
  void advance(State& st) {
    if (++st.step_index < ctx_.num_steps) return;
    if (calibrate_) {
      std::string list;
      for (float v : st.calibration) list += (list.empty() ? "" : ", ") + python_float(v);
      measured_.push_back({"magcache.ratios", ctx_.branch,
                           std::vector<double>(st.calibration.begin(), st.calibration.end())});
      printed_[ctx_.branch] +=
          std::string(ctx_.cfg ? (ctx_.branch == 0 ? "[cond]" : "[uncond]") : "") +
          "\n[MagCache] Calibration Complete. Copy these values to "
          "MagCacheConfig(mag_ratios=...):\n[" +
          list + "]\n\n";
    }
    st = State{};
  }

  float threshold_;
  int64_t max_skip_;
  double retention_;
  bool calibrate_;
  std::vector<double> ratios_;
  std::map<int, State> states_;
  std::map<int, std::string> printed_;
  std::vector<StepCacheSeries> measured_;  // each completed calibration, in order
};

}  // namespace

void register_magcache() {
  register_policy({"magcache",
                   "MagCache: skips every block while the error accumulated from the per-step "
                   "magnitude ratios stays within threshold. Approximate. threshold (0.06), "
                   "max_skip (3), retention (0.2), ratios (required: a/b/c list, or a table the "
                   "model publishes: flux1), "
                   "calibrate (off: measures and prints the ratios).",
                   factory_of<MagCache>()});
}

}  // namespace flowkv::cache
