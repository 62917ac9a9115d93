// Process-wide runtime settings and machine facts.
#pragma once

#include <string>

namespace flowkv {

// Threads for all kernels (0: every core). Results do not depend on it.
void set_threads(int n);
int threads();
// The instruction set the vector kernels run on here ("AVX2", "AVX3" = AVX-512, ...).
std::string simd_target();
// Whether bf16 matrix products run on bf16 instructions here (AVX512_BF16 / AMX). Without
// them, bf16 weights are multiplied as their exact f32 values at the f32 rate.
bool native_bf16_gemm();
// This machine's f32 multiply-add peak in GFLOP/s on `threads` threads, measured now.
double measure_peak_gflops(int threads);

}  // namespace flowkv
