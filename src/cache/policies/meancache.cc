// MeanCache (Gao et al., ICLR 2026, "From Instantaneous to Average Velocity for Accelerating
// Flow Matching Inference", arXiv 2601.19961; reference code UnicomAI/MeanCache at 2e12280, a
// replacement __call__ for diffusers' QwenImagePipeline): a loop-level step cache. A fixed
// schedule says which steps run the model (every CFG branch); on the others no model call runs
// and the Euler step consumes an *average* velocity over the step's interval instead of an
// instantaneous one, built from the velocities of the steps before:
//
//   skipped step k, span K, L = min(K, k), j = k - L:
//     u   = (x_k - x_j) / (sigma_k - sigma_j)        the mean velocity over the last L steps
//     jvp = (v_j - u) / (sigma_k - sigma_j)          a finite-difference (cached) JVP
//     v_k = v_{k-1} - jvp * (sigma_{k+1} - sigma_k)
//
// where v are the velocities the Euler steps consumed (after guidance: the reference caches the
// CFG-combined prediction), computed or themselves filled. Span 1 makes jvp vanish up to
// rounding (the last velocity is reused); jvp=0 reuses it outright (the reference's
// cache_jvp=False). The schedule: schedule=0/1/3/.../49 with spans=K0/K1/... (the span of the
// steps skipped after each computed step; 0, the reference's "chain", only where none are), a
// table the model's family publishes by name (schedule=qwen-image-b10: the reference's own
// tables), a searched one (flowkv calibrate --policy meancache, from calibrate=1's measurements),
// or budget=B alone: B steps spread evenly, first and last included, every span `span`. The
// first and the last step always run. State per request: one trajectory (the velocity is the
// guided one, shared by the branches). Approximate.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <deque>
#include <string>
#include <vector>

#include "cache/policy.h"
#include "flowkv/error.h"

namespace flowkv::cache {

namespace {

constexpr int kMaxSpan = 16;  // the reference's tables use spans up to 6

// ", published: a, b" for the named schedules of the topology, or "".
std::string published_names(const Topology& t) {
  const std::string prefix = "meancache.schedule.";
  std::string names;
  for (const auto& [key, values] : t.tables) {
    if (key.rfind(prefix, 0) == 0) names += (names.empty() ? "" : ", ") + key.substr(prefix.size());
  }
  return names.empty() ? "" : " (published: " + names + ")";
}

std::vector<int> integers(const std::vector<double>& v, const char* what, int lo, int hi) {
  std::vector<int> out;
  for (double d : v) {
    FLOWKV_CHECK(d == std::floor(d) && d >= lo && d <= hi, "meancache: ", what, " value ", d,
                 " is not an integer in [", lo, ", ", hi, "]");
    out.push_back(static_cast<int>(d));
  }
  return out;
}

std::string joined(const std::vector<int>& v) {
  std::string s;
  for (int x : v) s += (s.empty() ? "" : "/") + std::to_string(x);
  return s;
}

// The reference's update for a skipped step (see the file comment), in float32 in its order.
void mean_velocity(const float* x, const float* x_start, const float* v_start, const float* v_last,
                   float sigma_start, float sigma, float sigma_next, float* v, int64_t n) {
  const float denom = sigma - sigma_start;
  const float dt = sigma_next - sigma;
  for (int64_t i = 0; i < n; ++i) {
    const float mean = (x[i] - x_start[i]) / denom;
    const float jvp = (v_start[i] - mean) / denom;
    const float step = jvp * dt;
    v[i] = v_last[i] - step;
  }
}

class MeanCache final : public Policy {
 public:
  MeanCache(PolicyOptions& o, const Topology& t)
      : budget_(o.integer("budget", 0, kCount)),
        span_(static_cast<int>(o.integer("span", 2, {1, kMaxSpan}))),
        jvp_(o.flag("jvp", true)),
        calibrate_(o.flag("calibrate", false)),
        blocks_(static_cast<int64_t>(t.blocks.size())) {
    const bool gap_given = !o.str("max_gap", "").empty();
    const bool span_max_given = !o.str("max_span", "").empty();
    max_gap_ = static_cast<int>(o.integer("max_gap", 12, {2, 100}));
    max_span_ = static_cast<int>(o.integer("max_span", 6, {1, kMaxSpan}));
    const std::string given = o.str("schedule", "");
    const bool spans_given = !o.str("spans", "").empty();
    const std::vector<double> spans = o.list("spans", {});
    FLOWKV_CHECK(calibrate_ || (!gap_given && !span_max_given),
                 "meancache: max_gap and max_span go with calibrate=1 (they bound what it "
                 "measures)");
    FLOWKV_CHECK(!calibrate_ || (given.empty() && budget_ == 0 && !spans_given),
                 "meancache: calibrate=1 computes every step and measures; it takes no schedule, "
                 "spans or budget (flowkv calibrate --policy meancache --budget B searches one)");
    FLOWKV_CHECK(!spans_given || !given.empty(),
                 "meancache: spans= goes with a schedule=0/1/... list");
    if (given.empty()) return;
    char* end = nullptr;
    (void)std::strtod(given.c_str(), &end);
    if (end != given.c_str()) {  // a list starts with a number
      plan_ = integers(PolicyOptions::parse("schedule=" + given).list("schedule", {}), "schedule",
                       0, 1000000);
      spans_ = spans_given ? integers(spans, "spans", 0, kMaxSpan)
                           : std::vector<int>(plan_.size(), span_);
    } else {
      FLOWKV_CHECK(!spans_given,
                   "meancache: a named schedule brings its own spans; spans= goes "
                   "with a schedule=0/1/... list");
      const auto it = t.tables.find("meancache.schedule." + given);
      FLOWKV_CHECK(it != t.tables.end() || !t.model_known,
                   "meancache: this model publishes no schedule named '", given, "'",
                   published_names(t));
      if (it == t.tables.end()) return;  // no model yet: checked when a request starts
      plan_ = integers(it->second, "schedule", 0, 1000000);
      const auto sp = t.tables.find("meancache.spans." + given);
      spans_ = sp != t.tables.end() ? integers(sp->second, "spans", 0, kMaxSpan)
                                    : std::vector<int>(plan_.size(), span_);
      name_ = given;
    }
    check_plan();
    FLOWKV_CHECK(budget_ == 0 || budget_ == static_cast<int64_t>(plan_.size()),
                 "meancache: budget=", budget_, " but the schedule computes ", plan_.size(),
                 " steps");
  }

  std::string name() const override { return "meancache"; }
  std::string describe() const override {
    if (calibrate_) {
      return "meancache calibrate max_gap=" + std::to_string(max_gap_) +
             " max_span=" + std::to_string(max_span_);
    }
    std::string d = "meancache";
    if (!name_.empty()) d += " schedule=" + name_;
    const std::vector<int>& c = resolved_.empty() ? plan_ : computed_steps();
    if (!c.empty()) d += " budget=" + std::to_string(c.size()) + " steps=" + joined(c);
    if (!spans_.empty()) d += " spans=" + joined(spans_);
    if (c.empty()) d += budget_ > 0 ? " budget=" + std::to_string(budget_) : " budget=40%";
    if (spans_.empty()) d += " span=" + std::to_string(span_);
    return d + (jvp_ ? "" : " jvp=0");
  }
  std::string report() const override { return report_; }
  std::vector<StepCacheSeries> measured() const override { return measured_; }

  // The schedule is fixed by the knobs: the skipped steps' every model call is saved.
  std::optional<ExpectedWork> expected(int steps, int branches) const override {
    if (calibrate_)
      return ExpectedWork{0, false, "calibration: every step computes", "model calls"};
    MeanCache plan = *this;  // resolving a run's plan touches only the plan
    plan.resolve(steps);
    const std::vector<int> c = plan.computed_steps();
    const int skipped = steps - static_cast<int>(c.size());
    return ExpectedWork{static_cast<double>(skipped) / steps, false,
                        "computes steps " + joined(c) + " (" + std::to_string(c.size()) + " of " +
                            std::to_string(steps) + "): " + std::to_string(skipped * branches) +
                            " model calls skipped, their velocity averaged over the interval",
                        "model calls"};
  }

  bool run_step(const StepContext& ctx) override {
    if (ctx.step == 0 || ctx.num_steps != static_cast<int>(resolved_.size())) {
      resolve(ctx.num_steps);
      history_.clear();
    }
    const int k = ctx.step;
    const bool have = !history_.empty() && history_.back().step == k - 1;
    const bool compute =
        calibrate_ || must_compute() || !have || resolved_[static_cast<size_t>(k)].compute;
    log(compute ? 'C' : 's');
    const int64_t calls = ctx.cfg ? 2 : 1;
    if (compute) {
      stats_.calls_full += calls, stats_.blocks_run += calls * blocks_;
    } else {
      stats_.calls_skipped += calls, stats_.blocks_skipped += calls * blocks_;
    }
    return compute;
  }

  void fill_velocity(const StepContext& ctx, const float* latents, float* v,
                     int64_t count) override {
    const Seen& last = history_.back();
    FLOWKV_CHECK(static_cast<int64_t>(last.v.size()) == count,
                 "meancache: the latents changed "
                 "size within a request");
    if (!jvp_) {
      std::copy(last.v.begin(), last.v.end(), v);
      return;
    }
    const int span = resolved_[static_cast<size_t>(ctx.step)].span;
    const int back = std::min({span, ctx.step, static_cast<int>(history_.size())});
    const Seen& start = history_[history_.size() - static_cast<size_t>(back)];
    mean_velocity(latents, start.x.data(), start.v.data(), last.v.data(), start.sigma,
                  last.sigma_next, ctx.sigma_next, v, count);
  }

  void observe_step(const StepContext& ctx, const float* latents, const float* v,
                    int64_t count) override {
    if (!history_.empty() && static_cast<int64_t>(history_.back().v.size()) != count)
      history_.clear();
    // The oldest entry the window would drop after this one is recycled: its buffers take this
    // step's latents and velocity without a new allocation.
    Seen seen;
    if (!calibrate_ && !history_.empty() && static_cast<int>(history_.size()) >= keep_) {
      seen = std::move(history_.front());
      history_.pop_front();
    }
    seen.step = ctx.step, seen.sigma = ctx.sigma, seen.sigma_next = ctx.sigma_next;
    seen.x.assign(latents, latents + count);
    seen.v.assign(v, v + count);
    history_.push_back(std::move(seen));
    if (calibrate_) {
      if (ctx.step == ctx.num_steps - 1 && static_cast<int>(history_.size()) == ctx.num_steps)
        measure_costs();
      return;
    }
    while (static_cast<int>(history_.size()) > keep_) history_.pop_front();
  }

 private:
  struct Step {
    bool compute = true;
    int span = 1;  // a skipped step's span
  };
  struct Seen {  // a step as the Euler update consumed it
    int step = 0;
    float sigma = 0, sigma_next = 0;
    std::vector<float> x, v;
  };

  // The static rules of a schedule: it starts at step 0, ascends, and a skipped interval has a
  // span of at least 1 (the reference indexes past its log with "chain" there).
  void check_plan() const {
    FLOWKV_CHECK(!plan_.empty() && plan_[0] == 0,
                 "meancache: a schedule starts with step 0 (nothing to reuse before it)");
    for (size_t m = 1; m < plan_.size(); ++m) {
      FLOWKV_CHECK(plan_[m] > plan_[m - 1], "meancache: schedule steps must ascend (", plan_[m - 1],
                   " then ", plan_[m], ")");
    }
    FLOWKV_CHECK(spans_.size() == plan_.size() || spans_.size() + 1 == plan_.size(),
                 "meancache: ", spans_.size(), " spans for ", plan_.size(),
                 " computed steps (one per computed step, the last one optional)");
    for (size_t m = 0; m + 1 < plan_.size(); ++m) {
      FLOWKV_CHECK(spans_[m] > 0 || plan_[m + 1] == plan_[m] + 1, "meancache: span 0 after step ",
                   plan_[m], " but steps ", plan_[m] + 1, "..", plan_[m + 1] - 1,
                   " are skipped: a skipped step needs a span of 1 or more");
    }
  }

  std::vector<int> computed_steps() const {
    std::vector<int> c;
    for (size_t k = 0; k < resolved_.size(); ++k) {
      if (resolved_[k].compute) c.push_back(static_cast<int>(k));
    }
    return c;
  }

  // The per-step plan for a run of n steps.
  void resolve(int n) {
    FLOWKV_CHECK(n >= 1, "meancache: a run of ", n, " steps");
    resolved_.assign(static_cast<size_t>(n), Step{});
    keep_ = 1;
    if (calibrate_) return;
    std::vector<int> compute = plan_;
    std::vector<int> spans = spans_;
    if (compute.empty()) {
      FLOWKV_CHECK(name_.empty(), "meancache: no schedule");
      const int b = budget_ > 0 ? static_cast<int>(std::min<int64_t>(budget_, n))
                                : std::min(n, std::max(2, static_cast<int>(std::lround(0.4 * n))));
      FLOWKV_CHECK(b >= 2 || n == 1, "meancache: budget=", b, " for ", n,
                   " steps: the first and the last step always compute, so the budget is at "
                   "least 2");
      for (int m = 0; m < b; ++m) {
        compute.push_back(
            b == 1 ? 0 : static_cast<int>((2LL * m * (n - 1) + (b - 1)) / (2LL * (b - 1))));
      }
      spans.assign(compute.size(), span_);
    }
    FLOWKV_CHECK(compute.back() == n - 1, "meancache: the schedule's last computed step is ",
                 compute.back(), " but this run has ", n, " steps (step ", n - 1,
                 " must compute): use a schedule made for ", n,
                 " steps (flowkv calibrate --policy meancache --steps ", n, ")");
    for (auto& s : resolved_) s.compute = false;
    for (size_t m = 0; m < compute.size(); ++m) {
      const int from = compute[m];
      const int to = m + 1 < compute.size() ? compute[m + 1] : n;
      resolved_[static_cast<size_t>(from)].compute = true;
      for (int k = from + 1; k < to; ++k) {
        resolved_[static_cast<size_t>(k)].span = spans[m];
        keep_ = std::max(keep_, spans[m]);
      }
    }
  }

  // calibrate=1: for every computed step i, span K and gap g (steps i+1..i+g-1 skipped, i+g
  // computed), the relative L1 distance between the latents the skips reach at step i + g and
  // the ones the full run had there, from this run's trajectory (the steps before i as computed).
  // Published as "meancache.costs": [steps, max_gap, max_span, cost(i, g, K) for i, g = 1..,
  // K = 1..], -1 where i + g is past the last step; g = 1 costs 0.
  void measure_costs() {
    const int n = static_cast<int>(history_.size());
    const size_t count = history_.front().x.size();
    std::vector<double> out = {static_cast<double>(n), static_cast<double>(max_gap_),
                               static_cast<double>(max_span_)};
    std::vector<std::vector<float>> px(static_cast<size_t>(max_gap_) + 1),
        pv(static_cast<size_t>(max_gap_) + 1);
    for (int i = 0; i < n; ++i) {
      for (int g = 1; g <= max_gap_; ++g) {
        for (int K = 1; K <= max_span_; ++K) out.push_back(i + g < n ? 0.0 : -1.0);
      }
      const size_t base = 3 + static_cast<size_t>(i) * max_gap_ * max_span_;
      for (int K = 1; K <= max_span_; ++K) {
        // Step r's latents and velocity: the run's up to i, predicted after.
        auto x_at = [&](int r) -> const std::vector<float>& {
          return r <= i ? history_[static_cast<size_t>(r)].x : px[static_cast<size_t>(r - i)];
        };
        auto v_at = [&](int r) -> const std::vector<float>& {
          return r <= i ? history_[static_cast<size_t>(r)].v : pv[static_cast<size_t>(r - i)];
        };
        if (i + 1 < n) px[1] = history_[static_cast<size_t>(i) + 1].x;
        for (int q = i + 1; q + 1 < n && q + 1 - i <= max_gap_; ++q) {  // q skipped
          const Seen& here = history_[static_cast<size_t>(q)];
          std::vector<float>& v = pv[static_cast<size_t>(q - i)];
          v.resize(count);
          if (!jvp_) {
            v = v_at(q - 1);
          } else {
            const int back = std::min(K, q);
            const Seen& start = history_[static_cast<size_t>(q - back)];
            mean_velocity(x_at(q).data(), x_at(q - back).data(), v_at(q - back).data(),
                          v_at(q - 1).data(), start.sigma, here.sigma, here.sigma_next, v.data(),
                          static_cast<int64_t>(count));
          }
          std::vector<float>& x = px[static_cast<size_t>(q + 1 - i)];
          x.resize(count);
          const float dt = here.sigma_next - here.sigma;
          const std::vector<float>& xq = x_at(q);
          for (size_t e = 0; e < count; ++e) x[e] = xq[e] + dt * v[e];
          const std::vector<float>& truth = history_[static_cast<size_t>(q) + 1].x;
          double num = 0, den = 0;
          for (size_t e = 0; e < count; ++e) {
            num += std::fabs(static_cast<double>(x[e]) - truth[e]);
            den += std::fabs(static_cast<double>(truth[e]));
          }
          out[base + static_cast<size_t>(q + 1 - i - 1) * max_span_ + static_cast<size_t>(K - 1)] =
              den > 0 ? num / den : num;
        }
      }
    }
    measured_.push_back({"meancache.costs", 0, std::move(out)});
    report_ += "[MeanCache] measured the cost of skipping up to " + std::to_string(max_gap_ - 1) +
               " steps after each of " + std::to_string(n) + " steps, spans 1.." +
               std::to_string(max_span_) +
               ": flowkv calibrate --policy meancache --budget B searches a schedule\n";
  }

  int64_t budget_;
  int span_;
  bool jvp_, calibrate_;
  int64_t blocks_;
  int max_gap_ = 12, max_span_ = 6;
  std::string name_;  // a published schedule's name
  std::vector<int> plan_, spans_;
  std::vector<Step> resolved_;
  int keep_ = 1;              // steps of history a skipped step reads
  std::deque<Seen> history_;  // the last keep_ steps (every step with calibrate=1)
  std::string report_;
  std::vector<StepCacheSeries> measured_;
};

}  // namespace

void register_meancache() {
  register_policy(
      {"meancache",
       "MeanCache: skips every model call (all branches) of the steps a fixed schedule skips; the "
       "Euler step then consumes an average velocity over the interval, the last one corrected "
       "by a cached finite-difference JVP. Approximate. budget (40% of steps, spread evenly), "
       "schedule (a/b/c step list, or a published table: qwen-image-b10 ...), spans (per "
       "computed step), span (2), jvp (on), calibrate (off: measures for flowkv calibrate), "
       "max_gap (12), max_span (6).",
       factory_of<MeanCache>()});
}

}  // namespace flowkv::cache
