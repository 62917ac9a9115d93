// Fast spatial ops: convolution as banded im2col into the project's blocked GEMM, GroupNorm as
// block partial sums reduced in a fixed order, upsampling as row copies. Task boundaries depend
// only on the shapes, never on the thread count.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/checked.h"
#include "core/parallel.h"
#include "ops/conv.h"
#include "ops/cpu/row_kernels.h"
#include "ops/gemm.h"
#include "ops/ops.h"

namespace flowkv::ops {

namespace {

// f32 weight rows [N, K] as the GEMM's row source (the widening is a copy).
struct F32Rows {
  const float* w;
  int64_t k;
  static void widen(const void* self, int64_t j0, int64_t count, int64_t k0, int64_t kc,
                    float* out) {
    const auto* s = static_cast<const F32Rows*>(self);
    for (int64_t j = 0; j < count; ++j) {
      std::memcpy(out + j * kc, s->w + (j0 + j) * s->k + k0, static_cast<size_t>(kc) * 4);
    }
  }
};

// Output pixels per GEMM task: about 256K floats of im2col rows (1 MiB, cache-resident), a
// multiple of the micro-kernel's 6 rows, between 6 and 384.
int64_t band_pixels(int64_t k) {
  const int64_t bm = std::clamp<int64_t>((int64_t{1} << 18) / std::max<int64_t>(k, 1), 6, 384);
  return bm / 6 * 6;
}

// Threads for a task list of about `work` multiply-adds: one below ~4M (a team's start and
// barrier cost more than such work); the split itself never depends on it.
int threads_for(double work) {
  return work < double(1 << 22) ? 1 : num_threads();
}

}  // namespace

Conv2d::Conv2d(const Tensor& weight, const Tensor& bias, const Conv2dShape& s) : s_(s) {
  const Shape want = {s.out_channels, s.in_channels, s.kernel, s.kernel};
  FLOWKV_CHECK(weight.shape() == want, "conv2d: weight is ", shape_str(weight.shape()),
               ", expected ", shape_str(want));
  FLOWKV_CHECK(s.stride >= 1 && s.kernel >= 1 && s.pad_top >= 0 && s.pad_left >= 0 &&
                   s.pad_bottom >= 0 && s.pad_right >= 0,
               "conv2d: bad geometry");
  const Tensor wf = weight.to_f32();
  const int64_t cin = s.in_channels, taps = s.taps(), kk = taps * cin;
  w_.resize(static_cast<size_t>(checked_mul(s.out_channels, kk, "conv2d weight")));
  const float* src = wf.f32();
  for (int64_t co = 0; co < s.out_channels; ++co) {
    for (int64_t ci = 0; ci < cin; ++ci) {
      for (int64_t t = 0; t < taps; ++t) {
        w_[static_cast<size_t>(co * kk + t * cin + ci)] = src[(co * cin + ci) * taps + t];
      }
    }
  }
  if (bias.defined()) {
    FLOWKV_CHECK(bias.shape() == Shape{s.out_channels}, "conv2d: bias is ", shape_str(bias.shape()),
                 ", expected [", s.out_channels, "]");
    const Tensor bf = bias.to_f32();
    b_.assign(bf.f32(), bf.f32() + s.out_channels);
  }
}

Conv2d Conv2d::from_linear(const Tensor& weight, const Tensor& bias) {
  FLOWKV_CHECK(weight.ndim() == 2, "linear weight must be 2-D, got ", shape_str(weight.shape()));
  const int64_t n = weight.dim(0), k = weight.dim(1);
  return Conv2d(weight.reshape({n, k, 1, 1}), bias, Conv2dShape::pointwise(k, n));
}

int64_t Conv2d::held_bytes() const {
  return static_cast<int64_t>((w_.size() + b_.size()) * sizeof(float));
}

void Conv2d::forward(const ExecContext& ctx, const float* x, int64_t h0, int64_t w0, float* y,
                     bool upsample2x) const {
  FLOWKV_CHECK(!empty(), "conv2d: no weights");
  const int64_t up = upsample2x ? 2 : 1, h = h0 * up, w = w0 * up;  // the (virtual) input
  FLOWKV_CHECK(h > 0 && w > 0 && s_.out_h(h) > 0 && s_.out_w(w) > 0, "conv2d: image ", h, "x", w,
               " is too small for the kernel");
  if (ctx.kernels == KernelPath::kReference) {
    if (!upsample2x) return ref::conv2d(*this, x, h, w, y);
    std::vector<float> u(static_cast<size_t>(h * w * s_.in_channels));
    ref::upsample_nearest2x(x, h0, w0, s_.in_channels, u.data());
    return ref::conv2d(*this, u.data(), h, w, y);
  }
  const int64_t oh = s_.out_h(h), ow = s_.out_w(w), cin = s_.in_channels, n = s_.out_channels;
  const int64_t k = s_.taps() * cin, npix = oh * ow;
  const F32Rows rows{w_.data(), k};
  const RowSource src{&F32Rows::widen, &rows};
  const bool direct =
      s_.kernel == 1 && s_.stride == 1 && s_.pad_top == 0 && s_.pad_left == 0 && up == 1;
  const int64_t bm = band_pixels(k);
  const int64_t tasks = (npix + bm - 1) / bm;
  parallel_for_on(threads_for(double(npix) * double(k) * double(n)), tasks, [&](int64_t t) {
    const int64_t p0 = t * bm, m = std::min(bm, npix - p0);
    const float* a = x + p0 * cin;
    if (!direct) {
      thread_local std::vector<float> scratch;
      if (scratch.size() < static_cast<size_t>(bm * k)) scratch.resize(static_cast<size_t>(bm * k));
      float* col = scratch.data();
      for (int64_t i = 0; i < m; ++i) {
        const int64_t oy = (p0 + i) / ow, ox = (p0 + i) % ow;
        float* row = col + i * k;
        for (int64_t ky = 0; ky < s_.kernel; ++ky) {
          const int64_t iy = oy * s_.stride - s_.pad_top + ky;
          for (int64_t kx = 0; kx < s_.kernel; ++kx) {
            const int64_t ix = ox * s_.stride - s_.pad_left + kx;
            float* dst = row + (ky * s_.kernel + kx) * cin;
            if (iy < 0 || iy >= h || ix < 0 || ix >= w) {
              std::fill(dst, dst + cin, 0.0f);
            } else {
              std::memcpy(dst, x + ((iy / up) * w0 + ix / up) * cin, static_cast<size_t>(cin) * 4);
            }
          }
        }
      }
      a = col;
    }
    float* out = y + p0 * n;
    gemm_rows_source(a, k, m, k, src, 0, n, out, n);
    if (!b_.empty()) {
      for (int64_t i = 0; i < m; ++i) {
        float* o = out + i * n;
        for (int64_t j = 0; j < n; ++j) o[j] += b_[static_cast<size_t>(j)];
      }
    }
  });
}

void group_norm(const ExecContext& ctx, const float* x, float* y, int64_t hw, int64_t c,
                const float* gamma, const float* beta, const GroupNormArgs& a) {
  FLOWKV_CHECK(a.groups > 0 && c % a.groups == 0, "group_norm: ", c,
               " channels are not a whole number of ", a.groups, " groups");
  if (ctx.kernels == KernelPath::kReference) return ref::group_norm(x, y, hw, c, gamma, beta, a);
  const int64_t cg = c / a.groups;
  const int64_t per = std::max<int64_t>(1, 16384 / c);  // pixels per task
  const int64_t nb = (hw + per - 1) / per;
  // Per task, per group: sum and sum of squares (double), added up in task order below.
  std::vector<double> part(static_cast<size_t>(nb * a.groups * 2));
  const int threads = threads_for(double(hw) * double(c) * 8);
  parallel_for_on(threads, nb, [&](int64_t t) {
    double* p = part.data() + t * a.groups * 2;
    const int64_t p1 = std::min(hw, (t + 1) * per);
    for (int64_t px = t * per; px < p1; ++px) {
      const float* r = x + px * c;
      for (int64_t g = 0; g < a.groups; ++g) {
        double s = 0, q = 0;
        for (int64_t i = 0; i < cg; ++i) {
          const double v = r[g * cg + i];
          s += v;
          q += v * v;
        }
        p[2 * g] += s;
        p[2 * g + 1] += q;
      }
    }
  });
  // y = (x - mean) * (rstd * gamma) + beta: the subtraction first, as the reference, so a group
  // of near-constant values does not lose its digits to cancellation.
  std::vector<float> mean_of(static_cast<size_t>(c)), scale(static_cast<size_t>(c));
  const double n = double(hw) * double(cg);
  for (int64_t g = 0; g < a.groups; ++g) {
    double s = 0, q = 0;
    for (int64_t t = 0; t < nb; ++t) {
      s += part[static_cast<size_t>((t * a.groups + g) * 2)];
      q += part[static_cast<size_t>((t * a.groups + g) * 2 + 1)];
    }
    const double mean = s / n;
    const double var = std::max(0.0, q / n - mean * mean);
    const double rstd = 1.0 / std::sqrt(var + a.eps);
    for (int64_t i = 0; i < cg; ++i) {
      const int64_t ch = g * cg + i;
      mean_of[static_cast<size_t>(ch)] = static_cast<float>(mean);
      scale[static_cast<size_t>(ch)] = static_cast<float>(rstd * gamma[ch]);
    }
  }
  const auto& kern = cpu::row_kernels();
  parallel_for_on(threads, nb, [&](int64_t t) {
    const int64_t p0 = t * per, p1 = std::min(hw, p0 + per);
    for (int64_t px = p0; px < p1; ++px) {
      const float* r = x + px * c;
      float* o = y + px * c;
      for (int64_t ch = 0; ch < c; ++ch) {
        o[ch] = (r[ch] - mean_of[size_t(ch)]) * scale[size_t(ch)] + beta[ch];
      }
    }
    if (a.silu) kern.silu(y + p0 * c, y + p0 * c, (p1 - p0) * c);
  });
}

void rms_norm_channels(const ExecContext& ctx, const float* x, float* y, int64_t hw, int64_t c,
                       const float* gamma, bool silu) {
  if (ctx.kernels == KernelPath::kReference)
    return ref::rms_norm_channels(x, y, hw, c, gamma, silu);
  const float scale = static_cast<float>(std::sqrt(double(c)));
  std::vector<float> g(static_cast<size_t>(c));
  for (int64_t ch = 0; ch < c; ++ch) g[size_t(ch)] = scale * gamma[ch];
  const int64_t per = std::max<int64_t>(1, 16384 / c);  // pixels per task
  const int64_t nb = (hw + per - 1) / per;
  const auto& kern = cpu::row_kernels();
  parallel_for_on(threads_for(double(hw) * double(c) * 4), nb, [&](int64_t t) {
    const int64_t p0 = t * per, p1 = std::min(hw, p0 + per);
    for (int64_t px = p0; px < p1; ++px) {
      const float* r = x + px * c;
      float* o = y + px * c;
      double q = 0;
      for (int64_t ch = 0; ch < c; ++ch) q += double(r[ch]) * r[ch];
      // One reciprocal per pixel: x * (1 / norm) differs from x / norm by at most an ulp.
      const float inv = static_cast<float>(1.0 / std::max(std::sqrt(q), 1e-12));
      for (int64_t ch = 0; ch < c; ++ch) o[ch] = r[ch] * inv * g[size_t(ch)];
    }
    if (silu) kern.silu(y + p0 * c, y + p0 * c, (p1 - p0) * c);
  });
}

void upsample_nearest2x(const ExecContext& ctx, const float* x, int64_t h, int64_t w, int64_t c,
                        float* y) {
  if (ctx.kernels == KernelPath::kReference) return ref::upsample_nearest2x(x, h, w, c, y);
  const size_t px = static_cast<size_t>(c) * 4;
  parallel_for_on(threads_for(double(h) * double(w) * double(c)), h, [&](int64_t iy) {
    float* row = y + (2 * iy) * (2 * w) * c;
    for (int64_t ix = 0; ix < w; ++ix) {
      const float* s = x + (iy * w + ix) * c;
      std::memcpy(row + (2 * ix) * c, s, px);
      std::memcpy(row + (2 * ix + 1) * c, s, px);
    }
    std::memcpy(row + 2 * w * c, row, px * static_cast<size_t>(2 * w));
  });
}

void to_channels_last(const float* x, int64_t c, int64_t hw, float* y) {
  for (int64_t ch = 0; ch < c; ++ch) {
    for (int64_t p = 0; p < hw; ++p) y[p * c + ch] = x[ch * hw + p];
  }
}

void to_channels_first(const float* x, int64_t hw, int64_t c, float* y) {
  for (int64_t ch = 0; ch < c; ++ch) {
    for (int64_t p = 0; p < hw; ++p) y[ch * hw + p] = x[p * c + ch];
  }
}

}  // namespace flowkv::ops
