// Process-wide runtime settings and machine facts.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "flowkv/dtype.h"

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
// The process's peak resident memory in bytes (-1 where unknown), and a reset of that peak to
// the current resident memory (false where the kernel does not allow it): stage by stage peaks.
int64_t peak_rss();
bool reset_peak_rss();
// The instruction set the vector kernels run on here ("AVX2", "AVX3" = AVX-512, ...).
std::string simd_target();
// Whether bf16 matrix products run on bf16 instructions here (AVX512_BF16 / AMX). Without
// them, bf16 weights are multiplied as their exact f32 values at the f32 rate.
bool native_bf16_gemm();
// This machine's f32 multiply-add peak in GFLOP/s on `threads` threads, measured now.
double measure_peak_gflops(int threads);

// One linear layer y[m, n] = x[m, k] · Wᵀ timed as the models run it, in several variants side
// by side: random weights stored as `weights` (F32 is packed at load; BF16, F16 and the GGUF
// types stay as stored), computed in `compute` ("f32", or "int8": 8-bit activations and
// weights, integer dot products). After a warm-up call of each, `runs` rounds each time one call
// of every variant in turn (alternating, so a busy machine slows all alike); medians are kept.
// `nmse`: the output's normalised mean squared error against f32 weights and f32 compute.
struct GemmVariant {
  DType weights = DType::kF32;
  std::string compute = "f32";
};
struct GemmTiming {
  double median_seconds = 0;
  double gflops = 0;  // 2·m·n·k / median
  double nmse = 0;
  int64_t weight_bytes = 0;  // as held by the layer
};
std::vector<GemmTiming> time_gemm(int64_t m, int64_t k, int64_t n,
                                  const std::vector<GemmVariant>& variants, int runs);

// NucleusMoE-Image's mixture-of-experts MLP (router, shared expert, expert-choice routed
// experts gathered and multiplied per expert) on `tokens` rows of random values, with random
// weights stored as `weights`, against a dense SwiGLU doing the same multiply-adds per token
// (inner width (1 + routed rows per token) x inner, rounded up to whole blocks), alternating
// one call of each per round after a warm-up; medians are kept (the MoE benchmark's
// measurement, src/api/moe_timing.cc).
struct MoeShape {
  int64_t tokens = 4096;  // S: one 1024^2 image
  int64_t dim = 2048;     // D
  int64_t inner = 1344;   // I: moe_intermediate_dim
  int64_t experts = 64;   // E
  double capacity_factor = 2.0;
};
struct MoeTiming {
  int64_t capacity = 0;              // C = max(1, ceil(cf S / E)) rows per expert
  double routed_rows_per_token = 0;  // E C / S
  int64_t dense_inner = 0;           // the dense SwiGLU's inner width
  double moe_seconds = 0, dense_seconds = 0;
  double moe_flops = 0, dense_flops = 0;   // 2 x multiply-adds of one call
  int64_t moe_bytes = 0, dense_bytes = 0;  // weights as held
};
MoeTiming time_moe(const MoeShape& shape, DType weights, int runs);

// A tokenizer.json loaded and `texts` encoded, timed (the tokenizer benchmark's measurement,
// src/api/tokenizer_timing.cc). The first pass starts from an empty word cache, as a fresh
// process's first prompts do; the `runs` - 1 passes after it find the words cached, and the
// fastest of them is kept. Every pass must give the first pass's ids (a flowkv::Error if not).
struct TokenizerTiming {
  double load_seconds = 0;  // reading and checking tokenizer.json
  double cold_seconds = 0;  // the first pass
  double warm_seconds = 0;  // the fastest later pass; 0 when runs is 1
  int64_t tokens = 0;       // ids of one pass
  int64_t bytes = 0;        // UTF-8 bytes of one pass
};
TokenizerTiming time_tokenizer(const std::string& tokenizer_json,
                               const std::vector<std::string>& texts, int runs);

}  // namespace flowkv
