// Scalar references of the spatial ops: direct loops, in double where PyTorch reduces.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "ops/conv.h"

namespace flowkv::ops::ref {

void conv2d(const Conv2d& conv, const float* x, int64_t h, int64_t w, float* y) {
  const Conv2dShape& s = conv.shape();
  const int64_t oh = s.out_h(h), ow = s.out_w(w), cin = s.in_channels, k = s.kernel;
  const float* wt = conv.weight_rows().data();
  const int64_t kk = s.taps() * cin;
  for (int64_t oy = 0; oy < oh; ++oy) {
    for (int64_t ox = 0; ox < ow; ++ox) {
      float* out = y + (oy * ow + ox) * s.out_channels;
      for (int64_t co = 0; co < s.out_channels; ++co) {
        double acc = conv.bias().empty() ? 0.0 : conv.bias()[static_cast<size_t>(co)];
        for (int64_t ky = 0; ky < k; ++ky) {
          const int64_t iy = oy * s.stride - s.pad_top + ky;
          if (iy < 0 || iy >= h) continue;
          for (int64_t kx = 0; kx < k; ++kx) {
            const int64_t ix = ox * s.stride - s.pad_left + kx;
            if (ix < 0 || ix >= w) continue;
            const float* in = x + (iy * w + ix) * cin;
            const float* wr = wt + co * kk + (ky * k + kx) * cin;
            for (int64_t ci = 0; ci < cin; ++ci) acc += double(in[ci]) * double(wr[ci]);
          }
        }
        out[co] = static_cast<float>(acc);
      }
    }
  }
}

void group_norm(const float* x, float* y, int64_t hw, int64_t c, const float* gamma,
                const float* beta, const GroupNormArgs& a) {
  const int64_t cg = c / a.groups;
  for (int64_t g = 0; g < a.groups; ++g) {
    double sum = 0;
    for (int64_t p = 0; p < hw; ++p) {
      for (int64_t i = 0; i < cg; ++i) sum += x[p * c + g * cg + i];
    }
    const double n = double(hw) * double(cg);
    const double mean = sum / n;
    double var = 0;
    for (int64_t p = 0; p < hw; ++p) {
      for (int64_t i = 0; i < cg; ++i) {
        const double d = x[p * c + g * cg + i] - mean;
        var += d * d;
      }
    }
    const double rstd = 1.0 / std::sqrt(var / n + a.eps);
    for (int64_t p = 0; p < hw; ++p) {
      for (int64_t i = 0; i < cg; ++i) {
        const int64_t ch = g * cg + i;
        float v = static_cast<float>((x[p * c + ch] - mean) * rstd) * gamma[ch] + beta[ch];
        if (a.silu) v = v / (1.0f + std::exp(-v));
        y[p * c + ch] = v;
      }
    }
  }
}

void rms_norm_channels(const float* x, float* y, int64_t hw, int64_t c, const float* gamma,
                       bool silu) {
  const float scale = static_cast<float>(std::sqrt(double(c)));
  for (int64_t p = 0; p < hw; ++p) {
    double q = 0;
    for (int64_t ch = 0; ch < c; ++ch) q += double(x[p * c + ch]) * x[p * c + ch];
    const float norm = static_cast<float>(std::max(std::sqrt(q), 1e-12));
    for (int64_t ch = 0; ch < c; ++ch) {
      float v = x[p * c + ch] / norm * scale * gamma[ch];
      if (silu) v = v / (1.0f + std::exp(-v));
      y[p * c + ch] = v;
    }
  }
}

void upsample_nearest2x(const float* x, int64_t h, int64_t w, int64_t c, float* y) {
  for (int64_t oy = 0; oy < 2 * h; ++oy) {
    for (int64_t ox = 0; ox < 2 * w; ++ox) {
      for (int64_t ch = 0; ch < c; ++ch)
        y[(oy * 2 * w + ox) * c + ch] = x[((oy / 2) * w + ox / 2) * c + ch];
    }
  }
}

}  // namespace flowkv::ops::ref
