#include "flowkv/runtime.h"

#include "core/memory.h"
#include "core/parallel.h"
#include "flowkv/error.h"
#include "flowkv/limits.h"
#include "ops/cpu/row_kernels.h"
#include "ops/linear.h"
#include "ops/peak.h"

namespace flowkv {

void set_threads(int n) {
  FLOWKV_CHECK(n >= 0 && n <= limits::kMaxThreads, "threads must be in [0, ", limits::kMaxThreads,
               "] (0: every core), got ", n);
  set_num_threads(n);
}
void set_memory_budget(int64_t bytes) {
  set_memory_budget_bytes(bytes);
}
int64_t memory_budget() {
  return memory_budget_bytes();
}
int64_t peak_rss() {
  return peak_rss_bytes();
}
int threads() {
  return num_threads();
}
std::string simd_target() {
  return ops::cpu::simd_target_name();
}
bool native_bf16_gemm() {
  return ops::native_bf16_gemm();
}
double measure_peak_gflops(int threads) {
  return ops::measure_f32_peak_gflops(threads);
}

}  // namespace flowkv
