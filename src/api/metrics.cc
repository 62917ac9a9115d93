// PSNR and SSIM as scikit-image 0.25.2 computes them (flowkv/metrics.h), in double precision
// throughout, as skimage converts 8-bit input to float64.
#include "flowkv/metrics.h"

#include <array>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "flowkv/error.h"

namespace flowkv {

namespace {

void check_pair(const Image& a, const Image& b, const char* metric) {
  for (const Image* im : {&a, &b}) {
    FLOWKV_CHECK(im->channels == 3 || im->channels == 4, metric,
                 ": a picture has 3 (RGB) or 4 (RGBA) channels, not ", im->channels);
    FLOWKV_CHECK(im->width > 0 && im->height > 0, metric, ": an empty picture (", im->width, "x",
                 im->height, ")");
    FLOWKV_CHECK(static_cast<int64_t>(im->pixels.size()) / im->channels / im->width == im->height &&
                     static_cast<int64_t>(im->pixels.size()) % (im->channels * im->width) == 0,
                 metric, ": a ", im->width, "x", im->height, "x", im->channels, " picture holds ",
                 im->pixels.size(), " values");
  }
  FLOWKV_CHECK(a.width == b.width && a.height == b.height && a.channels == b.channels, metric,
               ": the pictures differ in size: ", a.width, "x", a.height, "x", a.channels, " and ",
               b.width, "x", b.height, "x", b.channels);
}

// scipy.ndimage's Gaussian kernel: exp(-x^2 / (2 sigma^2)) over x in [-r, r], r = int(3.5
// sigma + 0.5) = 5 for sigma 1.5, normalised to sum 1.
constexpr int kRadius = 5;
using Kernel = std::array<double, 2 * kRadius + 1>;

Kernel gaussian_kernel() {
  constexpr double kSigma = 1.5;
  Kernel k{};
  double sum = 0;
  for (int x = -kRadius; x <= kRadius; ++x) {
    k[x + kRadius] = std::exp(-0.5 / (kSigma * kSigma) * x * x);
    sum += k[x + kRadius];
  }
  for (double& v : k) v /= sum;
  return k;
}

// scipy's mode "reflect" (d c b a | a b c d | d c b a); n > kRadius, so one fold suffices.
int64_t reflect(int64_t i, int64_t n) {
  return i < 0 ? -i - 1 : i >= n ? 2 * n - i - 1 : i;
}

// ndimage.gaussian_filter on an [h, w] plane: along the rows' axis (0), then the columns' (1).
std::vector<double> gaussian_filter(const std::vector<double>& in, int64_t h, int64_t w,
                                    const Kernel& k) {
  std::vector<double> tmp(in.size()), out(in.size());
  for (int64_t y = 0; y < h; ++y)
    for (int64_t x = 0; x < w; ++x) {
      double s = 0;
      for (int j = -kRadius; j <= kRadius; ++j) s += k[j + kRadius] * in[reflect(y + j, h) * w + x];
      tmp[y * w + x] = s;
    }
  for (int64_t y = 0; y < h; ++y)
    for (int64_t x = 0; x < w; ++x) {
      double s = 0;
      for (int j = -kRadius; j <= kRadius; ++j)
        s += k[j + kRadius] * tmp[y * w + reflect(x + j, w)];
      out[y * w + x] = s;
    }
  return out;
}

}  // namespace

double psnr(const Image& a, const Image& b) {
  check_pair(a, b, "psnr");
  // The squared differences are integers: their sum is exact in 64 bits (< 2^16 per value,
  // at most limits::kMaxImagePixels * 4 values).
  int64_t sum = 0;
  for (size_t i = 0; i < a.pixels.size(); ++i) {
    const int64_t d = int64_t{a.pixels[i]} - int64_t{b.pixels[i]};
    sum += d * d;
  }
  if (sum == 0) return std::numeric_limits<double>::infinity();
  const double mse = static_cast<double>(sum) / static_cast<double>(a.pixels.size());
  return 10.0 * std::log10(255.0 * 255.0 / mse);
}

double ssim(const Image& a, const Image& b) {
  check_pair(a, b, "ssim");
  const int64_t w = a.width, h = a.height, c = a.channels;
  FLOWKV_CHECK(w > 2 * kRadius && h > 2 * kRadius, "ssim: the pictures (", w, "x", h,
               ") are smaller than the 11x11 Gaussian window");
  const Kernel k = gaussian_kernel();
  constexpr double kC1 = (0.01 * 255) * (0.01 * 255), kC2 = (0.03 * 255) * (0.03 * 255);
  const int64_t n = w * h;
  std::vector<double> x(n), y(n), xx(n), yy(n), xy(n);
  double total = 0;
  for (int64_t ch = 0; ch < c; ++ch) {
    for (int64_t i = 0; i < n; ++i) {
      x[i] = a.pixels[i * c + ch], y[i] = b.pixels[i * c + ch];
      xx[i] = x[i] * x[i], yy[i] = y[i] * y[i], xy[i] = x[i] * y[i];
    }
    const std::vector<double> ux = gaussian_filter(x, h, w, k), uy = gaussian_filter(y, h, w, k),
                              uxx = gaussian_filter(xx, h, w, k),
                              uyy = gaussian_filter(yy, h, w, k),
                              uxy = gaussian_filter(xy, h, w, k);
    double sum = 0;
    for (int64_t py = kRadius; py < h - kRadius; ++py)
      for (int64_t px = kRadius; px < w - kRadius; ++px) {
        const int64_t i = py * w + px;
        const double vx = uxx[i] - ux[i] * ux[i], vy = uyy[i] - uy[i] * uy[i],
                     vxy = uxy[i] - ux[i] * uy[i];
        const double a1 = 2 * ux[i] * uy[i] + kC1, a2 = 2 * vxy + kC2,
                     b1 = ux[i] * ux[i] + uy[i] * uy[i] + kC1, b2 = vx + vy + kC2;
        sum += (a1 * a2) / (b1 * b2);
      }
    total += sum / static_cast<double>((w - 2 * kRadius) * (h - 2 * kRadius));
  }
  return total / static_cast<double>(c);
}

}  // namespace flowkv
