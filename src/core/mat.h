// Strided 2-D views over f32 activations: `rows` rows of `cols` values, row r at data + r*stride.
// Model code keeps activations as [B*S, C] matrices (PyTorch [B, S, C] flattened); a column
// slice (q, k, v inside a fused projection) is a view with the parent's stride.
#pragma once

#include <cstdint>
#include <cstring>

#include "flowkv/error.h"

namespace flowkv {

struct Mat {
  float* data = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t stride = 0;

  float* row(int64_t r) const { return data + r * stride; }
  // An empty matrix may have no storage (data null, an empty tensor's): its slices keep data as
  // it is, since a non-zero offset on a null pointer is undefined behaviour.
  Mat cols_slice(int64_t c0, int64_t n) const { return {data ? data + c0 : data, rows, n, stride}; }
  Mat rows_slice(int64_t r0, int64_t n) const {
    return {data ? data + r0 * stride : data, n, cols, stride};
  }
};

inline Mat make_mat(float* data, int64_t rows, int64_t cols) {
  return {data, rows, cols, cols};
}

// dst = src, row by row (same rows and cols).
inline void copy_rows(Mat src, Mat dst) {
  FLOWKV_CHECK(src.rows == dst.rows && src.cols == dst.cols, "copy_rows: shape mismatch");
  for (int64_t r = 0; r < src.rows; ++r) {
    std::memcpy(dst.row(r), src.row(r), static_cast<size_t>(src.cols) * sizeof(float));
  }
}

}  // namespace flowkv
