// Scaled dot-product attention with keys and values gathered from several sources.
//
// Queries are one [B*Sq, H*hd] matrix (row b*Sq + i is query i of batch element b). Keys and
// values come as an ordered list of sources, each [B*len, H*hd] in f32 or bf16 (a live segment
// of this forward, or a cached memory). Query i attends to every key of every source, except
// where the source is causal (key j only if j <= i + causal_offset) or marks the key invalid.
// Softmax over all allowed keys, in f32; a query with no allowed key gets a zero output.
//
// The fast kernel walks the sources in order, in key blocks that start at each source's first
// key: a query row's reduction depends only on the source list, never on how the rows are
// batched or how many threads run, so a source spliced from a cache gives exactly the result of
// the same keys computed live.
#pragma once

#include <cstdint>
#include <span>

#include "core/exec_context.h"
#include "core/mat.h"
#include "flowkv/dtype.h"

namespace flowkv::ops {

struct KVSource {
  const void* k = nullptr;
  const void* v = nullptr;
  DType dtype = DType::kF32;  // F32 or BF16
  int64_t len = 0;            // keys per batch element
  int64_t k_stride = 0;       // elements between consecutive key rows
  int64_t v_stride = 0;
  bool causal = false;
  int64_t causal_offset = 0;
  const uint8_t* valid =
      nullptr;              // batch element b's key j at valid[b*valid_batch + j]; 0 = masked
  int64_t valid_batch = 0;  // (0: len)
  int64_t batch_rows = 0;   // rows from one batch element's keys to the next (0: len)

  int64_t batch_stride() const { return batch_rows > 0 ? batch_rows : len; }
  const uint8_t* valid_row(int64_t b) const {
    return valid ? valid + b * (valid_batch > 0 ? valid_batch : len) : nullptr;
  }
  // Keys and values as rows of f32 matrices; batch element b's keys start at row b*batch_rows.
  static KVSource f32(Mat k, Mat v, int64_t len, int64_t batch_rows = 0) {
    KVSource s;
    s.k = k.data;
    s.v = v.data;
    s.len = len;
    s.k_stride = k.stride;
    s.v_stride = v.stride;
    s.batch_rows = batch_rows;
    return s;
  }
};

struct AttnShape {
  int64_t batch = 1;
  int64_t heads = 1;
  int64_t head_dim = 1;
  int64_t seq_q = 0;         // queries per batch element
  float scale = 0;           // 0: 1/sqrt(head_dim)
  int64_t q_batch_rows = 0;  // rows from one batch element's queries (and outputs) to the next
  // Grouped-query attention: the sources hold kv_heads heads (0: heads), each read by
  // heads / kv_heads consecutive query heads (query head h reads key/value head
  // h / (heads / kv_heads), as transformers' repeat_kv). Key rows are kv_heads * head_dim wide.
  int64_t kv_heads = 0;
  int64_t q_rows(int64_t b) const { return b * (q_batch_rows > 0 ? q_batch_rows : seq_q); }
  int64_t kv_head_count() const { return kv_heads > 0 ? kv_heads : heads; }
  int64_t kv_head(int64_t h) const { return h / (heads / kv_head_count()); }
};

void attention(const ExecContext& ctx, const AttnShape& shape, Mat q,
               std::span<const KVSource> sources, Mat out);

// 4 * head_dim FLOPs per allowed (query, key) pair, over heads and batch (key masks ignored).
double attention_flops(const AttnShape& shape, std::span<const KVSource> sources);

namespace ref {
void attention(const AttnShape& shape, Mat q, std::span<const KVSource> sources, Mat out);
}

}  // namespace flowkv::ops
