// Process-wide runtime settings and machine facts.
#pragma once

#include <cstdint>
#include <string>

namespace flowkv {

// Threads for all kernels (0: every core; at most limits::kMaxThreads). Results do not depend
// on it.
void set_threads(int n);
int threads();
// The memory budget: models, activations and a request's caches are predicted and checked
// against it before anything is allocated; over it, a call fails with a flowkv::Error naming
// the figures. 0 (default): the memory available at the time of the check. Negative: no check.
void set_memory_budget(int64_t bytes);
int64_t memory_budget();
// The instruction set the vector kernels run on here ("AVX2", "AVX3" = AVX-512, ...).
std::string simd_target();
// Whether bf16 matrix products run on bf16 instructions here (AVX512_BF16 / AMX). Without
// them, bf16 weights are multiplied as their exact f32 values at the f32 rate.
bool native_bf16_gemm();
// This machine's f32 multiply-add peak in GFLOP/s on `threads` threads, measured now.
double measure_peak_gflops(int threads);

}  // namespace flowkv
