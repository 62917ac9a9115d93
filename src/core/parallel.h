// Threading. Each parallel_for runs on an OpenMP team started by the calling thread (several
// callers: several teams); oneDNN runs on the same runtime, one thread per primitive. Work is split
// into tasks whose boundaries depend only on the problem shape, never on the thread count, so a
// result is bit-identical whether 1 or N threads run it.
#pragma once

#include <omp.h>

#include <atomic>
#include <cstdint>
#include <exception>
#include <utility>

namespace flowkv {

// Threads used by parallel_for; 0 means "all the machine's cores". Process-wide; safe to call
// while other threads run (a parallel_for already running keeps the team it started with).
void set_num_threads(int n);
int num_threads();

namespace detail {
// The calling thread's index in the parallel_for team it works for (0 outside one). Kept by
// parallel_for itself: omp_get_thread_num() would answer for a caller's own OpenMP team.
inline thread_local int t_thread_index = 0;
}  // namespace detail

// Calls fn(i) for i in [0, n), spread over the threads. Each task must write disjoint memory.
// Whatever thread calls it (main, a bare std::thread, a thread inside the caller's own OpenMP
// team) and whatever that thread's OpenMP settings are, the team is num_threads() threads (or
// just the caller, inside another parallel region).
//
// `threads`: the team size a caller already sized per-thread scratch for (read num_threads()
// once, so a concurrent set_num_threads cannot grow the team past the scratch).
template <class Fn>
void parallel_for_on(int threads, int64_t n, Fn&& fn) {
  if (n <= 1 || threads <= 1 || omp_in_parallel()) {
    for (int64_t i = 0; i < n; ++i) fn(i);
    return;
  }
  const int outer = detail::t_thread_index;
  // An exception may not leave an OpenMP region (it would terminate the process): the first
  // one is kept, the remaining tasks are skipped, and it is rethrown on the calling thread.
  std::exception_ptr error;
  std::atomic<bool> failed{false};
#pragma omp parallel num_threads(threads)
  {
    detail::t_thread_index = omp_get_thread_num();
#pragma omp for schedule(dynamic, 1)
    for (int64_t i = 0; i < n; ++i) {
      if (failed.load(std::memory_order_relaxed)) continue;
      try {
        fn(i);
      } catch (...) {
#pragma omp critical(flowkv_parallel_error)
        if (!error) error = std::current_exception();
        failed.store(true, std::memory_order_relaxed);
      }
    }
  }
  detail::t_thread_index = outer;
  if (error) std::rethrow_exception(error);
}

template <class Fn>
void parallel_for(int64_t n, Fn&& fn) {
  parallel_for_on(num_threads(), n, std::forward<Fn>(fn));
}

// Index of the calling thread in its parallel_for team, below the team size (0 outside one).
inline int thread_index() {
  return detail::t_thread_index;
}

}  // namespace flowkv
