// KVMemory: the post-RoPE keys and values of one cached segment (e.g. the reference images)
// for every layer, owned by one request and one CFG branch. Stored once (prefill), read by
// attention as a KVSource on every later step (decode).
#pragma once

#include <vector>

#include "core/mat.h"
#include "flowkv/tensor.h"
#include "ops/attention.h"

namespace flowkv {

class KVMemory {
 public:
  KVMemory(int64_t layers, int64_t batch, int64_t tokens, int64_t width, DType dtype);
  // A memory every layer of which is already stored: `data` as data() gives it (e.g. from the
  // reference store); its shape and dtype must match.
  KVMemory(Tensor data, int64_t layers, int64_t batch, int64_t tokens, int64_t width);

  int64_t layers() const { return layers_; }
  int64_t batch() const { return batch_; }
  int64_t tokens() const { return tokens_; }
  int64_t width() const { return width_; }
  DType dtype() const { return dtype_; }
  // The payload: 2 (K and V) x layers x batch x tokens x width x bytes per element.
  int64_t bytes() const;
  static int64_t payload_bytes(int64_t layers, int64_t batch, int64_t tokens, int64_t width,
                               DType dtype);

  // Copies one layer's keys and values ([batch*tokens, width] rows; batch element b's first
  // row at b*batch_rows, 0 meaning tokens). BF16 memories round to nearest even.
  void store(int64_t layer, Mat k, Mat v, int64_t batch_rows = 0);
  bool filled(int64_t layer) const { return filled_.at(static_cast<size_t>(layer)); }
  bool complete() const;
  // The payload [layers, 2, batch*tokens, width]: shared storage, to be read only once complete.
  const Tensor& data() const { return data_; }
  // A view for attention. Throws if the layer was never stored.
  ops::KVSource source(int64_t layer) const;
  // One layer's K or V as an f32 tensor [batch, tokens, width] (tests and tracing).
  Tensor keys(int64_t layer) const;
  Tensor values(int64_t layer) const;

 private:
  const std::byte* k_ptr(int64_t layer) const;
  const std::byte* v_ptr(int64_t layer) const;
  Tensor read(const std::byte* p) const;

  int64_t layers_, batch_, tokens_, width_;
  DType dtype_;
  int64_t layer_elems_;  // batch*tokens*width
  Tensor data_;          // [layers, 2, batch*tokens, width]
  std::vector<bool> filled_;
};

}  // namespace flowkv
