#include "models/common/embeddings.h"

#include <cmath>
#include <numeric>

namespace flowkv {

void timestep_sinusoid(float t, int64_t channels, float* out, float scale) {
  const int64_t half = channels / 2;
  // exponent = -ln(10000) * arange(half) / half, in float32 as torch evaluates it.
  const float neg_log = static_cast<float>(-std::log(10000.0));
  for (int64_t i = 0; i < half; ++i) {
    const float exponent = (neg_log * static_cast<float>(i)) / static_cast<float>(half);
    float arg = t * std::exp(exponent);
    if (scale != 1.0f) arg = arg * scale;
    out[i] = std::cos(arg);
    out[half + i] = std::sin(arg);
  }
}

void rope_tables(const float* ids, int64_t tokens, int64_t ids_stride,
                 const std::vector<int64_t>& axes_dims, double theta, float* cos, float* sin) {
  const int64_t hd = std::accumulate(axes_dims.begin(), axes_dims.end(), int64_t{0});
  for (int64_t s = 0; s < tokens; ++s) {
    int64_t col = 0;
    for (size_t a = 0; a < axes_dims.size(); ++a) {
      const int64_t d = axes_dims[a];
      const double pos = static_cast<double>(ids[s * ids_stride + static_cast<int64_t>(a)]);
      for (int64_t k = 0; k < d / 2; ++k) {
        const double freq =
            1.0 / std::pow(theta, static_cast<double>(2 * k) / static_cast<double>(d));
        const double angle = pos * freq;
        const float c = static_cast<float>(std::cos(angle)),
                    sn = static_cast<float>(std::sin(angle));
        cos[s * hd + col + 2 * k] = cos[s * hd + col + 2 * k + 1] = c;
        sin[s * hd + col + 2 * k] = sin[s * hd + col + 2 * k + 1] = sn;
      }
      col += d;
    }
  }
}

}  // namespace flowkv
