// Checked size arithmetic: every size computed from user input (file headers, config.json,
// command-line flags, request fields) goes through these, so an overflow is a flowkv::Error that
// names the quantity instead of undefined behaviour.
#pragma once

#include <cstdint>
#include <string_view>

#include "flowkv/error.h"
#include "flowkv/tensor.h"

namespace flowkv {

inline int64_t checked_mul(int64_t a, int64_t b, std::string_view what) {
  int64_t r = 0;
  if (__builtin_mul_overflow(a, b, &r)) fail(what, ": ", a, " x ", b, " overflows 64 bits");
  return r;
}

inline int64_t checked_add(int64_t a, int64_t b, std::string_view what) {
  int64_t r = 0;
  if (__builtin_add_overflow(a, b, &r)) fail(what, ": ", a, " + ", b, " overflows 64 bits");
  return r;
}

// Elements of a shape whose dimensions must each be >= 0.
inline int64_t checked_numel(const Shape& s, std::string_view what) {
  int64_t n = 1;
  for (int64_t d : s) {
    FLOWKV_CHECK(d >= 0, what, ": negative dimension ", d);
    n = checked_mul(n, d, what);
  }
  return n;
}

// An unsigned value read from a file or a request, as int64 (refused above INT64_MAX).
inline int64_t checked_i64(uint64_t v, std::string_view what) {
  FLOWKV_CHECK(v <= static_cast<uint64_t>(INT64_MAX), what, ": ", v,
               " is larger than the largest signed 64-bit size");
  return static_cast<int64_t>(v);
}

}  // namespace flowkv
