#include "measure.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "flowkv/error.h"

namespace flowkv::cli {

double median(std::vector<double> v) {
  FLOWKV_CHECK(!v.empty(), "median of nothing");
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

int64_t peak_rss_bytes() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmHWM:", 0) == 0) {
      std::istringstream s(line.substr(6));
      int64_t kb = 0;
      s >> kb;
      return kb * 1024;
    }
  }
  return -1;
}

bool reset_peak_rss() {
  std::ofstream out("/proc/self/clear_refs");
  if (!out) return false;
  out << "5";
  return static_cast<bool>(out);
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

int64_t parse_bytes(const std::string& s) {
  FLOWKV_CHECK(!s.empty(), "empty size");
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  double mult = 1;
  const std::string suffix(end);
  if (suffix == "K" || suffix == "KiB")
    mult = 1024.0;
  else if (suffix == "M" || suffix == "MiB")
    mult = 1024.0 * 1024;
  else if (suffix == "G" || suffix == "GiB")
    mult = 1024.0 * 1024 * 1024;
  else
    FLOWKV_CHECK(suffix.empty(), "cannot read '", s, "' as a size (use e.g. 2G, 512M, 1000000)");
  FLOWKV_CHECK(v >= 0, "a size cannot be negative: ", s);
  return static_cast<int64_t>(v * mult);
}

std::vector<int> parse_int_list(const std::string& s, const char* what) {
  std::vector<int> out;
  std::stringstream in(s);
  std::string item;
  while (std::getline(in, item, ',')) {
    char* end = nullptr;
    const long v = std::strtol(item.c_str(), &end, 10);
    FLOWKV_CHECK(!item.empty() && *end == 0 && v >= 0, what, ": '", item,
                 "' is not a non-negative integer");
    out.push_back(static_cast<int>(v));
  }
  FLOWKV_CHECK(!out.empty(), what, " is empty");
  return out;
}

std::pair<int64_t, int64_t> parse_dims(const std::string& s, const char* what, const char* form) {
  int64_t a = 0, b = 0;
  char tail = 0;
  FLOWKV_CHECK(std::sscanf(s.c_str(), "%ldx%ld%c", &a, &b, &tail) == 2 && a > 0 && b > 0, what,
               " must look like ", form, ", got '", s, "'");
  return {a, b};
}

}  // namespace flowkv::cli
