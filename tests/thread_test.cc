// Results do not depend on the calling thread: the same forward run on the main thread, on a
// bare std::thread, from threads whose OpenMP settings differ (as an embedding application's
// may), and as many calls at once gives the same bits. The calling thread's OpenMP settings
// are left as they were.
#include <gtest/gtest.h>
#include <omp.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "core/parallel.h"
#include "flowkv/error.h"
#include "flowkv/flux2.h"
#include "flowkv/runtime.h"
#include "models/flux2/builtin.h"

namespace flowkv {
namespace {

// The main thread's OpenMP team size before flowkv ran anything.
const int g_main_icv = omp_get_max_threads();

struct Case {
  Flux2Transformer model;
  Flux2Call call;
};

// A forward whose linear layers span one and several column tiles (widths 64 to 1,152).
Case make_case(const std::string& name, const std::string& dtype, int64_t tokens) {
  Case c{Flux2Transformer::builtin(name, 7, dtype), {}};
  const int64_t b = 1, l = 8;
  c.call.img = Tensor::empty({b, tokens, c.model.in_channels()});
  c.call.txt = Tensor::empty({b, l, c.model.text_channels()});
  flux2::fill_normal(c.call.img.f32(), c.call.img.numel(), 21);
  flux2::fill_normal(c.call.txt.f32(), c.call.txt.numel(), 22);
  c.call.img_ids = Tensor::zeros({tokens, 4});
  c.call.txt_ids = Tensor::zeros({l, 4});
  for (int64_t i = 0; i < tokens; ++i) {
    c.call.img_ids.f32()[i * 4 + 1] = float(i / 8);
    c.call.img_ids.f32()[i * 4 + 2] = float(i % 8);
  }
  for (int64_t i = 0; i < l; ++i) c.call.txt_ids.f32()[i * 4 + 3] = float(i);
  c.call.timestep = Tensor::from_vector({0.6f}, {b});
  return c;
}

std::vector<float> run(const Case& c) {
  const Tensor out = c.model.forward(c.call);
  return std::vector<float>(out.f32(), out.f32() + out.numel());
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Runs fn on a fresh std::thread whose OpenMP team size is `omp_threads` (0: untouched).
template <class Fn>
void on_thread(int omp_threads, Fn&& fn) {
  std::thread t([&] {
    if (omp_threads > 0) omp_set_num_threads(omp_threads);
    fn();
  });
  t.join();
}

class ThreadTest : public ::testing::TestWithParam<std::string> {};

TEST_P(ThreadTest, SameBitsFromAnyThread) {
  const std::string dtype = GetParam();
  for (const auto& [name, tokens] : {std::pair<std::string, int64_t>{"tiny", 40}, {"small", 48}}) {
    SCOPED_TRACE(name + " " + dtype);
    const Case c = make_case(name, dtype, tokens);
    // The main thread, as the CLI runs it (default threads, then one thread).
    const std::vector<float> ref = run(c);
    EXPECT_EQ(omp_get_max_threads(), g_main_icv) << "flowkv changed the caller's OpenMP settings";
    set_threads(1);
    EXPECT_TRUE(same_bits(run(c), ref)) << "main thread, set_threads(1)";
    set_threads(0);

    // A bare thread, and threads whose OpenMP default team differs.
    for (int icv : {0, 1, 2, 3, 8}) {
      std::vector<float> out;
      int after = 0;
      on_thread(icv, [&] {
        const int before = omp_get_max_threads();
        out = run(c);
        after = omp_get_max_threads() - before;
      });
      EXPECT_TRUE(same_bits(out, ref)) << "thread with omp_set_num_threads(" << icv << ")";
      EXPECT_EQ(after, 0) << "forward changed the calling thread's OpenMP settings";
    }

    // From inside the caller's own OpenMP team (flowkv then runs each call on its thread).
    std::atomic<int> team_mismatches{0};
#pragma omp parallel num_threads(4)
    {
      if (!same_bits(run(c), ref)) ++team_mismatches;
    }
    EXPECT_EQ(team_mismatches.load(), 0) << "calls from inside an OpenMP parallel region";

    // N threads x M calls at once.
    constexpr int kThreads = 4, kCalls = 3;
    std::atomic<int> mismatches{0};
    std::vector<std::thread> pool;
    for (int t = 0; t < kThreads; ++t) {
      pool.emplace_back([&, t] {
        omp_set_num_threads(1 + 2 * t);
        for (int i = 0; i < kCalls; ++i) {
          if (!same_bits(run(c), ref)) ++mismatches;
        }
      });
    }
    for (auto& t : pool) t.join();
    EXPECT_EQ(mismatches.load(), 0) << "of " << kThreads * kCalls << " concurrent calls";
  }
}

INSTANTIATE_TEST_SUITE_P(Weights, ThreadTest, ::testing::Values("f32", "bf16"));

// An error inside a parallel task reaches the caller as itself (an exception may not leave an
// OpenMP region: it would terminate the process), and the other tasks stop early.
TEST(ParallelFor, AnErrorInATaskReachesTheCaller) {
  set_num_threads(2);
  std::atomic<int> ran{0};
  try {
    parallel_for(1000, [&](int64_t i) {
      ran.fetch_add(1);
      if (i == 3) fail("task ", i, " failed");
      // The first throw in a process is slow (the unwinder loads its tables): tasks that take
      // no time could all finish before the failure is recorded, whatever the loop does.
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    });
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "task 3 failed");
  }
  EXPECT_LT(ran.load(), 1000);
  set_num_threads(0);
}

}  // namespace
}  // namespace flowkv
