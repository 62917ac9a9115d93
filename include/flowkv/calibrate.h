// Fitting approximate step caches to a model (flowkv calibrate; docs/caches.md): TeaCache's
// rescaling polynomial and MagCache's per-step magnitude ratios, from what requests run with
// teacache:calibrate=1 and magcache:calibrate=1 measured; MeanCache's schedule, searched over
// what meancache:calibrate=1 measured; and the case manifest such runs read.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "flowkv/step_cache.h"

namespace flowkv {

// p(x) for coefficients highest power first, by Horner's rule (numpy.poly1d's evaluation): what
// TeaCache applies to its coefficients and what a fit is checked with.
double polyval(const std::vector<double>& highest_first, double x);

// A least-squares polynomial y ~ p(x), as numpy.polyfit(x, y, degree) computes it.
struct PolynomialFit {
  std::vector<double> coefficients;  // highest power first (numpy.polyfit's and poly1d's order)
  int64_t samples = 0;
  double rms_residual = 0;  // sqrt(mean((y - p(x))^2)) over the samples
  double max_residual = 0;  // max |y - p(x)|
  double x_min = 0, x_max = 0;
  double at(double x) const { return polyval(coefficients, x); }
};

// Fits in double: x is mapped onto [-1, 1] (its midpoint and half-range), the Vandermonde
// system is solved by Householder QR, and the coefficients are mapped back to powers of x.
// Throws flowkv::Error when the lengths differ, a value is not finite, or fewer than
// degree + 1 distinct x values are given (degree in [0, 10]).
PolynomialFit fit_polynomial(const std::vector<double>& x, const std::vector<double>& y,
                             int degree);

// MeanCache's interval costs (the "meancache.costs" series, averaged over requests): the
// relative L1 distance at step i + gap between the latents reached by computing step i and
// skipping the gap - 1 steps after it with JVP span K, and the latents of the full run.
struct MeanCacheCosts {
  int steps = 0, max_gap = 0, max_span = 0;
  std::vector<double> cost;  // [steps][max_gap][max_span]; -1 past the last step
  int64_t series = 0;        // how many runs were averaged
  double at(int i, int gap, int span) const {
    return cost[(static_cast<size_t>(i) * max_gap + static_cast<size_t>(gap - 1)) * max_span +
                static_cast<size_t>(span - 1)];
  }
};

// A MeanCache schedule: the steps that compute (first and last included) and, per computed
// step, the JVP span of the steps skipped after it (0 where none are).
struct MeanCacheSchedule {
  int budget = 0;
  std::vector<int> compute, spans;
  double cost = 0;           // sum over the intervals of cost^gamma
  double peak = 0;           // the largest interval cost
  std::string spec() const;  // "meancache:schedule=0/1/.../N-1,spans=0/2/..."
};

// The peak-suppressed shortest path (the paper's trajectory-stability schedule): nodes are the
// steps, an edge i -> j computes step i and skips i+1..j-1 with the best span, weighing
// cost(i, j - i, span)^gamma (gamma > 1 penalises one large deviation over several small
// ones); among the paths 0 -> steps-1 through exactly `budget` nodes, the lightest (ties: the
// earliest edges, then the smallest span). budget >= steps computes every step. Throws
// flowkv::Error when budget < 2 (with steps > 1) or the gaps the costs cover cannot reach.
MeanCacheSchedule search_meancache_schedule(const MeanCacheCosts& costs, int budget, double gamma);

// What a set of calibration requests gives.
struct StepCacheCalibration {
  // TeaCache: y (the model output's relative L1 change between a branch's consecutive calls)
  // against x (that of block 0's modulated input), every pair of every request and branch,
  // fitted with degree 4. Empty coefficients when it could not be fitted (teacache_problem says
  // why: too few pairs).
  PolynomialFit teacache;
  std::string teacache_problem;
  // MagCache: the per-step ratios, the mean over every request and branch (each series starts
  // with 1.0). Empty when none was measured.
  std::vector<double> magcache_ratios;
  int64_t magcache_series = 0;
  // MeanCache: the interval costs, averaged (series 0 when none was measured).
  MeanCacheCosts meancache;

  // Ready-to-pass specs: "teacache:coefficients=a/b/c/d/e", "magcache:ratios=1/r2/..." (values
  // printed so that they parse back to the same doubles); "" when not fitted.
  std::string teacache_spec() const;
  std::string magcache_spec() const;
};

// From the step-cache reports (GenerateResult::step_caches) of requests that ran with
// teacache:calibrate=1, magcache:calibrate=1 and meancache:calibrate=1 (any of them). Throws
// flowkv::Error when MagCache's or MeanCache's series differ in length (requests of different
// step counts).
StepCacheCalibration fit_step_caches(const std::vector<std::vector<StepCacheStats>>& requests);

}  // namespace flowkv
