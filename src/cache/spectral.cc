#include "cache/spectral.h"

#include <algorithm>
#include <cmath>

namespace flowkv::cache {

namespace {

using cd = std::complex<double>;

// e^{sign * 2 pi i m / n} for m in [0, n).
std::vector<cd> twiddles(int64_t n, int sign) {
  std::vector<cd> t(static_cast<size_t>(n));
  for (int64_t m = 0; m < n; ++m) {
    const double a = sign * 2.0 * M_PI * static_cast<double>(m) / static_cast<double>(n);
    t[static_cast<size_t>(m)] = cd(std::cos(a), std::sin(a));
  }
  return t;
}

// In-place DFT (unscaled) of n values spaced `stride` apart.
void dft1(cd* x, int64_t n, int64_t stride, const std::vector<cd>& tw, std::vector<cd>& tmp) {
  tmp.assign(static_cast<size_t>(n), cd(0, 0));
  for (int64_t k = 0; k < n; ++k) {
    cd acc(0, 0);
    for (int64_t j = 0; j < n; ++j) acc += x[j * stride] * tw[static_cast<size_t>((k * j) % n)];
    tmp[static_cast<size_t>(k)] = acc;
  }
  for (int64_t k = 0; k < n; ++k) x[k * stride] = tmp[static_cast<size_t>(k)];
}

void dft2_inplace(Spectrum& s, int sign) {
  std::vector<cd> tmp;
  const std::vector<cd> tw_w = twiddles(s.w, sign), tw_h = twiddles(s.h, sign);
  for (int64_t c = 0; c < s.channels; ++c) {
    cd* plane = &s.v[static_cast<size_t>(c * s.h * s.w)];
    for (int64_t y = 0; y < s.h; ++y) dft1(plane + y * s.w, s.w, 1, tw_w, tmp);
    for (int64_t x = 0; x < s.w; ++x) dft1(plane + x, s.h, s.w, tw_h, tmp);
  }
}

}  // namespace

Spectrum dft2(const float* x, int64_t h, int64_t w, int64_t channels) {
  Spectrum s{h, w, channels, std::vector<cd>(static_cast<size_t>(h * w * channels))};
  for (int64_t p = 0; p < h * w; ++p)
    for (int64_t c = 0; c < channels; ++c)
      s.v[static_cast<size_t>(c * h * w + p)] = x[p * channels + c];
  dft2_inplace(s, -1);
  return s;
}

void add_inverse_dft2(const Spectrum& s, float* out) {
  Spectrum t = s;
  dft2_inplace(t, +1);
  const double scale = 1.0 / static_cast<double>(s.h * s.w);
  for (int64_t p = 0; p < s.h * s.w; ++p)
    for (int64_t c = 0; c < s.channels; ++c)
      out[p * s.channels + c] +=
          static_cast<float>(t.v[static_cast<size_t>(c * s.h * s.w + p)].real() * scale);
}

std::vector<uint8_t> low_frequency_mask(int64_t h, int64_t w) {
  // fftshift puts frequency index f at position (f + n/2) mod n.
  const int64_t r = std::min(h, w) / 5, cy = h / 2, cx = w / 2;
  std::vector<uint8_t> m(static_cast<size_t>(h * w));
  for (int64_t fy = 0; fy < h; ++fy) {
    for (int64_t fx = 0; fx < w; ++fx) {
      const int64_t i = (fy + h / 2) % h, j = (fx + w / 2) % w;
      m[static_cast<size_t>(fy * w + fx)] = (j - cx) * (j - cx) + (i - cy) * (i - cy) <= r * r;
    }
  }
  return m;
}

namespace {

// The gain grid [h][w] (float32 products, frame axis first, as diffusers broadcasts them) and
// its mean, in double.
std::vector<float> sea_gain_grid(int64_t h, int64_t w, double sigma, double power, double* mean) {
  const std::vector<float> gt = sea_axis_gain(1, sigma, power), gh = sea_axis_gain(h, sigma, power),
                           gw = sea_axis_gain(w, sigma, power);
  std::vector<float> g(static_cast<size_t>(h * w));
  double sum = 0;
  for (int64_t i = 0; i < h; ++i) {
    for (int64_t j = 0; j < w; ++j) {
      const float v = gt[0] * gh[static_cast<size_t>(i)] * gw[static_cast<size_t>(j)];
      g[static_cast<size_t>(i * w + j)] = v;
      sum += v;
    }
  }
  *mean = sum / static_cast<double>(h * w);
  return g;
}

// Whether a mean normalises: finite and positive (diffusers leaves the gains as they are else).
bool normalises(double mean) {
  return std::isfinite(mean) && mean > 0;
}

// The circulant matrix [n][n] of one axis' gain: M[i][j] = (1/n) sum_k g_k cos(2 pi k (i-j) / n),
// into m (kernel: scratch).
void circulant(const std::vector<float>& g, std::vector<double>& kernel, std::vector<double>& m) {
  const int64_t n = static_cast<int64_t>(g.size());
  kernel.assign(static_cast<size_t>(n), 0.0);
  for (int64_t d = 0; d < n; ++d) {
    double acc = 0;
    for (int64_t k = 0; k < n; ++k) {
      acc += g[static_cast<size_t>(k)] *
             std::cos(2.0 * M_PI * static_cast<double>((k * d) % n) / static_cast<double>(n));
    }
    kernel[static_cast<size_t>(d)] = acc / static_cast<double>(n);
  }
  m.resize(static_cast<size_t>(n * n));
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < n; ++j)
      m[static_cast<size_t>(i * n + j)] = kernel[static_cast<size_t>(((i - j) % n + n) % n)];
}

}  // namespace

std::vector<float> sea_axis_gain(int64_t n, double sigma, double power) {
  std::vector<float> g;
  sea_axis_gain(n, sigma, power, g);
  return g;
}

void sea_axis_gain(int64_t n, double sigma, double power, std::vector<float>& g) {
  sigma = std::max(1e-6, std::min(1.0 - 1e-6, sigma));
  const float a = static_cast<float>(1.0 - sigma),
              a2 = static_cast<float>((1.0 - sigma) * (1.0 - sigma)),
              b2 = static_cast<float>(sigma * sigma), p = static_cast<float>(power);
  const float step = static_cast<float>(1.0 / static_cast<double>(n));  // fftfreq: k * (1 / n)
  g.resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const int64_t k = i < (n + 1) / 2 ? i : i - n;
    const float f = std::fabs(static_cast<float>(k) * step);
    const float s = 1.0f / (std::pow(f, p) + 1e-16f);
    g[static_cast<size_t>(i)] = a * s / (a2 * s + b2 + 1e-16f);
  }
}

void sea_filter_reference(const float* x, int64_t h, int64_t w, int64_t channels, double sigma,
                          double power, float* out) {
  double mean = 0;
  std::vector<float> g = sea_gain_grid(h, w, sigma, power, &mean);
  if (normalises(mean)) {
    for (float& v : g) v = static_cast<float>(v / mean);
  }
  Spectrum s = dft2(x, h, w, channels);
  for (int64_t c = 0; c < channels; ++c)
    for (int64_t p = 0; p < h * w; ++p)
      s.v[static_cast<size_t>(c * h * w + p)] *= g[static_cast<size_t>(p)];
  std::fill(out, out + h * w * channels, 0.0f);
  add_inverse_dft2(s, out);
}

void sea_filter(const float* x, int64_t h, int64_t w, int64_t channels, double sigma, double power,
                float* out) {
  SeaScratch scratch;
  sea_filter(x, h, w, channels, sigma, power, out, scratch);
}

void sea_filter(const float* x, int64_t h, int64_t w, int64_t channels, double sigma, double power,
                float* out, SeaScratch& sc) {
  sea_axis_gain(1, sigma, power, sc.gt);
  sea_axis_gain(h, sigma, power, sc.gh);
  sea_axis_gain(w, sigma, power, sc.gw);
  // The gain grid's mean (float32 products, frame axis first, summed in double), as
  // sea_gain_grid computes it.
  double sum = 0;
  for (int64_t i = 0; i < h; ++i) {
    for (int64_t j = 0; j < w; ++j) {
      const float v = sc.gt[0] * sc.gh[static_cast<size_t>(i)] * sc.gw[static_cast<size_t>(j)];
      sum += v;
    }
  }
  const double mean = sum / static_cast<double>(h * w);
  const double scale = sc.gt[0] / (normalises(mean) ? mean : 1.0);
  circulant(sc.gh, sc.kernel, sc.mh);
  circulant(sc.gw, sc.kernel, sc.mw);
  const std::vector<double>& mh = sc.mh;
  const std::vector<double>& mw = sc.mw;
  const int64_t C = channels;
  // Along columns: t[r, i, :] = sum_j mw[i][j] x[r, j, :].
  std::vector<double>& t = sc.t;
  t.assign(static_cast<size_t>(h * w * C), 0.0);
  for (int64_t r = 0; r < h; ++r) {
    for (int64_t i = 0; i < w; ++i) {
      double* dst = &t[static_cast<size_t>((r * w + i) * C)];
      for (int64_t j = 0; j < w; ++j) {
        const double m = mw[static_cast<size_t>(i * w + j)];
        const float* src = x + (r * w + j) * C;
        for (int64_t c = 0; c < C; ++c) dst[c] += m * src[c];
      }
    }
  }
  // Along rows: out[i, col, :] = scale * sum_r mh[i][r] t[r, col, :].
  std::vector<double>& acc = sc.acc;
  acc.resize(static_cast<size_t>(w * C));
  for (int64_t i = 0; i < h; ++i) {
    std::fill(acc.begin(), acc.end(), 0.0);
    for (int64_t r = 0; r < h; ++r) {
      const double m = mh[static_cast<size_t>(i * h + r)];
      const double* src = &t[static_cast<size_t>(r * w * C)];
      for (int64_t k = 0; k < w * C; ++k) acc[static_cast<size_t>(k)] += m * src[k];
    }
    for (int64_t k = 0; k < w * C; ++k)
      out[i * w * C + k] = static_cast<float>(scale * acc[static_cast<size_t>(k)]);
  }
}

}  // namespace flowkv::cache
