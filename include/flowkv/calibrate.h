// Fitting approximate step caches to a model (flowkv calibrate; docs/caches.md): TeaCache's
// rescaling polynomial and MagCache's per-step magnitude ratios, from what requests run with
// teacache:calibrate=1 and magcache:calibrate=1 measured; and the case manifest such runs read.
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

  // Ready-to-pass specs: "teacache:coefficients=a/b/c/d/e", "magcache:ratios=1/r2/..." (values
  // printed so that they parse back to the same doubles); "" when not fitted.
  std::string teacache_spec() const;
  std::string magcache_spec() const;
};

// From the step-cache reports (GenerateResult::step_caches) of requests that ran with
// teacache:calibrate=1 and magcache:calibrate=1 (either or both). Throws flowkv::Error when
// MagCache's series differ in length (requests of different step counts).
StepCacheCalibration fit_step_caches(const std::vector<std::vector<StepCacheStats>>& requests);

}  // namespace flowkv
