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

}  // namespace flowkv::cache
