#include "cache/dmd.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

namespace flowkv::cache {

using cd = std::complex<double>;

namespace dmd_detail {

namespace {

constexpr double kEps = std::numeric_limits<double>::epsilon();

// A Givens rotation G = [[c, s], [-conj(s), c]] (c real) with G [x; y] = [rho; 0].
void givens(cd x, cd y, double& c, cd& s) {
  const double ax = std::abs(x), ay = std::abs(y);
  if (ay == 0) {
    c = 1, s = 0;
    return;
  }
  if (ax == 0) {
    c = 0, s = std::conj(y) / ay;
    return;
  }
  const double r = std::hypot(ax, ay);
  c = ax / r;
  s = (x / ax) * std::conj(y) / r;
}

// Reduces h (n x n row-major) to upper Hessenberg form by Householder similarities,
// accumulating them into z (h_out = z^H h z).
void hessenberg(std::vector<cd>& h, std::vector<cd>& z, int n) {
  std::vector<cd> v(static_cast<size_t>(n));
  auto at = [n](std::vector<cd>& m, int i, int j) -> cd& {
    return m[static_cast<size_t>(i * n + j)];
  };
  for (int k = 0; k + 2 < n; ++k) {
    double norm2 = 0;
    for (int i = k + 1; i < n; ++i) norm2 += std::norm(at(h, i, k));
    const double norm = std::sqrt(norm2);
    if (norm == 0) continue;
    const cd x0 = at(h, k + 1, k);
    const cd phase = std::abs(x0) == 0 ? cd(1) : x0 / std::abs(x0);
    const cd alpha = -phase * norm;
    for (int i = 0; i < n; ++i) v[static_cast<size_t>(i)] = 0;
    for (int i = k + 1; i < n; ++i) v[static_cast<size_t>(i)] = at(h, i, k);
    v[static_cast<size_t>(k + 1)] -= alpha;
    double vnorm2 = 0;
    for (int i = k + 1; i < n; ++i) vnorm2 += std::norm(v[static_cast<size_t>(i)]);
    if (vnorm2 == 0) continue;
    // P = I - 2 v v^H / (v^H v); h = P h P, z = z P.
    for (int j = 0; j < n; ++j) {
      cd dot = 0;
      for (int i = k + 1; i < n; ++i) dot += std::conj(v[static_cast<size_t>(i)]) * at(h, i, j);
      const cd f = 2.0 * dot / vnorm2;
      for (int i = k + 1; i < n; ++i) at(h, i, j) -= f * v[static_cast<size_t>(i)];
    }
    for (std::vector<cd>* m : {&h, &z}) {
      for (int i = 0; i < n; ++i) {
        cd dot = 0;
        for (int j = k + 1; j < n; ++j) dot += at(*m, i, j) * v[static_cast<size_t>(j)];
        const cd f = 2.0 * dot / vnorm2;
        for (int j = k + 1; j < n; ++j) at(*m, i, j) -= f * std::conj(v[static_cast<size_t>(j)]);
      }
    }
    for (int i = k + 2; i < n; ++i) at(h, i, k) = 0;
  }
}

}  // namespace

void jacobi_svd(const std::vector<double>& a, int rows, int cols, std::vector<double>& s,
                std::vector<double>& u, std::vector<double>& v) {
  std::vector<double> b = a;  // rows x cols; its columns are rotated until orthogonal
  v.assign(static_cast<size_t>(cols * cols), 0.0);
  for (int i = 0; i < cols; ++i) v[static_cast<size_t>(i * cols + i)] = 1;
  auto col_dot = [&](const std::vector<double>& m, int nrows, int ncols, int p, int q) {
    double sum = 0;
    for (int i = 0; i < nrows; ++i)
      sum += m[static_cast<size_t>(i * ncols + p)] * m[static_cast<size_t>(i * ncols + q)];
    return sum;
  };
  auto rotate = [](std::vector<double>& m, int nrows, int ncols, int p, int q, double c,
                   double sn) {
    for (int i = 0; i < nrows; ++i) {
      double& x = m[static_cast<size_t>(i * ncols + p)];
      double& y = m[static_cast<size_t>(i * ncols + q)];
      const double xp = c * x - sn * y, yq = sn * x + c * y;
      x = xp, y = yq;
    }
  };
  for (int sweep = 0; sweep < 80; ++sweep) {
    bool rotated = false;
    for (int p = 0; p < cols; ++p) {
      for (int q = p + 1; q < cols; ++q) {
        const double alpha = col_dot(b, rows, cols, p, p), beta = col_dot(b, rows, cols, q, q);
        const double gamma = col_dot(b, rows, cols, p, q);
        if (gamma == 0 || std::abs(gamma) <= kEps * std::sqrt(alpha * beta)) continue;
        rotated = true;
        const double zeta = (beta - alpha) / (2 * gamma);
        const double t = (zeta >= 0 ? 1.0 : -1.0) / (std::abs(zeta) + std::hypot(1.0, zeta));
        const double c = 1 / std::hypot(1.0, t), sn = c * t;
        rotate(b, rows, cols, p, q, c, sn);
        rotate(v, cols, cols, p, q, c, sn);
      }
    }
    if (!rotated) break;
  }
  std::vector<double> norms(static_cast<size_t>(cols));
  for (int j = 0; j < cols; ++j)
    norms[static_cast<size_t>(j)] = std::sqrt(col_dot(b, rows, cols, j, j));
  std::vector<int> order(static_cast<size_t>(cols));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int x, int y) {
    return norms[static_cast<size_t>(x)] > norms[static_cast<size_t>(y)];
  });
  s.assign(static_cast<size_t>(cols), 0.0);
  u.assign(static_cast<size_t>(rows * cols), 0.0);
  std::vector<double> vs(static_cast<size_t>(cols * cols));
  for (int k = 0; k < cols; ++k) {
    const int j = order[static_cast<size_t>(k)];
    const double sj = norms[static_cast<size_t>(j)];
    s[static_cast<size_t>(k)] = sj;
    for (int i = 0; i < rows; ++i)
      u[static_cast<size_t>(i * cols + k)] =
          sj > 0 ? b[static_cast<size_t>(i * cols + j)] / sj : 0.0;
    for (int i = 0; i < cols; ++i)
      vs[static_cast<size_t>(i * cols + k)] = v[static_cast<size_t>(i * cols + j)];
  }
  v = std::move(vs);
}

bool eigen(const std::vector<double>& a, int n, std::vector<cd>& lambda, std::vector<cd>& w) {
  std::vector<cd> h(a.begin(), a.end()), z(static_cast<size_t>(n * n), 0.0);
  for (int i = 0; i < n; ++i) z[static_cast<size_t>(i * n + i)] = 1;
  auto H = [&](int i, int j) -> cd& { return h[static_cast<size_t>(i * n + j)]; };
  auto Z = [&](int i, int j) -> cd& { return z[static_cast<size_t>(i * n + j)]; };
  hessenberg(h, z, n);
  double hnorm = 0;
  for (const cd& x : h) hnorm = std::max(hnorm, std::abs(x));

  // Shifted QR steps on the active window [lo, hi] until h is upper triangular (the complex
  // Schur form z^H a z), each step applied to all of h so that z stays its similarity.
  std::vector<double> cs(static_cast<size_t>(n));
  std::vector<cd> ss(static_cast<size_t>(n));
  int iter = 0;
  for (int hi = n - 1; hi > 0;) {
    int lo = hi;
    for (; lo > 0; --lo) {
      const double scale = std::abs(H(lo - 1, lo - 1)) + std::abs(H(lo, lo));
      if (std::abs(H(lo, lo - 1)) <= kEps * (scale > 0 ? scale : hnorm)) {
        H(lo, lo - 1) = 0;
        break;
      }
    }
    if (lo == hi) {  // h[hi][hi] has converged
      --hi, iter = 0;
      continue;
    }
    if (++iter > 60 * n) return false;
    // Wilkinson shift: the eigenvalue of the trailing 2 x 2 block nearer its last entry; every
    // tenth step an exceptional shift breaks cycles.
    cd mu;
    if (iter % 10 == 0) {
      mu = H(hi, hi) + 0.75 * std::abs(H(hi, hi - 1));
    } else {
      const cd p = H(hi - 1, hi - 1), q = H(hi - 1, hi), r = H(hi, hi - 1), t = H(hi, hi);
      const cd half = 0.5 * (p - t), disc = std::sqrt(half * half + q * r);
      const cd m1 = t - (q * r) / (half + disc), m2 = t - (q * r) / (half - disc);
      if (std::abs(half + disc) == 0 && std::abs(half - disc) == 0) {
        mu = t;
      } else if (std::abs(half + disc) == 0) {
        mu = m2;
      } else if (std::abs(half - disc) == 0) {
        mu = m1;
      } else {
        mu = std::abs(m1 - t) < std::abs(m2 - t) ? m1 : m2;
      }
    }
    for (int k = lo; k <= hi; ++k) H(k, k) -= mu;
    for (int k = lo; k < hi; ++k) {
      givens(H(k, k), H(k + 1, k), cs[static_cast<size_t>(k)], ss[static_cast<size_t>(k)]);
      const double c = cs[static_cast<size_t>(k)];
      const cd s = ss[static_cast<size_t>(k)];
      for (int j = k; j < n; ++j) {
        const cd x = H(k, j), y = H(k + 1, j);
        H(k, j) = c * x + s * y;
        H(k + 1, j) = -std::conj(s) * x + c * y;
      }
    }
    for (int k = lo; k < hi; ++k) {
      const double c = cs[static_cast<size_t>(k)];
      const cd s = ss[static_cast<size_t>(k)];
      const int last = std::min(k + 2, hi);
      for (int i = 0; i <= last; ++i) {
        const cd x = H(i, k), y = H(i, k + 1);
        H(i, k) = x * c + y * std::conj(s);
        H(i, k + 1) = -x * s + y * c;
      }
      for (int i = 0; i < n; ++i) {
        const cd x = Z(i, k), y = Z(i, k + 1);
        Z(i, k) = x * c + y * std::conj(s);
        Z(i, k + 1) = -x * s + y * c;
      }
    }
    for (int k = lo; k <= hi; ++k) H(k, k) += mu;
  }

  // Eigenvectors of the triangular factor by back-substitution (a near-zero pivot of a
  // repeated eigenvalue is replaced by a small number, as LAPACK's trevc does), then w = z y.
  lambda.resize(static_cast<size_t>(n));
  for (int k = 0; k < n; ++k) lambda[static_cast<size_t>(k)] = H(k, k);
  const double small = std::max(kEps * hnorm, std::numeric_limits<double>::min());
  w.assign(static_cast<size_t>(n * n), 0.0);
  std::vector<cd> y(static_cast<size_t>(n));
  for (int k = 0; k < n; ++k) {
    std::fill(y.begin(), y.end(), cd(0));
    y[static_cast<size_t>(k)] = 1;
    for (int i = k - 1; i >= 0; --i) {
      cd sum = 0;
      for (int j = i + 1; j <= k; ++j) sum += H(i, j) * y[static_cast<size_t>(j)];
      cd pivot = H(i, i) - H(k, k);
      if (std::abs(pivot) < small) pivot = small;
      y[static_cast<size_t>(i)] = -sum / pivot;
    }
    double norm2 = 0;
    for (int i = 0; i < n; ++i) {
      cd sum = 0;
      for (int j = 0; j <= k; ++j) sum += Z(i, j) * y[static_cast<size_t>(j)];
      w[static_cast<size_t>(i * n + k)] = sum;
      norm2 += std::norm(sum);
    }
    const double norm = std::sqrt(norm2);
    if (!(norm > 0) || !std::isfinite(norm)) return false;
    for (int i = 0; i < n; ++i) w[static_cast<size_t>(i * n + k)] /= norm;
  }
  return true;
}

std::vector<double> gram_factor(const std::vector<double>& gram, int m) {
  // gram = V diag(lambda) V^T. One-sided Jacobi gives |lambda| and u = -v for a negative
  // eigenvalue (rounding of a rank-deficient window): those count as zero.
  std::vector<double> s, u, v;
  jacobi_svd(gram, m, m, s, u, v);
  std::vector<double> f(static_cast<size_t>(m * m), 0.0);
  for (int k = 0; k < m; ++k) {
    double sign = 0;
    for (int i = 0; i < m; ++i)
      sign += u[static_cast<size_t>(i * m + k)] * v[static_cast<size_t>(i * m + k)];
    const double root = sign > 0 ? std::sqrt(s[static_cast<size_t>(k)]) : 0.0;
    for (int j = 0; j < m; ++j)
      f[static_cast<size_t>(k * m + j)] = root * v[static_cast<size_t>(j * m + k)];
  }
  return f;
}

}  // namespace dmd_detail

namespace {

// lambda^k on the principal branch; integer k by repeated products (exact for a zero or a
// negative real eigenvalue).
cd power(cd lambda, double k) {
  if (k == std::floor(k) && k >= 0 && k <= 64) {
    cd out = 1;
    for (int i = 0; i < static_cast<int>(k); ++i) out *= lambda;
    return out;
  }
  if (lambda == cd(0)) return 0;
  return std::pow(lambda, k);
}

// The least-squares solution of phi b = y (phi rows x cols complex, row-major, rows >= cols)
// by Gram-Schmidt with reorthogonalisation. False when phi's columns are dependent.
bool least_squares(const std::vector<cd>& phi, int rows, int cols, const std::vector<double>& y,
                   std::vector<cd>& b) {
  std::vector<cd> q(static_cast<size_t>(rows * cols)), r(static_cast<size_t>(cols * cols), 0.0);
  auto Q = [&](int i, int j) -> cd& { return q[static_cast<size_t>(i * cols + j)]; };
  for (int j = 0; j < cols; ++j) {
    double norm0 = 0;
    for (int i = 0; i < rows; ++i)
      Q(i, j) = phi[static_cast<size_t>(i * cols + j)], norm0 += std::norm(Q(i, j));
    for (int pass = 0; pass < 2; ++pass) {
      for (int p = 0; p < j; ++p) {
        cd h = 0;
        for (int i = 0; i < rows; ++i) h += std::conj(Q(i, p)) * Q(i, j);
        for (int i = 0; i < rows; ++i) Q(i, j) -= h * Q(i, p);
        r[static_cast<size_t>(p * cols + j)] += h;
      }
    }
    double norm2 = 0;
    for (int i = 0; i < rows; ++i) norm2 += std::norm(Q(i, j));
    const double norm = std::sqrt(norm2);
    if (!(norm > 1e-13 * std::sqrt(norm0))) return false;
    r[static_cast<size_t>(j * cols + j)] = norm;
    for (int i = 0; i < rows; ++i) Q(i, j) /= norm;
  }
  b.assign(static_cast<size_t>(cols), 0.0);
  for (int j = cols - 1; j >= 0; --j) {
    cd sum = 0;
    for (int i = 0; i < rows; ++i) sum += std::conj(Q(i, j)) * y[static_cast<size_t>(i)];
    for (int p = j + 1; p < cols; ++p)
      sum -= r[static_cast<size_t>(j * cols + p)] * b[static_cast<size_t>(p)];
    b[static_cast<size_t>(j)] = sum / r[static_cast<size_t>(j * cols + j)];
  }
  return true;
}

}  // namespace

std::vector<double> DmdFit::coefficients(double k) const {
  const int n = m_ - 1, r = rank();
  std::vector<cd> lk(static_cast<size_t>(r));
  for (int i = 0; i < r; ++i)
    lk[static_cast<size_t>(i)] = power(lambda_[static_cast<size_t>(i)], k);
  std::vector<double> c(static_cast<size_t>(n));
  for (int j = 0; j < n; ++j) {
    cd sum = 0;
    for (int i = 0; i < r; ++i)
      sum += g_[static_cast<size_t>(j * r + i)] * lk[static_cast<size_t>(i)];
    c[static_cast<size_t>(j)] = sum.real();
    if (!std::isfinite(sum.real())) return {};
  }
  return c;
}

template <class T>
double dmd_dot(const T* a, const T* b, int64_t d) {
  // Eight partial sums: independent chains the compiler can keep in vector lanes.
  double part[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t e = 0;
  for (; e + 8 <= d; e += 8) {
    for (int l = 0; l < 8; ++l)
      part[l] += static_cast<double>(a[e + l]) * static_cast<double>(b[e + l]);
  }
  double tail = 0;
  for (; e < d; ++e) tail += static_cast<double>(a[e]) * static_cast<double>(b[e]);
  return ((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7])) +
         tail;
}

template <class T>
std::optional<DmdFit> dmd_fit(const std::vector<const T*>& snaps, int64_t d,
                              const DmdOptions& options) {
  const int m = static_cast<int>(snaps.size());
  std::vector<double> gram(static_cast<size_t>(m * m));
  for (int i = 0; i < m; ++i) {
    for (int j = 0; j <= i; ++j) {
      gram[static_cast<size_t>(i * m + j)] = gram[static_cast<size_t>(j * m + i)] =
          dmd_dot(snaps[static_cast<size_t>(i)], snaps[static_cast<size_t>(j)], d);
    }
  }
  return dmd_fit_gram(gram, m, options);
}

std::optional<DmdFit> dmd_fit_gram(const std::vector<double>& gram, int m,
                                   const DmdOptions& options) {
  using namespace dmd_detail;
  const int n = m - 1;
  if (m < 2 || gram.size() != static_cast<size_t>(m * m)) return std::nullopt;
  for (double g : gram) {
    if (!std::isfinite(g)) return std::nullopt;
  }
  // In the coordinates F gives (snapshots = Q F for an orthonormal Q never formed): X = Q R0,
  // X' = Q R1 and x_{m-1} = Q F[:, m-1].
  const std::vector<double> rr = gram_factor(gram, m);
  std::vector<double> r0(static_cast<size_t>(m * n)), r1(static_cast<size_t>(m * n));
  for (int i = 0; i < m; ++i) {
    for (int j = 0; j < n; ++j) {
      r0[static_cast<size_t>(i * n + j)] = rr[static_cast<size_t>(i * m + j)];
      r1[static_cast<size_t>(i * n + j)] = rr[static_cast<size_t>(i * m + j + 1)];
    }
  }
  std::vector<double> s, u, v;
  jacobi_svd(r0, m, n, s, u, v);
  if (!(s[0] > 0) || !std::isfinite(s[0])) return std::nullopt;
  int r = options.rank;
  if (r <= 0) {
    r = 0;
    for (double x : s) r += x > s[0] * options.rel_tol ? 1 : 0;
  }
  r = std::clamp(r, 1, n);

  // A~ = U_r^T R1 V_r S_r^-1, and P = R1 V_r S_r^-1 (the modes before W), m x r.
  std::vector<double> p(static_cast<size_t>(m * r), 0.0), atil(static_cast<size_t>(r * r), 0.0);
  for (int i = 0; i < m; ++i) {
    for (int c = 0; c < r; ++c) {
      double sum = 0;
      for (int j = 0; j < n; ++j)
        sum += r1[static_cast<size_t>(i * n + j)] * v[static_cast<size_t>(j * n + c)];
      p[static_cast<size_t>(i * r + c)] = sum / (s[static_cast<size_t>(c)] + options.ridge);
    }
  }
  for (int a = 0; a < r; ++a) {
    for (int c = 0; c < r; ++c) {
      double sum = 0;
      for (int i = 0; i < m; ++i)
        sum += u[static_cast<size_t>(i * n + a)] * p[static_cast<size_t>(i * r + c)];
      atil[static_cast<size_t>(a * r + c)] = sum;
    }
  }
  DmdFit fit;
  fit.m_ = m;
  std::vector<cd> w;
  if (!eigen(atil, r, fit.lambda_, w)) return std::nullopt;

  // Phi = P W (m x r); b = argmin ||Phi b - R[:, m-1]||.
  std::vector<cd> phi(static_cast<size_t>(m * r), 0.0);
  for (int i = 0; i < m; ++i) {
    for (int c = 0; c < r; ++c) {
      cd sum = 0;
      for (int j = 0; j < r; ++j)
        sum += p[static_cast<size_t>(i * r + j)] * w[static_cast<size_t>(j * r + c)];
      phi[static_cast<size_t>(i * r + c)] = sum;
    }
  }
  std::vector<double> last(static_cast<size_t>(m));
  for (int i = 0; i < m; ++i) last[static_cast<size_t>(i)] = rr[static_cast<size_t>(i * m + m - 1)];
  std::vector<cd> b;
  if (!least_squares(phi, m, r, last, b)) return std::nullopt;

  // g = V_r S_r^-1 W diag(b): the forecast X' g (lambda^k) needs only the snapshots.
  fit.g_.assign(static_cast<size_t>(n * r), 0.0);
  for (int j = 0; j < n; ++j) {
    for (int c = 0; c < r; ++c) {
      cd sum = 0;
      for (int a = 0; a < r; ++a) {
        sum += v[static_cast<size_t>(j * n + a)] / (s[static_cast<size_t>(a)] + options.ridge) *
               w[static_cast<size_t>(a * r + c)];
      }
      fit.g_[static_cast<size_t>(j * r + c)] = sum * b[static_cast<size_t>(c)];
    }
  }
  for (const cd& x : fit.g_) {
    if (!std::isfinite(x.real()) || !std::isfinite(x.imag())) return std::nullopt;
  }
  return fit;
}

template <class T, class Out>
void dmd_combine(const std::vector<const T*>& snaps, int64_t d, const std::vector<double>& c,
                 Out* out) {
  // Blocks of values accumulated snapshot by snapshot (axpy loops the compiler vectorises).
  constexpr int64_t kBlock = 1024;
  double acc[kBlock];
  for (int64_t start = 0; start < d; start += kBlock) {
    const int64_t len = std::min(kBlock, d - start);
    std::fill(acc, acc + len, 0.0);
    for (size_t j = 0; j < c.size(); ++j) {
      const T* x = snaps[j + 1] + start;
      for (int64_t e = 0; e < len; ++e) acc[e] += c[j] * static_cast<double>(x[e]);
    }
    for (int64_t e = 0; e < len; ++e) out[start + e] = static_cast<Out>(acc[e]);
  }
}

template double dmd_dot(const float*, const float*, int64_t);
template double dmd_dot(const double*, const double*, int64_t);
template std::optional<DmdFit> dmd_fit(const std::vector<const float*>&, int64_t,
                                       const DmdOptions&);
template std::optional<DmdFit> dmd_fit(const std::vector<const double*>&, int64_t,
                                       const DmdOptions&);
template void dmd_combine(const std::vector<const float*>&, int64_t, const std::vector<double>&,
                          float*);
template void dmd_combine(const std::vector<const double*>&, int64_t, const std::vector<double>&,
                          double*);

}  // namespace flowkv::cache
