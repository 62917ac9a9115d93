#include "core/parallel.h"

#include <thread>

namespace flowkv {

namespace {
int g_threads = 0;
}

void set_num_threads(int n) {
  g_threads = n;
}

int num_threads() {
  if (g_threads > 0) return g_threads;
  static const int hw = [] {
    const unsigned n = std::thread::hardware_concurrency();
    return n == 0 ? 1 : static_cast<int>(n);
  }();
  return hw;
}

}  // namespace flowkv
