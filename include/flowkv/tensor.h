// Tensor: a dense, contiguous, row-major array with a dtype and a shape (PyTorch order).
// Storage is shared (copies are cheap views of the same memory); the holder keeps it alive,
// whether it is an owned allocation or a region of a memory-mapped checkpoint.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "flowkv/dtype.h"

namespace flowkv {

using Shape = std::vector<int64_t>;

std::string shape_str(const Shape& s);
int64_t shape_numel(const Shape& s);

class Tensor {
 public:
  Tensor() = default;

  static Tensor empty(Shape shape, DType dtype = DType::kF32);
  static Tensor zeros(Shape shape, DType dtype = DType::kF32);
  // A tensor over memory someone else owns; `holder` keeps that memory alive.
  static Tensor wrap(void* data, Shape shape, DType dtype, std::shared_ptr<void> holder);
  static Tensor from_vector(const std::vector<float>& v, Shape shape);

  bool defined() const { return holder_ != nullptr || data_ != nullptr; }
  DType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  int64_t dim(int i) const { return shape_.at(i < 0 ? i + ndim() : i); }
  int ndim() const { return static_cast<int>(shape_.size()); }
  int64_t numel() const { return shape_numel(shape_); }
  int64_t nbytes() const { return dtype_bytes(dtype_, numel()); }

  void* raw() { return data_; }
  const void* raw() const { return data_; }
  float* f32();
  const float* f32() const;
  uint16_t* u16();
  const uint16_t* u16() const;

  // Same storage, new shape of equal element count.
  Tensor reshape(Shape shape) const;
  // An independent f32 copy, converting from any dtype.
  Tensor to_f32() const;
  // An independent copy in type t: rounded to nearest even (BF16, F16), or quantized row by row
  // as ggml's reference quantizers do (the last dimension must be whole blocks of t).
  Tensor to(DType t) const;
  Tensor clone() const;

 private:
  DType dtype_ = DType::kF32;
  Shape shape_;
  void* data_ = nullptr;
  std::shared_ptr<void> holder_;
};

// Index of the first NaN or infinite element of an F32, BF16 or F16 tensor, or -1 if every
// element is finite.
int64_t first_non_finite(const Tensor& t);

}  // namespace flowkv
