// FasterCache (diffusers hooks/faster_cache.py; spec caches.md §7). Two parts:
// - CFG cache (step hook): under classifier-free guidance the unconditional branch is skipped
//   when step > 0, uncond_lo < t < uncond_hi and step % uncond_skip != 0; its output is then the
//   conditional output plus the last measured (uncond - cond) difference, split by a 2-D DFT over
//   the latent grid into a low-frequency disc and the rest, each scaled by alpha_low / alpha_high
//   on every skipped step whose timestep lies in that weight's range (the scale compounds, as in
//   diffusers). This is diffusers' "equivalent 2-D form" (§7.2) over the target grid.
// - Attention cache (block hooks): while attn_lo < t < attn_hi, on calls other than every
//   attn_skip-th, each block's attention output is extrapolated from its last two outputs,
//   newer + (newer - older) * weight; under CFG only on steps whose unconditional branch was
//   skipped (as diffusers' batch-size gate), without CFG (guidance-distilled) on any such call.
// Approximate. Attention state belongs to the conditional branch (the unconditional one is
// either computed in full or skipped); the CFG difference is state of the pair by definition.
// diffusers needs both branches batched in one call; flowkv runs them as separate calls.
#include <map>

#include "cache/policy.h"
#include "cache/snapshot.h"
#include "cache/spectral.h"
#include "flowkv/error.h"

namespace flowkv::cache {

namespace {

class FasterCache final : public Policy {
 public:
  FasterCache(PolicyOptions& o, const Topology&)
      : attn_skip_(o.integer("attn_skip", 2, kCount)),
        attn_lo_(o.num("attn_lo", -1, kTimestepBound)),
        attn_hi_(o.num("attn_hi", 681, kTimestepBound)),
        uncond_skip_(o.integer("uncond_skip", 5, kCount)),
        uncond_lo_(o.num("uncond_lo", -1, kTimestepBound)),
        uncond_hi_(o.num("uncond_hi", 641, kTimestepBound)),
        alpha_low_(o.num("alpha_low", 1.1, {0, 100})),
        alpha_high_(o.num("alpha_high", 1.1, {0, 100})),
        low_lo_(o.num("low_lo", 99, kTimestepBound)),
        low_hi_(o.num("low_hi", 901, kTimestepBound)),
        high_lo_(o.num("high_lo", -1, kTimestepBound)),
        high_hi_(o.num("high_hi", 301, kTimestepBound)),
        weight_(o.num("weight", 0.5, kFraction)) {
    FLOWKV_CHECK(attn_skip_ >= 1 && uncond_skip_ >= 1,
                 "fastercache: attn_skip and uncond_skip must be >= 1");
  }
  std::string name() const override { return "fastercache"; }
  std::string describe() const override {
    return "fastercache attn_skip=" + std::to_string(attn_skip_) + " attn_range=(" +
           std::to_string(attn_lo_) + "," + std::to_string(attn_hi_) +
           ") uncond_skip=" + std::to_string(uncond_skip_) + " uncond_range=(" +
           std::to_string(uncond_lo_) + "," + std::to_string(uncond_hi_) +
           ") alpha_low=" + std::to_string(alpha_low_) +
           " alpha_high=" + std::to_string(alpha_high_) + " weight=" + std::to_string(weight_);
  }

  // ---- CFG cache
  bool run_branch(const StepContext& ctx) override {
    if (ctx.branch != 1) return true;
    const bool skip = uncond_dropped(ctx);
    if (skip) ++stats_.branches_skipped;
    return !skip;
  }

  void fill_branch(const StepContext& ctx, const float* cond, float* out, int64_t batch,
                   int64_t tokens, int64_t channels, int64_t h, int64_t w) override {
    FLOWKV_CHECK(h * w == tokens && static_cast<int64_t>(low_.size()) == batch,
                 "fastercache: the unconditional branch was skipped before it was measured");
    const double t = ctx.timestep;
    const double a_low = low_lo_ < t && t < low_hi_ ? alpha_low_ : 1.0;
    const double a_high = high_lo_ < t && t < high_hi_ ? alpha_high_ : 1.0;
    for (int64_t b = 0; b < batch; ++b) {
      Spectrum& L = low_[static_cast<size_t>(b)];
      Spectrum& H = high_[static_cast<size_t>(b)];
      for (auto& v : L.v) v *= a_low;  // stored back: compounds over consecutive skips
      for (auto& v : H.v) v *= a_high;
      Spectrum sum = L;
      for (size_t i = 0; i < sum.v.size(); ++i) sum.v[i] += H.v[i];
      float* u = out + b * tokens * channels;
      std::copy(cond + b * tokens * channels, cond + (b + 1) * tokens * channels, u);
      add_inverse_dft2(sum, u);
    }
  }

  void observe_branches(const StepContext&, const float* cond, const float* uncond, int64_t batch,
                        int64_t tokens, int64_t channels, int64_t h, int64_t w) override {
    FLOWKV_CHECK(h * w == tokens, "fastercache: the target grid does not match its tokens");
    const std::vector<uint8_t> mask = low_frequency_mask(h, w);
    low_.assign(static_cast<size_t>(batch), {});
    high_.assign(static_cast<size_t>(batch), {});
    std::vector<float> diff(static_cast<size_t>(tokens * channels));
    for (int64_t b = 0; b < batch; ++b) {
      const int64_t off = b * tokens * channels;
      for (size_t i = 0; i < diff.size(); ++i)
        diff[i] = uncond[off + static_cast<int64_t>(i)] - cond[off + static_cast<int64_t>(i)];
      Spectrum d = dft2(diff.data(), h, w, channels), hi = d;
      for (int64_t c = 0; c < channels; ++c) {
        for (int64_t p = 0; p < h * w; ++p) {
          auto& lo_v = d.v[static_cast<size_t>(c * h * w + p)];
          auto& hi_v = hi.v[static_cast<size_t>(c * h * w + p)];
          (mask[static_cast<size_t>(p)] ? hi_v : lo_v) = 0;
        }
      }
      low_[static_cast<size_t>(b)] = std::move(d);
      high_[static_cast<size_t>(b)] = std::move(hi);
    }
  }

  // ---- attention cache
  void begin(const Streams&, Mat) override { first_ = true; }

  bool reuse(int block, Sublayer which) override {
    if (which != Sublayer::kAttention || ctx_.branch != 0) return false;
    Module& m = modules_[block];
    const double t = ctx_.timestep;
    bool skip = attn_lo_ < t && t < attn_hi_ && !(m.iteration > 0 && m.iteration % attn_skip_ == 0);
    skip = skip && (!ctx_.cfg || uncond_dropped(ctx_));
    skip = skip && m.cache.size() == 2 && !must_compute();  // diffusers would crash: compute
    ++m.iteration;
    if (first_) log(skip ? 'a' : 'C'), first_ = false;
    (skip ? stats_.sublayers_reused : stats_.sublayers_computed)++;
    return skip;
  }

  void store(int block, Sublayer which, const Streams& out) override {
    if (which != Sublayer::kAttention || ctx_.branch != 0) return;
    push(modules_[block], snapshot(out));
  }

  void fetch(int block, Sublayer, Streams& out) override {
    Module& m = modules_.at(block);
    const Snapshot &older = m.cache[0], &newer = m.cache[1];
    FLOWKV_CHECK(fits(newer, out), "fastercache: block ", block, "'s streams changed shape");
    Snapshot y = newer;
    const float w = static_cast<float>(weight_);
    for (StreamCopy& n : y) {
      const StreamCopy* o = nullptr;
      for (const StreamCopy& c : older) o = c.name == n.name && same_shape(c, n) ? &c : o;
      if (!o) continue;  // seen once only: reuse as is
      for (size_t i = 0; i < n.v.size(); ++i) n.v[i] = n.v[i] + (n.v[i] - o->v[i]) * w;
    }
    assign(out, y);
    push(m, std::move(y));  // approximations are cached too
  }

 private:
  struct Module {
    int64_t iteration = 0;
    std::vector<Snapshot> cache;  // [older, newer]
  };
  static void push(Module& m, Snapshot v) {
    if (m.cache.empty())
      m.cache = {v, v};
    else
      m.cache = {std::move(m.cache[1]), std::move(v)};
  }
  bool uncond_dropped(const StepContext& ctx) const {
    const double t = ctx.timestep;
    return ctx.cfg && ctx.step > 0 && uncond_lo_ < t && t < uncond_hi_ &&
           ctx.step % uncond_skip_ != 0 && !low_.empty();
  }

  int64_t attn_skip_;
  double attn_lo_, attn_hi_;
  int64_t uncond_skip_;
  double uncond_lo_, uncond_hi_, alpha_low_, alpha_high_, low_lo_, low_hi_, high_lo_, high_hi_;
  double weight_;
  bool first_ = true;
  std::vector<Spectrum> low_, high_;  // per batch element: the (uncond - cond) spectrum split
  std::map<int, Module> modules_;
};

}  // namespace

void register_fastercache() {
  register_policy({"fastercache",
                   "FasterCache: under CFG skips the unconditional branch (cond + frequency-"
                   "weighted last difference) and extrapolates attention outputs on those steps; "
                   "without CFG extrapolates attention only. Approximate. attn_skip (2), attn "
                   "range (-1,681), uncond_skip (5), uncond range (-1,641), alpha_low/high (1.1), "
                   "weight (0.5).",
                   factory_of<FasterCache>()});
}

}  // namespace flowkv::cache
