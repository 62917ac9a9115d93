#include "flowkv/runtime.h"

#include "core/parallel.h"
#include "ops/cpu/row_kernels.h"
#include "ops/linear.h"
#include "ops/peak.h"

namespace flowkv {

void set_threads(int n) {
  set_num_threads(n);
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
