// flowkv/calibrate.h: the least-squares polynomial and what calibration requests give.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <map>

#include "flowkv/calibrate.h"
#include "flowkv/error.h"

namespace flowkv {

namespace {

// Solves min ||A c - b|| for A [n, m] (row-major, n >= m, full rank) by Householder QR; A and b
// are overwritten. Throws when a column is (numerically) dependent on the ones before it.
std::vector<double> least_squares_qr(std::vector<double>& a, std::vector<double>& b, size_t n,
                                     size_t m) {
  auto at = [&](size_t i, size_t j) -> double& { return a[i * m + j]; };
  double largest = 0;
  for (size_t k = 0; k < m; ++k) {
    double norm = 0;
    for (size_t i = k; i < n; ++i) norm += at(i, k) * at(i, k);
    norm = std::sqrt(norm);
    largest = std::max(largest, norm);
    FLOWKV_CHECK(norm > 1e-12 * largest && norm > 0,
                 "polynomial fit: the x values do not determine the polynomial (too few distinct "
                 "values for its degree)");
    const double alpha = at(k, k) > 0 ? -norm : norm;
    // v = a[k:, k] - alpha e_1; H = I - 2 v v^T / (v^T v) maps a[k:, k] to alpha e_1.
    std::vector<double> v(n - k);
    for (size_t i = k; i < n; ++i) v[i - k] = at(i, k);
    v[0] -= alpha;
    double vv = 0;
    for (double e : v) vv += e * e;
    for (size_t j = k; j < m; ++j) {
      double d = 0;
      for (size_t i = k; i < n; ++i) d += v[i - k] * at(i, j);
      const double f = 2 * d / vv;
      for (size_t i = k; i < n; ++i) at(i, j) -= f * v[i - k];
    }
    double d = 0;
    for (size_t i = k; i < n; ++i) d += v[i - k] * b[i];
    const double f = 2 * d / vv;
    for (size_t i = k; i < n; ++i) b[i] -= f * v[i - k];
  }
  std::vector<double> c(m);
  for (size_t k = m; k-- > 0;) {  // R c = (Q^T b)[:m]
    double s = b[k];
    for (size_t j = k + 1; j < m; ++j) s -= at(k, j) * c[j];
    c[k] = s / at(k, k);
  }
  return c;
}

// The shortest decimal text that reads back as the same double.
std::string shortest(double v) {
  char buf[40];
  for (int prec = 1; prec <= 17; ++prec) {
    std::snprintf(buf, sizeof buf, "%.*g", prec, v);
    if (std::strtod(buf, nullptr) == v) break;
  }
  return buf;
}

std::string joined(const std::vector<double>& v) {
  std::string s;
  for (double x : v) s += (s.empty() ? "" : "/") + shortest(x);
  return s;
}

// Adds one "meancache.costs" series ([steps, max_gap, max_span, costs...]) to the running sum.
void add_meancache_costs(MeanCacheCosts& sum, const std::vector<double>& v, size_t request) {
  FLOWKV_CHECK(v.size() >= 3, "calibration: a MeanCache cost series without its sizes");
  const int steps = static_cast<int>(v[0]), gap = static_cast<int>(v[1]),
            span = static_cast<int>(v[2]);
  FLOWKV_CHECK(steps >= 1 && gap >= 1 && span >= 1 &&
                   v.size() == 3 + static_cast<size_t>(steps) * gap * span,
               "calibration: a MeanCache cost series of ", v.size(), " values does not hold ",
               steps, " x ", gap, " x ", span, " costs");
  if (sum.series == 0) {
    sum.steps = steps, sum.max_gap = gap, sum.max_span = span;
    sum.cost.assign(v.size() - 3, 0.0);
  }
  FLOWKV_CHECK(sum.steps == steps && sum.max_gap == gap && sum.max_span == span,
               "calibration: request ", request + 1, " measured MeanCache over ", steps,
               " steps (gaps ", gap, ", spans ", span, "), an earlier one over ", sum.steps, " (",
               sum.max_gap, ", ", sum.max_span, "): run every request with the same step count");
  for (size_t i = 0; i < sum.cost.size(); ++i) {
    if (v[3 + i] < 0) {
      sum.cost[i] = -1;
    } else if (sum.cost[i] >= 0) {
      sum.cost[i] += v[3 + i];
    }
  }
  sum.series++;
}

}  // namespace

MeanCacheSchedule search_meancache_schedule(const MeanCacheCosts& c, int budget, double gamma) {
  const int n = c.steps;
  FLOWKV_CHECK(n >= 1 && c.series > 0,
               "meancache schedule: no costs measured (run the requests "
               "with meancache:calibrate=1)");
  FLOWKV_CHECK(std::isfinite(gamma) && gamma > 0, "meancache schedule: gamma ", gamma,
               " is not a positive number");
  MeanCacheSchedule s;
  s.budget = std::min(budget, n);
  if (budget >= n) {
    for (int k = 0; k < n; ++k) s.compute.push_back(k), s.spans.push_back(0);
    return s;
  }
  FLOWKV_CHECK(budget >= 2, "meancache schedule: budget ", budget, " for ", n,
               " steps: the first and the last step always compute, so at least 2");
  // The edge i -> i + g: its weight and its best span (0 when nothing is skipped).
  auto edge = [&](int i, int g, int* span) {
    *span = 0;
    if (g == 1) return 0.0;
    double best = -1;
    for (int k = 1; k <= c.max_span; ++k) {
      const double w = c.at(i, g, k);
      if (w >= 0 && (best < 0 || w < best)) best = w, *span = k;
    }
    return best;
  };
  constexpr double kInf = std::numeric_limits<double>::infinity();
  // best[b][j]: the lightest path 0 -> j through b + 1 computed steps; from[b][j] its last edge.
  const size_t B = static_cast<size_t>(budget), N = static_cast<size_t>(n);
  std::vector<std::vector<double>> best(B, std::vector<double>(N, kInf));
  std::vector<std::vector<int>> from(B, std::vector<int>(N, -1));
  best[0][0] = 0;
  for (size_t b = 1; b < B; ++b) {
    for (int j = 1; j < n; ++j) {
      for (int i = std::max(0, j - c.max_gap); i < j; ++i) {
        if (best[b - 1][static_cast<size_t>(i)] == kInf) continue;
        int span = 0;
        const double w = edge(i, j - i, &span);
        if (w < 0) continue;
        const double total = best[b - 1][static_cast<size_t>(i)] + std::pow(w, gamma);
        if (total < best[b][static_cast<size_t>(j)]) {
          best[b][static_cast<size_t>(j)] = total, from[b][static_cast<size_t>(j)] = i;
        }
      }
    }
  }
  FLOWKV_CHECK(best[B - 1][N - 1] < kInf, "meancache schedule: ", budget,
               " computed steps cannot "
               "cover ",
               n, " steps with at most ", c.max_gap - 1,
               " skipped in a row (measured "
               "with max_gap=",
               c.max_gap, "): raise the budget or calibrate with a larger max_gap");
  s.cost = best[B - 1][N - 1];
  for (int b = budget - 1, j = n - 1; b >= 0;
       j = from[static_cast<size_t>(b)][static_cast<size_t>(j)], --b)
    s.compute.push_back(j);
  std::reverse(s.compute.begin(), s.compute.end());
  for (size_t m = 0; m < s.compute.size(); ++m) {
    int span = 0;
    if (m + 1 < s.compute.size()) {
      const double w = edge(s.compute[m], s.compute[m + 1] - s.compute[m], &span);
      s.peak = std::max(s.peak, w);
    }
    s.spans.push_back(span);
  }
  return s;
}

std::string MeanCacheSchedule::spec() const {
  auto list = [](const std::vector<int>& v) {
    std::string out;
    for (int x : v) out += (out.empty() ? "" : "/") + std::to_string(x);
    return out;
  };
  return compute.empty() ? "" : "meancache:schedule=" + list(compute) + ",spans=" + list(spans);
}

PolynomialFit fit_polynomial(const std::vector<double>& x, const std::vector<double>& y,
                             int degree) {
  FLOWKV_CHECK(degree >= 0 && degree <= 10, "polynomial fit: degree ", degree,
               " is outside [0, 10]");
  FLOWKV_CHECK(x.size() == y.size(), "polynomial fit: ", x.size(), " x values but ", y.size(),
               " y values");
  for (size_t i = 0; i < x.size(); ++i) {
    FLOWKV_CHECK(std::isfinite(x[i]) && std::isfinite(y[i]), "polynomial fit: sample ", i,
                 " is not finite (", x[i], ", ", y[i], ")");
  }
  std::vector<double> distinct = x;
  std::sort(distinct.begin(), distinct.end());
  distinct.erase(std::unique(distinct.begin(), distinct.end()), distinct.end());
  const size_t n = x.size(), m = static_cast<size_t>(degree) + 1;
  FLOWKV_CHECK(distinct.size() >= m, "polynomial fit: a degree-", degree, " fit needs ", m,
               " distinct x values; got ", distinct.size(), " (of ", n, " samples)");

  PolynomialFit fit;
  fit.samples = static_cast<int64_t>(n);
  fit.x_min = distinct.front(), fit.x_max = distinct.back();
  // u = (x - mid) / half in [-1, 1] keeps the Vandermonde columns of comparable size.
  const double mid = 0.5 * (fit.x_min + fit.x_max);
  const double half = m == 1 ? 1.0 : 0.5 * (fit.x_max - fit.x_min);
  std::vector<double> a(n * m), b = y;
  for (size_t i = 0; i < n; ++i) {
    const double u = (x[i] - mid) / half;
    double p = 1;
    for (size_t j = 0; j < m; ++j) a[i * m + j] = p, p *= u;
  }
  const std::vector<double> cu = least_squares_qr(a, b, n, m);  // ascending powers of u
  // sum_k cu_k ((x - mid) / half)^k: the coefficient of x^j is
  // sum_{k >= j} cu_k C(k, j) (-mid)^(k - j) / half^k.
  std::vector<double> ascending(m, 0.0);
  for (size_t k = 0; k < m; ++k) {
    const double scale = cu[k] / std::pow(half, static_cast<double>(k));
    double binom = 1;  // C(k, j), from j = 0
    for (size_t j = 0; j <= k; ++j) {
      ascending[j] += scale * binom * std::pow(-mid, static_cast<double>(k - j));
      binom = binom * static_cast<double>(k - j) / static_cast<double>(j + 1);
    }
  }
  fit.coefficients.assign(ascending.rbegin(), ascending.rend());
  double ss = 0;
  for (size_t i = 0; i < n; ++i) {
    const double r = y[i] - fit.at(x[i]);
    ss += r * r;
    fit.max_residual = std::max(fit.max_residual, std::abs(r));
  }
  fit.rms_residual = std::sqrt(ss / static_cast<double>(n));
  return fit;
}

double polyval(const std::vector<double>& highest_first, double x) {
  double y = 0;
  for (double c : highest_first) y = y * x + c;
  return y;
}

StepCacheCalibration fit_step_caches(const std::vector<std::vector<StepCacheStats>>& requests) {
  StepCacheCalibration cal;
  std::vector<double> xs, ys;
  std::vector<double> sum;
  for (size_t r = 0; r < requests.size(); ++r) {
    std::map<int, std::vector<double>> x, y;  // by branch, this request
    for (const StepCacheStats& st : requests[r]) {
      for (const StepCacheSeries& s : st.measured) {
        if (s.name == "meancache.costs") {
          add_meancache_costs(cal.meancache, s.values, r);
        } else if (s.name == "teacache.x") {
          x[s.branch].insert(x[s.branch].end(), s.values.begin(), s.values.end());
        } else if (s.name == "teacache.y") {
          y[s.branch].insert(y[s.branch].end(), s.values.begin(), s.values.end());
        } else if (s.name == "magcache.ratios") {
          if (cal.magcache_series == 0) sum.assign(s.values.size(), 0.0);
          FLOWKV_CHECK(s.values.size() == sum.size(), "calibration: request ", r + 1, " measured ",
                       s.values.size(), " MagCache ratios, an earlier one ", sum.size(),
                       ": run every request with the same step count");
          for (size_t i = 0; i < sum.size(); ++i) sum[i] += s.values[i];
          cal.magcache_series++;
        }
      }
    }
    for (const auto& [branch, xb] : x) {
      const std::vector<double>& yb = y[branch];
      FLOWKV_CHECK(xb.size() == yb.size(), "calibration: request ", r + 1, " has ", xb.size(),
                   " TeaCache x values but ", yb.size(), " y values");
      xs.insert(xs.end(), xb.begin(), xb.end());
      ys.insert(ys.end(), yb.begin(), yb.end());
    }
  }
  for (double s : sum) cal.magcache_ratios.push_back(s / static_cast<double>(cal.magcache_series));
  for (double& c : cal.meancache.cost) {
    if (c >= 0) c /= static_cast<double>(cal.meancache.series);
  }
  constexpr int kDegree = 4;  // TeaCache's polynomial
  try {
    cal.teacache = fit_polynomial(xs, ys, kDegree);
  } catch (const Error& e) {
    cal.teacache = PolynomialFit{};
    cal.teacache.samples = static_cast<int64_t>(xs.size());
    cal.teacache_problem = std::string(e.what()) +
                           (xs.empty() ? " (no TeaCache pairs: run with teacache:calibrate=1 and "
                                         "at least 2 steps)"
                                       : " (run more cases or more steps)");
  }
  return cal;
}

std::string StepCacheCalibration::teacache_spec() const {
  return teacache.coefficients.empty() ? ""
                                       : "teacache:coefficients=" + joined(teacache.coefficients);
}

std::string StepCacheCalibration::magcache_spec() const {
  return magcache_ratios.empty() ? "" : "magcache:ratios=" + joined(magcache_ratios);
}

}  // namespace flowkv
