#include "cache/kv_memory.h"

#include <cstring>

#include "flowkv/error.h"

namespace flowkv {

KVMemory::KVMemory(int64_t layers, int64_t batch, int64_t tokens, int64_t width, DType dtype)
    : layers_(layers), batch_(batch), tokens_(tokens), width_(width), dtype_(dtype) {
  FLOWKV_CHECK(dtype == DType::kF32 || dtype == DType::kBF16, "KV memory holds F32 or BF16");
  FLOWKV_CHECK(layers >= 0 && batch > 0 && tokens >= 0 && width > 0, "bad KV memory shape");
  layer_elems_ = batch * tokens * width;
  data_ = Tensor::empty({layers, 2, batch * tokens, width}, dtype);
  filled_.assign(static_cast<size_t>(layers), false);
}

KVMemory::KVMemory(Tensor data, int64_t layers, int64_t batch, int64_t tokens, int64_t width)
    : layers_(layers), batch_(batch), tokens_(tokens), width_(width), dtype_(data.dtype()) {
  FLOWKV_CHECK(dtype_ == DType::kF32 || dtype_ == DType::kBF16, "KV memory holds F32 or BF16");
  FLOWKV_CHECK(layers >= 0 && batch > 0 && tokens >= 0 && width > 0, "bad KV memory shape");
  FLOWKV_CHECK(data.shape() == Shape({layers, 2, batch * tokens, width}), "KV memory: stored data ",
               shape_str(data.shape()), " does not fit [", layers, ", 2, ", batch * tokens, ", ",
               width, "]");
  layer_elems_ = batch * tokens * width;
  data_ = std::move(data);
  filled_.assign(static_cast<size_t>(layers), true);
}

int64_t KVMemory::payload_bytes(int64_t layers, int64_t batch, int64_t tokens, int64_t width,
                                DType dtype) {
  return 2 * layers * batch * tokens * width * dtype_size(dtype);
}

int64_t KVMemory::bytes() const {
  return payload_bytes(layers_, batch_, tokens_, width_, dtype_);
}

bool KVMemory::complete() const {
  for (bool f : filled_) {
    if (!f) return false;
  }
  return true;
}

const std::byte* KVMemory::k_ptr(int64_t layer) const {
  return static_cast<const std::byte*>(data_.raw()) + 2 * layer * layer_elems_ * dtype_size(dtype_);
}
const std::byte* KVMemory::v_ptr(int64_t layer) const {
  return k_ptr(layer) + layer_elems_ * dtype_size(dtype_);
}

void KVMemory::store(int64_t layer, Mat k, Mat v, int64_t batch_rows) {
  FLOWKV_CHECK(layer >= 0 && layer < layers_, "KV memory: layer ", layer, " out of range");
  FLOWKV_CHECK(k.cols == width_ && v.cols == width_, "KV memory: width ", k.cols, " != ", width_);
  const int64_t step = batch_rows > 0 ? batch_rows : tokens_;
  auto copy = [&](Mat src, std::byte* dst) {
    for (int64_t b = 0; b < batch_; ++b) {
      for (int64_t t = 0; t < tokens_; ++t) {
        const float* row = src.row(b * step + t);
        const int64_t o = (b * tokens_ + t) * width_;
        if (dtype_ == DType::kF32) {
          std::memcpy(reinterpret_cast<float*>(dst) + o, row, static_cast<size_t>(width_) * 4);
        } else {
          uint16_t* out = reinterpret_cast<uint16_t*>(dst) + o;
          for (int64_t c = 0; c < width_; ++c) out[c] = f32_to_bf16(row[c]);
        }
      }
    }
  };
  copy(k, const_cast<std::byte*>(k_ptr(layer)));
  copy(v, const_cast<std::byte*>(v_ptr(layer)));
  filled_[static_cast<size_t>(layer)] = true;
}

ops::KVSource KVMemory::source(int64_t layer) const {
  FLOWKV_CHECK(layer >= 0 && layer < layers_ && filled(layer), "KV memory: layer ", layer,
               " has not been stored yet (run the prefill step first)");
  ops::KVSource s;
  s.k = k_ptr(layer);
  s.v = v_ptr(layer);
  s.dtype = dtype_;
  s.len = tokens_;
  s.k_stride = s.v_stride = width_;
  return s;
}

Tensor KVMemory::read(const std::byte* p) const {
  Tensor t = Tensor::empty({batch_, tokens_, width_});
  float* o = t.f32();
  for (int64_t i = 0; i < layer_elems_; ++i) {
    o[i] = dtype_ == DType::kF32 ? reinterpret_cast<const float*>(p)[i]
                                 : bf16_to_f32(reinterpret_cast<const uint16_t*>(p)[i]);
  }
  return t;
}

Tensor KVMemory::keys(int64_t layer) const {
  return read(k_ptr(layer));
}
Tensor KVMemory::values(int64_t layer) const {
  return read(v_ptr(layer));
}

}  // namespace flowkv
