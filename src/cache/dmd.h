// Dynamic mode decomposition over a short window of snapshots (exact DMD: Schmid 2010, Tu et
// al. 2014), the forecaster of cache-dit's DMD calibrator (cache_dit/caching/cache_contexts/
// calibrators/dmd.py, cache-dit 1.5.3) written anew after reading it, for TaylorSeer's
// forecaster=dmd.
//
// Snapshots x_0 .. x_{m-1} (oldest first, evenly spaced, d values each) are split into
// X = [x_0 .. x_{m-2}] and X' = [x_1 .. x_{m-1}]; a linear propagator X' ~= A X is identified
// through the economy SVD X = U S V^T truncated to rank r, A~ = U_r^T X' V_r S_r^-1 (r x r;
// S_r^-1 is 1 / (S_r + ridge) throughout), A~ W = W diag(lambda), modes Phi = X' V_r S_r^-1 W,
// amplitudes b = argmin ||Phi b - x_{m-1}||, and the forecast k spacings past the newest
// snapshot is Re(Phi (lambda^k .* b)).
//
// Everything is in double. The d-sized work is the Gram matrix of the snapshots (their inner
// products, O(d m^2), or O(d m) per new snapshot when a sliding window keeps the old ones): all
// of X, X' and x_{m-1} lie in the span of the snapshots, so with any F with F^T F = Gram (here
// from its eigendecomposition) the whole fit runs on m x m matrices in the coordinates F gives.
// Forming the Gram matrix squares the condition number: singular values down to cache-dit's
// cut (1e-4 of the largest) keep a relative accuracy of about 1e-8, far below the float32
// rounding of the features themselves. A forecast is then a real combination of the snapshots
// x_1 .. x_{m-1}: O(d m) per forecast.
#pragma once

#include <complex>
#include <cstdint>
#include <optional>
#include <vector>

namespace flowkv::cache {

struct DmdOptions {
  // SVD truncation rank; 0 keeps the singular values above rel_tol times the largest (at least
  // one). A rank above the number of singular values is clamped to it.
  int rank = 0;
  double ridge = 1e-8;    // added to each kept singular value before it is inverted
  double rel_tol = 1e-4;  // cache-dit's automatic rank rule (not a knob there)
};

// One window's fit. Horizon-free: forecasts at any k reuse it.
class DmdFit {
 public:
  int snapshots() const { return m_; }
  int rank() const { return static_cast<int>(lambda_.size()); }
  const std::vector<std::complex<double>>& eigenvalues() const { return lambda_; }
  // The forecast k spacings after the newest snapshot (k > 0, fractional allowed: lambda^k on
  // the principal branch) is sum_j c[j] x_{j+1}, j = 0 .. m-2. Empty when a coefficient is
  // not finite.
  std::vector<double> coefficients(double k) const;

 private:
  friend std::optional<DmdFit> dmd_fit_gram(const std::vector<double>&, int, const DmdOptions&);
  int m_ = 0;
  std::vector<std::complex<double>> lambda_;
  std::vector<std::complex<double>> g_;  // (m-1) x r, row-major: V_r S_r^-1 W diag(b)
};

// sum_e a[e] * b[e], accumulated in double.
template <class T>
double dmd_dot(const T* a, const T* b, int64_t d);

// Fits the snapshots x_0 .. x_{m-1} (oldest first) given by their m x m Gram matrix (row-major,
// gram[i * m + j] = <x_i, x_j>); m >= 2. nullopt when the fit is degenerate (every snapshot
// zero, no convergence of the eigen solver, modes without a least-squares solution): cache-dit
// then reuses the newest snapshot.
std::optional<DmdFit> dmd_fit_gram(const std::vector<double>& gram, int m,
                                   const DmdOptions& options);
// The same from the snapshots snaps[0..m-1], d values each.
template <class T>
std::optional<DmdFit> dmd_fit(const std::vector<const T*>& snaps, int64_t d,
                              const DmdOptions& options);

// out[e] = sum_j c[j] * snaps[j + 1][e], accumulated in double.
template <class T, class Out>
void dmd_combine(const std::vector<const T*>& snaps, int64_t d, const std::vector<double>& c,
                 Out* out);

// The small dense kernels, exposed for their tests.
namespace dmd_detail {
// Thin SVD of a rows x cols row-major matrix (rows >= cols) by one-sided Jacobi: singular
// values descending, u (rows x cols) and v (cols x cols), row-major.
void jacobi_svd(const std::vector<double>& a, int rows, int cols, std::vector<double>& s,
                std::vector<double>& u, std::vector<double>& v);
// An m x m F with F^T F = gram (a symmetric positive semi-definite m x m matrix), from its
// eigendecomposition; eigenvalues below zero (rounding) count as zero.
std::vector<double> gram_factor(const std::vector<double>& gram, int m);
// Eigenvalues and unit eigenvectors (columns of w, n x n row-major) of a real n x n matrix by
// the complex QR algorithm. False when it does not converge.
bool eigen(const std::vector<double>& a, int n, std::vector<std::complex<double>>& lambda,
           std::vector<std::complex<double>>& w);
}  // namespace dmd_detail

}  // namespace flowkv::cache
