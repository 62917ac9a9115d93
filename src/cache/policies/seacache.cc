// SeaCache (diffusers 0.42.1 hooks/sea_cache.py, its generic path; spec caches.md §11): the
// latent this step denoises, SEA-filtered at the step's sigma (cache/spectral.h: a Wiener filter
// from a power-law prior of the clean signal, so the indicator keeps content and drops noise), is
// compared with the previous call's filtered latent; the relative L1 change accumulates, and while
// the sum stays below `threshold` (compute iff acc + d >= threshold) every block is skipped and
// the target gets input + a residual predicted from the last full calls: the latest residual
// (residual_order=0) or the linear extrapolation of the last two (residual_order=1,
// r = r1 + (r1 - r0) (step - s1) / (s1 - s0)). The first `retention_steps` and last
// `cache_end_steps` steps compute, and so does the call after `max_consecutive_cached` skips in a
// row (0: no limit). As diffusers: the filtered latent is remembered on every call, skipped or
// not; a skip without a stored residual, or with one of another shape, computes (and zeroes the
// sum); steps that are not consecutive start the trajectory afresh; one decision per (step,
// sigma). Approximate. State per CFG branch.
//
// The latent is the scheduler's (StepContext::latents), per batch element one frame (C, 1, H, W)
// as diffusers' raw_vision_callback gives it; the distance is the mean over batch elements.
#include <algorithm>
#include <cmath>
#include <deque>
#include <limits>
#include <map>

#include "cache/policy.h"
#include "cache/snapshot.h"
#include "cache/spectral.h"
#include "flowkv/error.h"

namespace flowkv::cache {

namespace {

class SeaCache final : public Policy {
 public:
  SeaCache(PolicyOptions& o, const Topology&)
      : threshold_(o.num("threshold", 0.25, kNonNegative)),
        order_(static_cast<int>(o.integer("residual_order", 1, {0, 1}))),
        retention_(o.integer("retention_steps", 1, {0, 100000})),
        cache_end_(o.integer("cache_end_steps", 1, {0, 100000})),
        max_consecutive_(o.integer("max_consecutive_cached", 2, {0, 100000})),
        power_(o.num("power_exp", 3.0, kNonNegative)) {
    FLOWKV_CHECK(power_ > 0, "cache option power_exp=", power_,
                 " must be positive (the exponent of SeaCache's clean-signal prior)");
  }
  // Decided from the latent at run time; the knobs bound it: only the steps between the first
  // retention_steps and the last cache_end_steps may skip, at most max_consecutive_cached in a
  // row (each run of skips ends in a computed call).
  std::optional<ExpectedWork> expected(int steps, int branches) const override {
    const int64_t gated = std::max<int64_t>(0, steps - retention_ - cache_end_);
    const int64_t most = max_consecutive_ <= 0 ? gated : gated - gated / (max_consecutive_ + 1);
    return ExpectedWork{static_cast<double>(most) / steps, true,
                        "decides from the SEA-filtered latent: at most " + std::to_string(most) +
                            " of " + std::to_string(steps) + " steps skip (" +
                            std::to_string(most * branches) +
                            " model calls), none while the latent changes by more than "
                            "threshold between steps (at few steps, often none)",
                        "model calls"};
  }

  std::string name() const override { return "seacache"; }
  std::string describe() const override {
    return "seacache threshold=" + std::to_string(threshold_) +
           " residual_order=" + std::to_string(order_) +
           " retention_steps=" + std::to_string(retention_) +
           " cache_end_steps=" + std::to_string(cache_end_) +
           " max_consecutive_cached=" + std::to_string(max_consecutive_) +
           " power_exp=" + std::to_string(power_);
  }

  void begin(const Streams& in, Mat) override {
    State& st = state();
    const int t = in.index_of("target");
    skipping_ = false;
    recording_ = true;
    target_ = t;
    if (ctx_.latents.x != nullptr && t >= 0) {
      skipping_ = decide(st, in);
    } else {
      recording_ = false;  // no latent: runs in full, records nothing (diffusers' fail-open)
    }
    if (!skipping_ && t >= 0) copy_into(input_, in.s[static_cast<size_t>(t)], in.batch);
    log(skipping_ ? 's' : 'C');
    (skipping_ ? stats_.calls_skipped : stats_.calls_full)++;
  }

  BlockAction before_block(int, Streams&) override {
    (skipping_ ? stats_.blocks_skipped : stats_.blocks_run)++;
    return skipping_ ? BlockAction::kSkip : BlockAction::kRun;
  }

  void end(Streams& s) override {
    State& st = state();
    if (target_ < 0) return;
    Stream& target = s.s[static_cast<size_t>(target_)];
    if (skipping_) {
      add_into(target, s.batch, predicted_);
      return;
    }
    st.consecutive = 0;  // a full execution
    if (!recording_) return;
    Entry e;
    if (st.history.size() > static_cast<size_t>(order_)) {  // full: reuse the oldest's storage
      e = std::move(st.history.front());
      st.history.pop_front();
    }
    e.step = ctx_.step;
    residual_into(e.residual, target, s.batch, input_);
    st.history.push_back(std::move(e));
    while (st.history.size() > static_cast<size_t>(order_ + 1)) st.history.pop_front();
  }

 private:
  struct Entry {
    int step = 0;
    StreamCopy residual;  // target out - target in of a full call
  };
  struct State {
    bool has_key = false;  // the (step, sigma) of the last decision, and that decision
    int key_step = 0;
    float key_sigma = 0;
    bool key_compute = true;
    std::vector<std::vector<float>> previous, current;  // filtered latents, per batch element
    double acc = 0;
    int64_t consecutive = 0;    // calls skipped in a row
    std::deque<Entry> history;  // the last residual_order + 1 full calls
  };
  State& state() { return states_[ctx_.branch]; }

  // The filtered latent of each batch element, into `out` (its storage reused).
  void indicator(std::vector<std::vector<float>>& out) const {
    const StepContext::Latents& l = ctx_.latents;
    const int64_t n = l.h * l.w * l.channels;
    out.resize(static_cast<size_t>(l.batch));
    for (auto& v : out) v.resize(static_cast<size_t>(n));
    for (int64_t b = 0; b < l.batch; ++b)
      sea_filter(l.x + b * n, l.h, l.w, l.channels, ctx_.sigma, power_,
                 out[static_cast<size_t>(b)].data(), scratch_);
  }

  // mean over batch elements of mean |cur - prev| / (mean |prev| + 1e-16); infinite when the
  // shapes differ.
  static double distance(const std::vector<std::vector<float>>& cur,
                         const std::vector<std::vector<float>>& prev) {
    if (cur.size() != prev.size() || cur.empty()) return std::numeric_limits<double>::infinity();
    double d = 0;
    for (size_t b = 0; b < cur.size(); ++b) {
      if (cur[b].size() != prev[b].size() || cur[b].empty())
        return std::numeric_limits<double>::infinity();
      double num = 0, den = 0;
      for (size_t i = 0; i < cur[b].size(); ++i) {
        num += std::fabs(static_cast<double>(cur[b][i]) - prev[b][i]);
        den += std::fabs(static_cast<double>(prev[b][i]));
      }
      const double n = static_cast<double>(cur[b].size());
      d += (num / n) / (den / n + 1e-16);
    }
    return d / static_cast<double>(cur.size());
  }

  // diffusers' resolve_gate: whether this call computes (true) by the gate alone.
  bool gate(State& st) {
    const int k = ctx_.step;
    if (st.has_key && st.key_step == k && st.key_sigma == ctx_.sigma) return st.key_compute;
    const bool non_adjacent = st.has_key && k != st.key_step + 1;
    if (non_adjacent) {  // a new trajectory
      st.history.clear();
      st.has_key = false;
      st.key_compute = true;
      st.previous.clear();
      st.acc = 0;
      st.consecutive = 0;
    }
    std::vector<std::vector<float>>& cur = st.current;
    indicator(cur);
    const bool capped = max_consecutive_ > 0 && st.consecutive >= max_consecutive_;
    const bool forced = non_adjacent || k < retention_ || k >= ctx_.num_steps - cache_end_ ||
                        st.previous.empty() || capped;
    bool compute = true;
    double candidate = 0;
    if (!forced) {
      const double d = distance(cur, st.previous);
      candidate = st.acc + d;
      compute = !std::isfinite(d) || candidate >= threshold_;
    }
    st.acc = compute ? 0 : candidate;
    st.has_key = true, st.key_step = k, st.key_sigma = ctx_.sigma, st.key_compute = compute;
    std::swap(st.previous, st.current);
    return compute;
  }

  // Whether the call skips; if so, predicted_ holds the residual to add.
  bool decide(State& st, const Streams& in) {
    if (gate(st)) return false;
    if (must_compute()) {  // this call stores an exact cache: it computes, as a refresh
      st.acc = 0;
      return false;
    }
    if (st.history.empty()) {  // a skip with nothing to reuse runs in full
      st.acc = 0;
      return false;
    }
    const Stream& t = in.s[static_cast<size_t>(target_)];
    for (const Entry& e : st.history) {
      if (e.residual.batch != in.batch || e.residual.seq != t.seq || e.residual.cols != t.x.cols) {
        st.history.clear();  // the target changed shape
        st.acc = 0;
        return false;
      }
    }
    const Entry& last = st.history.back();
    predicted_ = last.residual;
    if (order_ == 1 && st.history.size() >= 2) {
      const Entry& prev = st.history[st.history.size() - 2];
      if (last.step != prev.step) {
        const float scale = static_cast<float>(static_cast<double>(ctx_.step - last.step) /
                                               static_cast<double>(last.step - prev.step));
        for (size_t i = 0; i < predicted_.v.size(); ++i) {
          const float r1 = last.residual.v[i], r0 = prev.residual.v[i];
          predicted_.v[i] = r1 + (r1 - r0) * scale;
        }
      }
    }
    st.consecutive++;
    return true;
  }

  double threshold_;
  int order_;
  int64_t retention_, cache_end_, max_consecutive_;
  double power_;
  std::map<int, State> states_;
  mutable SeaScratch scratch_;  // the SEA filter's buffers, reused every step
  // This call (begin to end; a call belongs to one branch).
  bool skipping_ = false, recording_ = true;
  int target_ = -1;
  StreamCopy input_, predicted_;
};

}  // namespace

void register_seacache() {
  register_policy(
      {"seacache",
       "SeaCache: skips every block while the accumulated relative change of the "
       "SEA-filtered latent stays below threshold, adding the last residual or its linear "
       "extrapolation. Approximate. threshold (0.25), residual_order (1: extrapolate; 0: "
       "reuse), retention_steps (1), cache_end_steps (1), max_consecutive_cached (2; 0: no "
       "limit), power_exp (3).",
       factory_of<SeaCache>()});
}

}  // namespace flowkv::cache
