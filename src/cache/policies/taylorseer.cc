// TaylorSeer (diffusers hooks/taylorseer_cache.py; spec caches.md §4): each block's attention
// sublayer (diffusers' default hooks: the modules named "...blocks.N.attn"; in FLUX.2's single
// blocks that module is the fused attention+MLP) is computed on a schedule and forecast between
// computations by a Taylor series of backward divided differences of its past outputs.
// Schedule over the calls of one module: calls 0..before-1 compute, then before+1,
// before+1+interval, ...; calls >= after (if set) compute. Factors are kept in bf16 by default,
// as diffusers' taylor_factors_dtype. Approximate. State per block and CFG branch.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>

#include "cache/policy.h"
#include "cache/snapshot.h"
#include "flowkv/error.h"

namespace flowkv::cache {

namespace {

float to_bf16(float v) {  // round to nearest even, as torch's .to(bfloat16)
  uint32_t u;
  std::memcpy(&u, &v, 4);
  if ((u & 0x7f800000u) == 0x7f800000u) return v;  // inf / nan
  u += 0x7fffu + ((u >> 16) & 1u);
  u &= 0xffff0000u;
  std::memcpy(&v, &u, 4);
  return v;
}

int64_t py_mod(int64_t a, int64_t n) {
  return ((a % n) + n) % n;
}

class TaylorSeer final : public Policy {
 public:
  TaylorSeer(PolicyOptions& o, const Topology&)
      : interval_(o.integer("interval", 5, kCount)),
        before_(o.integer("before", 3, {0, 100000})),
        after_(o.integer("after", -1, kCountOrNone)),
        order_(static_cast<int>(o.integer("order", 1, {0, 16}))),
        bf16_factors_(o.str("factors", "bf16") == "bf16") {
    const std::string f = o.str("factors", "bf16");
    FLOWKV_CHECK(f == "bf16" || f == "f32", "taylorseer: factors must be bf16 or f32, got ", f);
    FLOWKV_CHECK(interval_ >= 1 && order_ >= 0 && before_ >= 0,
                 "taylorseer: interval >= 1, order >= 0 and before >= 0 are required");
    // diffusers raises at the first call ("Cannot predict without prior initialization").
    FLOWKV_CHECK(before_ > 0 || interval_ == 1,
                 "taylorseer: before=0 with interval > 1 would forecast call 0 with nothing "
                 "computed; use before >= 1");
  }
  std::string name() const override { return "taylorseer"; }
  std::string describe() const override {
    return "taylorseer interval=" + std::to_string(interval_) +
           " before=" + std::to_string(before_) + " after=" + std::to_string(after_) +
           " order=" + std::to_string(order_) + " factors=" + (bf16_factors_ ? "bf16" : "f32");
  }

  void begin(const Streams&, Mat) override { first_ = true; }

  bool reuse(int block, Sublayer which) override {
    if (which != Sublayer::kAttention) return false;
    Module& m = modules_[{ctx_.branch, block}];
    const int64_t s = ++m.calls;
    const bool compute = s < before_ || py_mod(s - before_ - 1, interval_) == 0 ||
                         (after_ >= 0 && s >= after_) || must_compute() || m.last_update < 0;
    if (first_) log(compute ? 'C' : 'p'), first_ = false;
    (compute ? stats_.sublayers_computed : stats_.sublayers_reused)++;
    return !compute;
  }

  void store(int block, Sublayer which, const Streams& out) override {
    if (which != Sublayer::kAttention) return;
    Module& m = modules_[{ctx_.branch, block}];
    for (StreamCopy& y : snapshot(out)) {
      // F_0 = y; F_{j+1} = (F_j - previous F_j) / (calls since the last update), in float32
      // from the new unrounded F_j and the stored (rounded) previous one.
      std::vector<StreamCopy> next{y};
      auto prev = m.factors.find(y.name);
      if (m.last_update >= 0 && prev != m.factors.end()) {
        const float delta = static_cast<float>(m.calls - m.last_update);
        for (int j = 0; j < order_ && static_cast<size_t>(j) < prev->second.size(); ++j) {
          const StreamCopy& p = prev->second[static_cast<size_t>(j)];
          if (!same_shape(p, next.back())) break;
          StreamCopy d = minus(next.back(), p);
          for (float& v : d.v) v /= delta;
          next.push_back(std::move(d));
        }
      }
      if (bf16_factors_) {
        for (StreamCopy& f : next)
          for (float& v : f.v) v = to_bf16(v);
      }
      m.factors[y.name] = std::move(next);
    }
    m.last_update = m.calls;
  }

  void fetch(int block, Sublayer, Streams& out) override {
    Module& m = modules_[{ctx_.branch, block}];
    const int64_t k = m.calls - m.last_update;
    Snapshot pred;
    for (const auto& [name, orders] : m.factors) {
      // sum_o F_o * (k^o / o!), accumulated in float32 from zero as diffusers does.
      StreamCopy y = orders[0];
      std::fill(y.v.begin(), y.v.end(), 0.0f);
      double fact = 1;
      for (size_t o = 0; o < orders.size(); ++o) {
        if (o > 0) fact *= static_cast<double>(o);
        const float coeff = static_cast<float>(std::pow(static_cast<double>(k), o) / fact);
        for (size_t e = 0; e < y.v.size(); ++e) y.v[e] = y.v[e] + orders[o].v[e] * coeff;
      }
      pred.push_back(std::move(y));
    }
    FLOWKV_CHECK(fits(pred, out), "taylorseer: block ", block, "'s streams changed shape");
    assign(out, pred);
  }

 private:
  struct Module {
    int64_t calls = -1, last_update = -1;
    std::map<std::string, std::vector<StreamCopy>> factors;  // stream -> [order]
  };

  int64_t interval_, before_, after_;
  int order_;
  bool bf16_factors_;
  bool first_ = true;
  std::map<std::pair<int, int>, Module> modules_;  // (branch, block)
};

}  // namespace

void register_taylorseer() {
  register_policy({"taylorseer",
                   "TaylorSeer: computes each block's attention on a schedule and forecasts it "
                   "between computations by a Taylor series of divided differences. Approximate. "
                   "interval (5), before (3), after (-1: never), order (1), factors (bf16|f32).",
                   factory_of<TaylorSeer>()});
}

}  // namespace flowkv::cache
