#include "core/parallel.h"

#include <atomic>
#include <thread>

namespace flowkv {

namespace {
std::atomic<int> g_threads{0};
}

void set_num_threads(int n) {
  g_threads.store(n, std::memory_order_relaxed);
}

int num_threads() {
  const int set = g_threads.load(std::memory_order_relaxed);
  if (set > 0) return set;
  static const int hw = [] {
    const unsigned n = std::thread::hardware_concurrency();
    return n == 0 ? 1 : static_cast<int>(n);
  }();
  return hw;
}

}  // namespace flowkv
