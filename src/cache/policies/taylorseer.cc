// TaylorSeer (diffusers hooks/taylorseer_cache.py; spec caches.md §4): each block's attention
// sublayer (diffusers' default hooks: the modules named "...blocks.N.attn"; in FLUX.2's single
// blocks that module is the fused attention+MLP) is computed on a schedule and forecast between
// computations by a Taylor series of backward divided differences of its past outputs.
// Schedule over the calls of one module: calls 0..before-1 compute, then before+1,
// before+1+interval, ...; calls >= after (if set) compute. Factors are kept in bf16 by default,
// as diffusers' taylor_factors_dtype. Approximate. State per block and CFG branch.
//
// forecaster=dmd (cache-dit's DMD calibrator, cache/dmd.h) forecasts instead by dynamic mode
// decomposition of the last dmd_history computed outputs of each stream (float32 copies, fit in
// double per batch item): on the longest evenly spaced tail of them once it holds at least 4,
// by the Taylor series before. A degenerate fit or a non-finite forecast reuses the newest
// computed output, as cache-dit does.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "cache/dmd.h"
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

// cache-dit's floor: one complex pair of modes costs two real degrees of freedom, so even one
// oscillating mode needs 3 snapshot pairs.
constexpr int kDmdMinSnapshots = 4;
constexpr KnobRange kDmdHistory{kDmdMinSnapshots, 32};

// sum_o F_o * (k^o / o!), accumulated in float32 from zero as diffusers does.
StreamCopy taylor_forecast(const std::vector<StreamCopy>& orders, int64_t k) {
  StreamCopy y = orders[0];
  std::fill(y.v.begin(), y.v.end(), 0.0f);
  double fact = 1;
  for (size_t o = 0; o < orders.size(); ++o) {
    if (o > 0) fact *= static_cast<double>(o);
    const float coeff = static_cast<float>(std::pow(static_cast<double>(k), o) / fact);
    for (size_t e = 0; e < y.v.size(); ++e) y.v[e] = y.v[e] + orders[o].v[e] * coeff;
  }
  return y;
}

std::string format_double(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
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
    const std::string forecaster = o.str("forecaster", "taylor");
    FLOWKV_CHECK(forecaster == "taylor" || forecaster == "dmd",
                 "taylorseer: forecaster must be taylor or dmd, got ", forecaster);
    dmd_ = forecaster == "dmd";
    // DMD's knobs, named as cache-dit's DMDCalibratorConfig names them (-1: not given).
    const int64_t history = o.integer("dmd_history", -1, kDmdHistory);
    const int64_t rank = o.integer("dmd_rank", -1, {0, kDmdHistory.hi - 1});
    const double ridge = o.num("dmd_ridge", -1, kNonNegative);
    FLOWKV_CHECK(dmd_ || (history < 0 && rank < 0 && ridge < 0),
                 "taylorseer: dmd_history, dmd_rank and dmd_ridge apply only with "
                 "forecaster=dmd");
    if (history >= 0) history_ = static_cast<int>(history);
    if (rank >= 0) dmd_options_.rank = static_cast<int>(rank);
    if (ridge >= 0) dmd_options_.ridge = ridge;
    FLOWKV_CHECK(dmd_options_.rank <= history_ - 1, "taylorseer: dmd_rank=", dmd_options_.rank,
                 " is more than the dmd_history - 1 = ", history_ - 1,
                 " snapshot pairs of the window can give (0 chooses the rank from the spectrum)");
  }
  std::string name() const override { return "taylorseer"; }
  std::string describe() const override {
    return "taylorseer interval=" + std::to_string(interval_) +
           " before=" + std::to_string(before_) + " after=" + std::to_string(after_) +
           " order=" + std::to_string(order_) + " factors=" + (bf16_factors_ ? "bf16" : "f32") +
           (dmd_ ? " forecaster=dmd dmd_history=" + std::to_string(history_) +
                       " dmd_rank=" + std::to_string(dmd_options_.rank) +
                       " dmd_ridge=" + format_double(dmd_options_.ridge)
                 : "");
  }
  std::string report() const override {
    if (!dmd_) return "";
    return " forecaster=dmd: " + std::to_string(dmd_forecasts_) + " stream forecasts by DMD (" +
           std::to_string(dmd_fits_) + " fits), " + std::to_string(dmd_taylor_) +
           " by the Taylor series (fewer than " + std::to_string(kDmdMinSnapshots) +
           " evenly spaced outputs yet), " + std::to_string(dmd_reused_) +
           " reused the newest output (degenerate fit or non-finite forecast)\n";
  }

  // The schedule is fixed by the knobs (per block, one attention per model call): how many of
  // the attention sublayers are forecast. Attention is part of each block's work, so the share
  // of the transformer's FLOPs saved is below this fraction.
  std::optional<ExpectedWork> expected(int steps, int branches) const override {
    int computed = 0;
    for (int64_t s = 0; s < steps; ++s) {  // the calls counted from 0, as reuse() counts
      computed +=
          s < before_ || py_mod(s - before_ - 1, interval_) == 0 || (after_ >= 0 && s >= after_);
    }
    const int forecast = steps - computed;
    return ExpectedWork{
        static_cast<double>(forecast) / steps, true,
        "computes each block's attention on " + std::to_string(computed) + " of " +
            std::to_string(steps) + " calls per branch and forecasts " + std::to_string(forecast) +
            (dmd_ ? " (DMD once its window holds 4 evenly spaced outputs, Taylor before)"
                  : " (Taylor series)") +
            "; " + std::to_string(forecast * branches) +
            " attention calls per block saved (the MLPs still run)",
        "blocks' attention sublayers"};
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
      if (dmd_) add_snapshot(m.dmd[y.name], m.calls, y);
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
      StreamCopy y;
      if (!dmd_ || !dmd_forecast(m, name, y)) {
        y = taylor_forecast(orders, k);
        if (dmd_) ++dmd_taylor_;
      }
      pred.push_back(std::move(y));
    }
    FLOWKV_CHECK(fits(pred, out), "taylorseer: block ", block, "'s streams changed shape");
    assign(out, pred);
  }

 private:
  // One stream's computed outputs for DMD, and the fit of their evenly spaced tail.
  struct DmdStream {
    std::vector<int64_t> calls;     // the call of each output, oldest first
    std::vector<StreamCopy> snaps;  // at most history_, float32 as computed
    // Per batch item, the inner products of the snapshots (row-major, snaps x snaps): a new
    // snapshot adds one row, so a window costs O(features x history) once, not per fit.
    std::vector<std::vector<double>> gram;
    bool fitted = false;                      // fits belong to the current snapshots
    std::vector<std::optional<DmdFit>> fits;  // one per batch item (cache-dit fits each alone)
  };
  struct Module {
    int64_t calls = -1, last_update = -1;
    std::map<std::string, std::vector<StreamCopy>> factors;  // stream -> [order]
    std::map<std::string, DmdStream> dmd;                    // stream -> its DMD window
  };

  void add_snapshot(DmdStream& st, int64_t call, const StreamCopy& y) const {
    if (!st.snaps.empty() && !same_shape(st.snaps.back(), y)) st = DmdStream{};  // a new shape
    StreamCopy recycled;
    if (st.snaps.size() == static_cast<size_t>(history_)) {  // the oldest leaves the window
      const size_t n = st.snaps.size();
      for (std::vector<double>& g : st.gram) {
        std::vector<double> kept;
        for (size_t i = 1; i < n; ++i) kept.insert(kept.end(), &g[i * n + 1], &g[i * n] + n);
        g = std::move(kept);
      }
      st.calls.erase(st.calls.begin());
      recycled = std::move(st.snaps.front());  // its buffer takes the new output below
      st.snaps.erase(st.snaps.begin());
    }
    st.calls.push_back(call);
    recycled = y;  // copy-assignment keeps the recycled buffer's capacity
    st.snaps.push_back(std::move(recycled));
    const size_t n = st.snaps.size();
    const int64_t item = y.seq * y.cols;
    st.gram.resize(static_cast<size_t>(y.batch));
    for (int64_t b = 0; b < y.batch; ++b) {
      std::vector<double>& g = st.gram[static_cast<size_t>(b)];
      std::vector<double> grown(n * n);
      for (size_t i = 0; i + 1 < n; ++i) {
        for (size_t j = 0; j + 1 < n; ++j) grown[i * n + j] = g[i * (n - 1) + j];
      }
      for (size_t j = 0; j < n; ++j) {
        grown[(n - 1) * n + j] = grown[j * n + n - 1] =
            dmd_dot(st.snaps[j].v.data() + b * item, y.v.data() + b * item, item);
      }
      g = std::move(grown);
    }
    st.fitted = false;
  }

  // The DMD forecast of one stream at this call, into y; false (Taylor instead) while the
  // evenly spaced tail of its outputs is shorter than kDmdMinSnapshots.
  bool dmd_forecast(Module& m, const std::string& name, StreamCopy& y) {
    auto it = m.dmd.find(name);
    if (it == m.dmd.end() || it->second.snaps.size() < 2) return false;
    DmdStream& st = it->second;
    const size_t n = st.snaps.size();
    const int64_t spacing = st.calls[n - 1] - st.calls[n - 2];
    size_t first = n - 2;  // the longest tail with every gap equal to the last one
    while (first > 0 && st.calls[first] - st.calls[first - 1] == spacing) --first;
    if (spacing <= 0 || n - first < static_cast<size_t>(kDmdMinSnapshots)) return false;

    const StreamCopy& newest = st.snaps.back();
    const int64_t item = newest.seq * newest.cols;
    auto columns = [&](int64_t b) {
      std::vector<const float*> c;
      for (size_t j = first; j < n; ++j) c.push_back(st.snaps[j].v.data() + b * item);
      return c;
    };
    if (!st.fitted) {
      st.fits.clear();
      const size_t len = n - first;
      for (int64_t b = 0; b < newest.batch; ++b) {
        const std::vector<double>& g = st.gram[static_cast<size_t>(b)];
        std::vector<double> tail(len * len);  // the tail's block of the inner products
        for (size_t i = 0; i < len; ++i) {
          for (size_t j = 0; j < len; ++j) tail[i * len + j] = g[(first + i) * n + first + j];
        }
        st.fits.push_back(dmd_fit_gram(tail, static_cast<int>(len), dmd_options_));
      }
      st.fitted = true;
      ++dmd_fits_;
    }
    // Horizon in snapshot spacings (fractional between them), from the newest output.
    const double k = static_cast<double>(m.calls - st.calls[n - 1]) / static_cast<double>(spacing);
    y = newest;
    bool ok = true;
    for (int64_t b = 0; ok && b < newest.batch; ++b) {
      const auto& fit = st.fits[static_cast<size_t>(b)];
      const std::vector<double> c = fit ? fit->coefficients(k) : std::vector<double>{};
      ok = !c.empty();
      if (ok) dmd_combine(columns(b), item, c, y.v.data() + b * item);
    }
    for (size_t e = 0; ok && e < y.v.size(); ++e) ok = std::isfinite(y.v[e]);
    if (!ok) y = newest;  // any item degenerate: every item reuses, as cache-dit does
    ++(ok ? dmd_forecasts_ : dmd_reused_);
    return true;
  }

  int64_t interval_, before_, after_;
  int order_;
  bool bf16_factors_;
  bool dmd_ = false;
  int history_ = 6;  // cache-dit's dmd_history default
  DmdOptions dmd_options_;
  int64_t dmd_fits_ = 0, dmd_forecasts_ = 0, dmd_taylor_ = 0, dmd_reused_ = 0;
  bool first_ = true;
  std::map<std::pair<int, int>, Module> modules_;  // (branch, block)
};

}  // namespace

void register_taylorseer() {
  register_policy({"taylorseer",
                   "TaylorSeer: computes each block's attention on a schedule and forecasts it "
                   "between computations by a Taylor series of divided differences, or with "
                   "forecaster=dmd by dynamic mode decomposition of its last computed outputs "
                   "(cache-dit's DMD). Approximate. interval (5), before (3), after (-1: never), "
                   "order (1), factors (bf16|f32), forecaster (taylor|dmd), dmd_history (6), "
                   "dmd_rank (0: from the spectrum), dmd_ridge (1e-8).",
                   factory_of<TaylorSeer>()});
}

}  // namespace flowkv::cache
