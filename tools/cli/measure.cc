#include "measure.h"
#include <cctype>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <sstream>

#include "flowkv/error.h"
#include "flowkv/limits.h"

namespace flowkv::cli {

double median(std::vector<double> v) {
  FLOWKV_CHECK(!v.empty(), "median of nothing");
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

void progress(const std::string& line) {
  static const bool tty = isatty(2);
  if (tty) {
    std::fprintf(stderr, "\r\033[K%s", line.c_str());
  } else {
    std::fprintf(stderr, "%s\n", line.c_str());
  }
  std::fflush(stderr);
}

void progress_done() {
  if (isatty(2)) std::fprintf(stderr, "\r\033[K");
}

namespace {
// A whole decimal integer in [lo, hi], or nothing (no wrap-around: 4294967297 is not 1).
bool read_int(const std::string& s, int64_t lo, int64_t hi, int64_t* out) {
  if (s.empty() || s.size() > 19 || s.find_first_not_of("0123456789") != std::string::npos) {
    return false;
  }
  const long long v = std::strtoll(s.c_str(), nullptr, 10);
  if (v < lo || v > hi) return false;
  *out = v;
  return true;
}
}  // namespace

int64_t parse_bytes(const std::string& s, const char* what) {
  char* end = nullptr;
  const double v = s.empty() ? NAN : std::strtod(s.c_str(), &end);
  double mult = 1;
  const std::string suffix(end ? end : "");
  if (suffix == "K" || suffix == "KiB")
    mult = 1024.0;
  else if (suffix == "M" || suffix == "MiB")
    mult = 1024.0 * 1024;
  else if (suffix == "G" || suffix == "GiB")
    mult = 1024.0 * 1024 * 1024;
  else if (!suffix.empty())
    mult = NAN;
  const double bytes = v * mult;
  // 2^63 as a double is the first value out of range: compare below it, never cast above it.
  FLOWKV_CHECK(std::isfinite(bytes) && bytes >= 0 && bytes < 9223372036854775807.0, what,
               ": cannot read '", s, "' as a size (use e.g. 2G, 512M, 1000000)");
  return static_cast<int64_t>(bytes);
}

std::vector<int> parse_int_list(const std::string& s, const char* what, int lo, int hi) {
  std::vector<int> out;
  std::stringstream in(s);
  std::string item;
  while (std::getline(in, item, ',')) {
    int64_t v = 0;
    FLOWKV_CHECK(read_int(item, lo, hi, &v), what, ": '", item, "' is not an integer in [", lo,
                 ", ", hi, "]");
    out.push_back(static_cast<int>(v));
  }
  FLOWKV_CHECK(!out.empty(), what, " is empty");
  return out;
}

std::pair<int64_t, int64_t> parse_dims(const std::string& s, const char* what, const char* form,
                                       int64_t max_side, int64_t max_product) {
  const size_t x = s.find('x');
  int64_t a = 0, b = 0;
  FLOWKV_CHECK(x != std::string::npos && read_int(s.substr(0, x), 1, max_side, &a) &&
                   read_int(s.substr(x + 1), 1, max_side, &b),
               what, " must look like ", form, " with sides from 1 to ", max_side, ", got '", s,
               "'");
  FLOWKV_CHECK(a <= max_product / b, what, ": ", a, "x", b, " is more than ", max_product,
               " in all");
  return {a, b};
}

std::pair<int64_t, int64_t> parse_grid(const std::string& s, const char* what) {
  return parse_dims(s, what, "16x16 (latent tokens, height x width)", limits::kMaxTokens,
                    limits::kMaxTokens);
}

DType parse_weight_type(const std::string& s, const char* what) {
  for (DType t : {DType::kF32, DType::kBF16, DType::kF16, DType::kQ8_0, DType::kQ4_0, DType::kQ4_1,
                  DType::kQ5_0, DType::kQ5_1, DType::kQ4_K, DType::kQ5_K, DType::kQ6_K}) {
    std::string name(dtype_name(t));
    for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    if (name == s) return t;
  }
  fail(what, ": unknown type '", s, "' (f32, bf16, f16, q8_0, q4_0, q4_1, q5_0, q5_1, ",
       "q4_k, q5_k, q6_k)");
}

}  // namespace flowkv::cli
