// Scalar references: the plainest correct form of each op, in the order PyTorch evaluates it.
#include <cmath>

#include "flowkv/dtype.h"
#include "ops/ops.h"

namespace flowkv::ops::ref {

void layer_norm_modulate(Mat x, Mat y, ModRows scale, ModRows shift, float eps) {
  const int64_t n = x.cols;
  for (int64_t r = 0; r < x.rows; ++r) {
    const float* xr = x.row(r);
    float* yr = y.row(r);
    double sum = 0;
    for (int64_t i = 0; i < n; ++i) sum += xr[i];
    const float mean = static_cast<float>(sum / n);
    double var = 0;
    for (int64_t i = 0; i < n; ++i) var += double(xr[i] - mean) * double(xr[i] - mean);
    const float rstd = 1.0f / std::sqrt(static_cast<float>(var / n) + eps);
    const float* sc = scale.at(r);
    const float* sh = shift.at(r);
    for (int64_t i = 0; i < n; ++i) {
      float v = (xr[i] - mean) * rstd;
      if (sc) v = v * (1.0f + sc[i]);
      if (sh) v = v + sh[i];
      yr[i] = v;
    }
  }
}

void gated_add(Mat x, Mat y, ModRows gate) {
  for (int64_t r = 0; r < x.rows; ++r) {
    float* xr = x.row(r);
    const float* yr = y.row(r);
    const float* g = gate.at(r);
    for (int64_t i = 0; i < x.cols; ++i) xr[i] += g ? g[i] * yr[i] : yr[i];
  }
}

void rms_norm_rope(Mat x, int64_t hd, const float* weight, float eps, RopeRows rope) {
  for (int64_t r = 0; r < x.rows; ++r) {
    float* xr = x.row(r);
    const float* c = rope.cos ? rope.cos + (r % rope.seq) * hd : nullptr;
    const float* s = rope.sin ? rope.sin + (r % rope.seq) * hd : nullptr;
    for (int64_t h = 0; h < x.cols / hd; ++h) {
      float* v = xr + h * hd;
      double ms = 0;
      for (int64_t i = 0; i < hd; ++i) ms += double(v[i]) * v[i];
      const float inv = 1.0f / std::sqrt(static_cast<float>(ms / hd) + eps);
      for (int64_t i = 0; i < hd; ++i) v[i] = v[i] * inv * (weight ? weight[i] : 1.0f);
      if (!c) continue;
      if (rope.half) {
        const int64_t n = hd / 2;
        for (int64_t i = 0; i < n; ++i) {
          const float a = v[i], b = v[i + n];
          v[i] = a * c[i] - b * s[i];
          v[i + n] = b * c[i + n] + a * s[i + n];
        }
        continue;
      }
      for (int64_t i = 0; i < hd; i += 2) {
        const float a = v[i], b = v[i + 1];
        v[i] = a * c[i] - b * s[i];
        v[i + 1] = b * c[i + 1] + a * s[i + 1];
      }
    }
  }
}

void swiglu(Mat in, Mat out) {
  const int64_t f = out.cols;
  for (int64_t r = 0; r < in.rows; ++r) {
    const float* g = in.row(r);
    const float* u = g + f;
    float* o = out.row(r);
    for (int64_t i = 0; i < f; ++i) o[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
  }
}

void silu(const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] / (1.0f + std::exp(-x[i]));
}

void gelu_tanh(Mat x) {
  const double k = std::sqrt(2.0 / M_PI);
  for (int64_t r = 0; r < x.rows; ++r) {
    float* v = x.row(r);
    for (int64_t i = 0; i < x.cols; ++i) {
      const double a = v[i];
      v[i] = static_cast<float>(0.5 * a * (1.0 + std::tanh(k * (a + 0.044715 * a * a * a))));
    }
  }
}

void gelu_erf(Mat x) {
  for (int64_t r = 0; r < x.rows; ++r) {
    float* v = x.row(r);
    for (int64_t i = 0; i < x.cols; ++i) {
      const double a = v[i];
      v[i] = static_cast<float>(0.5 * a * (1.0 + std::erf(a * M_SQRT1_2)));
    }
  }
}

void to_bf16(Mat x, uint16_t* out) {
  for (int64_t r = 0; r < x.rows; ++r) {
    for (int64_t i = 0; i < x.cols; ++i) out[r * x.cols + i] = f32_to_bf16(x.row(r)[i]);
  }
}

void round_bf16(Mat x) {
  for (int64_t r = 0; r < x.rows; ++r) {
    for (int64_t i = 0; i < x.cols; ++i) x.row(r)[i] = flowkv::round_bf16(x.row(r)[i]);
  }
}

}  // namespace flowkv::ops::ref
