// Small pieces every transformer forward here shares: workspace matrices, segment input rows,
// the K/V of a fused q|k|v projection as an attention source, storing them in a KV memory.
#pragma once

#include <cstring>
#include <vector>

#include "cache/kv_memory.h"
#include "core/arena.h"
#include "core/exec_context.h"
#include "core/mat.h"
#include "ops/attention.h"
#include "ops/ops.h"
#include "segments/segment_input.h"

namespace flowkv {

inline Mat alloc_mat(Arena& a, int64_t rows, int64_t cols) {
  return make_mat(a.floats(rows * cols), rows, cols);
}

// Segments' input rows ([B, tokens_i, channels] each) concatenated per batch element into one
// [B * sum tokens_i, channels] matrix: batch element b's rows are those of every segment in
// order. One segment whose batch elements are contiguous is used in place.
inline Mat gather_rows(Arena& a, int64_t batch, const std::vector<const SegmentInput*>& segs,
                       int64_t channels) {
  int64_t tokens = 0;
  for (const SegmentInput* s : segs) tokens += s->tokens;
  if (segs.size() == 1 && (segs[0]->batch_rows == 0 || segs[0]->batch_rows == tokens)) {
    return {const_cast<float*>(segs[0]->rows), batch * tokens, channels, channels};
  }
  Mat m = alloc_mat(a, batch * tokens, channels);
  for (int64_t b = 0, row = 0; b < batch; ++b) {
    for (const SegmentInput* s : segs) {
      const int64_t step = s->batch_rows > 0 ? s->batch_rows : s->tokens;
      std::memcpy(m.row(row), s->rows + b * step * channels,
                  static_cast<size_t>(s->tokens * channels) * sizeof(float));
      row += s->tokens;
    }
  }
  return m;
}

// Keys and values computed this forward: columns [d, 2d) and [2d, 3d) of a q|k|v projection.
inline ops::KVSource live_kv(Mat qkv, int64_t d, int64_t len, int64_t batch_rows = 0) {
  return ops::KVSource::f32(qkv.cols_slice(d, d), qkv.cols_slice(2 * d, d), len, batch_rows);
}

inline void store_kv(KVMemory* mem, int64_t layer, Mat qkv, int64_t d, int64_t batch_rows = 0) {
  if (mem) mem->store(layer, qkv.cols_slice(d, d), qkv.cols_slice(2 * d, d), batch_rows);
}

// Models with bf16 weights hold k and v at bf16 precision (diffusers rounds q/k/v to bf16 after
// RoPE): rounding them here makes a bf16 KV memory hold exactly what attention reads live.
inline void round_kv(const ExecContext& ec, Mat qkv, int64_t d, bool bf16) {
  if (bf16) ops::round_bf16(ec, qkv.cols_slice(d, 2 * d));
}

}  // namespace flowkv
