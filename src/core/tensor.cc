#include "flowkv/tensor.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <sstream>

#include "core/checked.h"
#include "core/memory.h"
#include "flowkv/error.h"
#include "quant/quant.h"

namespace flowkv {

std::string shape_str(const Shape& s) {
  std::ostringstream out;
  out << '[';
  for (size_t i = 0; i < s.size(); ++i) out << (i ? ", " : "") << s[i];
  out << ']';
  return out.str();
}

int64_t shape_numel(const Shape& s) {
  return checked_numel(s, "shape " + shape_str(s));
}

uint16_t f32_to_f16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t abs = x & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow -> inf
  if (abs < 0x38800000u) {  // subnormal or zero in half
    if (abs < 0x33000000u) return static_cast<uint16_t>(sign);
    const uint32_t e = abs >> 23;
    const uint32_t m = (abs & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126 - e;  // 113 + 13 .. ; bring to half subnormal position
    uint32_t half = m >> (shift);
    const uint32_t rem = m & ((1u << shift) - 1);
    const uint32_t halfway = 1u << (shift - 1);
    if (rem > halfway || (rem == halfway && (half & 1u))) ++half;
    return static_cast<uint16_t>(sign | half);
  }
  uint32_t half = ((abs - 0x38000000u) >> 13);
  const uint32_t rem = abs & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (half & 1u))) ++half;
  return static_cast<uint16_t>(sign | half);
}

namespace {
// Large blocks (weights, KV memories) are mapped directly, so freeing one returns its pages to
// the system at once: peak-memory figures then show what is alive, not what malloc kept.
constexpr size_t kMapFrom = size_t{1} << 20;

std::shared_ptr<void> aligned_block(int64_t bytes) {
  const size_t n = static_cast<size_t>((bytes + 63) / 64 * 64);
  if (n >= kMapFrom) {
    void* p = mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) fail("out of memory allocating ", bytes, " bytes");
    return std::shared_ptr<void>(p, [n](void* q) { munmap(q, n); });
  }
  void* p = std::aligned_alloc(64, n == 0 ? 64 : n);
  if (!p) fail("out of memory allocating ", bytes, " bytes");
  return std::shared_ptr<void>(p, [](void* q) { std::free(q); });
}
}  // namespace

Tensor Tensor::empty(Shape shape, DType dtype) {
  const int64_t numel = checked_numel(shape, "shape " + shape_str(shape));
  FLOWKV_CHECK(
      !dtype_is_quantized(dtype) || (!shape.empty() && shape.back() % dtype_block(dtype) == 0),
      "a ", dtype_name(dtype), " tensor's rows must be whole blocks of ", dtype_block(dtype),
      " elements; shape ", shape_str(shape));
  const int64_t bytes = checked_mul(numel / dtype_block(dtype), dtype_block_bytes(dtype),
                                    "bytes of shape " + shape_str(shape));
  // The one place every tensor is allocated: none larger than the memory budget (small ones
  // skip the check, which reads /proc/meminfo).
  if (bytes >= (int64_t{64} << 20)) check_memory(bytes, "a tensor of shape " + shape_str(shape));
  Tensor t;
  t.dtype_ = dtype;
  t.shape_ = std::move(shape);
  t.holder_ = aligned_block(t.nbytes());
  t.data_ = t.holder_.get();
  return t;
}

Tensor Tensor::zeros(Shape shape, DType dtype) {
  Tensor t = empty(std::move(shape), dtype);
  std::memset(t.data_, 0, static_cast<size_t>(t.nbytes()));
  return t;
}

Tensor Tensor::wrap(void* data, Shape shape, DType dtype, std::shared_ptr<void> holder) {
  FLOWKV_CHECK(
      !dtype_is_quantized(dtype) || (!shape.empty() && shape.back() % dtype_block(dtype) == 0),
      "a ", dtype_name(dtype), " tensor's rows must be whole blocks of ", dtype_block(dtype),
      " elements; shape ", shape_str(shape));
  Tensor t;
  t.dtype_ = dtype;
  t.shape_ = std::move(shape);
  t.data_ = data;
  t.holder_ = std::move(holder);
  return t;
}

Tensor Tensor::from_vector(const std::vector<float>& v, Shape shape) {
  FLOWKV_CHECK(shape_numel(shape) == static_cast<int64_t>(v.size()), "from_vector: ", v.size(),
               " values do not fill shape ", shape_str(shape));
  Tensor t = empty(std::move(shape));
  std::memcpy(t.data_, v.data(), v.size() * 4);
  return t;
}

float* Tensor::f32() {
  FLOWKV_CHECK(dtype_ == DType::kF32, "tensor is ", dtype_name(dtype_), ", expected F32");
  return static_cast<float*>(data_);
}
const float* Tensor::f32() const {
  FLOWKV_CHECK(dtype_ == DType::kF32, "tensor is ", dtype_name(dtype_), ", expected F32");
  return static_cast<const float*>(data_);
}
uint16_t* Tensor::u16() {
  FLOWKV_CHECK(dtype_size(dtype_) == 2, "tensor is ", dtype_name(dtype_), ", expected 16-bit");
  return static_cast<uint16_t*>(data_);
}
const uint16_t* Tensor::u16() const {
  FLOWKV_CHECK(dtype_size(dtype_) == 2, "tensor is ", dtype_name(dtype_), ", expected 16-bit");
  return static_cast<const uint16_t*>(data_);
}

Tensor Tensor::reshape(Shape shape) const {
  FLOWKV_CHECK(shape_numel(shape) == numel(), "cannot reshape ", shape_str(shape_), " to ",
               shape_str(shape));
  Tensor t = *this;
  t.shape_ = std::move(shape);
  return t;
}

Tensor Tensor::to_f32() const {
  Tensor out = empty(shape_, DType::kF32);
  float* o = out.f32();
  const int64_t n = numel();
  switch (dtype_) {
    case DType::kF32:
      std::memcpy(o, data_, static_cast<size_t>(n) * 4);
      break;
    case DType::kBF16:
      for (int64_t i = 0; i < n; ++i) o[i] = bf16_to_f32(u16()[i]);
      break;
    case DType::kF16:
      for (int64_t i = 0; i < n; ++i) o[i] = f16_to_f32(u16()[i]);
      break;
    default: {  // quantized: rows are whole blocks (checked when the tensor was made)
      const int64_t cols = shape_.back();
      const auto* src = static_cast<const uint8_t*>(data_);
      const int64_t row_bytes = dtype_bytes(dtype_, cols);
      for (int64_t r = 0; cols > 0 && r < n / cols; ++r) {
        quant::dequantize_row(dtype_, src + r * row_bytes, o + r * cols, cols);
      }
    }
  }
  return out;
}

Tensor Tensor::to(DType t) const {
  if (t == DType::kF32) return to_f32();
  const Tensor f = to_f32();
  Tensor out = empty(shape_, t);
  const int64_t cols = shape_.empty() ? 1 : shape_.back();
  const int64_t row_bytes = dtype_bytes(t, cols);
  auto* dst = static_cast<std::byte*>(out.data_);
  for (int64_t r = 0; cols > 0 && r < f.numel() / cols; ++r) {
    quant::quantize_row(t, f.f32() + r * cols, dst + r * row_bytes, cols);
  }
  return out;
}

Tensor Tensor::clone() const {
  Tensor out = empty(shape_, dtype_);
  std::memcpy(out.data_, data_, static_cast<size_t>(nbytes()));
  return out;
}

namespace {
// A float is not finite when its exponent bits are all ones. Blocks are reduced without an
// early exit (so the loop vectorises); only a block that has one is searched.
template <class Bits>
int64_t first_all_ones(const Bits* p, int64_t n, Bits exponent) {
  constexpr int64_t kBlock = 4096;
  for (int64_t b = 0; b < n; b += kBlock) {
    const int64_t e = std::min(n, b + kBlock);
    bool any = false;
    for (int64_t i = b; i < e; ++i) any |= (p[i] & exponent) == exponent;
    if (!any) continue;
    for (int64_t i = b; i < e; ++i) {
      if ((p[i] & exponent) == exponent) return i;
    }
  }
  return -1;
}
}  // namespace

int64_t first_non_finite(const Tensor& t) {
  switch (t.dtype()) {
    case DType::kF32:
      return first_all_ones(static_cast<const uint32_t*>(t.raw()), t.numel(), 0x7f800000u);
    case DType::kBF16:
      return first_all_ones(static_cast<const uint16_t*>(t.raw()), t.numel(), uint16_t{0x7f80});
    case DType::kF16:
      return first_all_ones(static_cast<const uint16_t*>(t.raw()), t.numel(), uint16_t{0x7c00});
    default: {  // quantized: widen one row at a time (a row is whole blocks)
      const int64_t cols = t.shape().back();
      if (cols == 0) return -1;
      const auto* src = static_cast<const uint8_t*>(t.raw());
      const int64_t row_bytes = dtype_bytes(t.dtype(), cols);
      std::vector<float> row(static_cast<size_t>(cols));
      for (int64_t r = 0; r < t.numel() / cols; ++r) {
        quant::dequantize_row(t.dtype(), src + r * row_bytes, row.data(), cols);
        const int64_t i =
            first_all_ones(reinterpret_cast<const uint32_t*>(row.data()), cols, 0x7f800000u);
        if (i >= 0) return r * cols + i;
      }
      return -1;
    }
  }
}

}  // namespace flowkv
