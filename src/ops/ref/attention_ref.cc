// Reference attention: for each query, list its allowed keys in source order, softmax in double.
#include <cmath>
#include <limits>
#include <vector>

#include "ops/attention.h"

namespace flowkv::ops::ref {

namespace {
float load(const void* base, DType t, int64_t idx) {
  return t == DType::kBF16 ? bf16_to_f32(static_cast<const uint16_t*>(base)[idx])
                           : static_cast<const float*>(base)[idx];
}
}  // namespace

void attention(const AttnShape& s, Mat q, std::span<const KVSource> sources, Mat out) {
  const int64_t hd = s.head_dim;
  const double scale = s.scale > 0 ? s.scale : 1.0 / std::sqrt(static_cast<double>(hd));
  std::vector<double> scores;
  std::vector<std::pair<const KVSource*, int64_t>> keys;  // (source, row index)
  for (int64_t b = 0; b < s.batch; ++b) {
    for (int64_t i = 0; i < s.seq_q; ++i) {
      keys.clear();
      for (const KVSource& src : sources) {
        for (int64_t j = 0; j < src.len; ++j) {
          if (src.causal && j > i + src.causal_offset) continue;
          if (src.valid && !src.valid_row(b)[j]) continue;
          keys.push_back({&src, b * src.batch_stride() + j});
        }
      }
      for (int64_t h = 0; h < s.heads; ++h) {
        const float* qi = q.row(s.q_rows(b) + i) + h * hd;
        float* oi = out.row(s.q_rows(b) + i) + h * hd;
        if (keys.empty()) {
          for (int64_t d = 0; d < hd; ++d) oi[d] = 0;
          continue;
        }
        scores.assign(keys.size(), 0);
        double mx = -std::numeric_limits<double>::infinity();
        for (size_t n = 0; n < keys.size(); ++n) {
          const KVSource& src = *keys[n].first;
          const int64_t base = keys[n].second * src.k_stride + s.kv_head(h) * hd;
          double acc = 0;
          for (int64_t d = 0; d < hd; ++d) acc += double(qi[d]) * load(src.k, src.dtype, base + d);
          scores[n] = acc * scale;
          mx = std::max(mx, scores[n]);
        }
        double sum = 0;
        for (double& v : scores) sum += (v = std::exp(v - mx));
        for (int64_t d = 0; d < hd; ++d) {
          double acc = 0;
          for (size_t n = 0; n < keys.size(); ++n) {
            const KVSource& src = *keys[n].first;
            acc += scores[n] *
                   load(src.v, src.dtype, keys[n].second * src.v_stride + s.kv_head(h) * hd + d);
          }
          oi[d] = static_cast<float>(acc / sum);
        }
      }
    }
  }
}

}  // namespace flowkv::ops::ref
