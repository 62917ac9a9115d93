// Process-wide runtime settings and machine facts.
#pragma once

#include <string>

namespace flowkv {

// Threads for all kernels (0: every core). Results do not depend on it.
void set_threads(int n);
int threads();
// The instruction set the vector kernels run on here ("AVX2", "AVX3" = AVX-512, ...).
std::string simd_target();
// This machine's f32 multiply-add peak in GFLOP/s on `threads` threads, measured now.
double measure_peak_gflops(int threads);

}  // namespace flowkv
