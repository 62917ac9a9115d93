// Threading. One OpenMP team per process (oneDNN runs on the same runtime). Work is split into
// tasks whose boundaries depend only on the problem shape, never on the thread count, so a
// result is bit-identical whether 1 or N threads run it.
#pragma once

#include <omp.h>

#include <cstdint>

namespace flowkv {

// Threads used by parallel_for; 0 means "all the machine's cores".
void set_num_threads(int n);
int num_threads();

// Calls fn(i) for i in [0, n), spread over the threads. Each task must write disjoint memory.
template <class Fn>
void parallel_for(int64_t n, Fn&& fn) {
  const int threads = num_threads();
  if (n <= 1 || threads <= 1 || omp_in_parallel()) {
    for (int64_t i = 0; i < n; ++i) fn(i);
    return;
  }
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
  for (int64_t i = 0; i < n; ++i) fn(i);
}

// Index of the calling thread inside parallel_for (0 outside).
inline int thread_index() {
  return omp_get_thread_num();
}

}  // namespace flowkv
