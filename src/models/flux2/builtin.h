// Built-in FLUX.2-shaped models with deterministic random weights: what the benchmark and the
// README's main command run on a machine without checkpoints.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "flowkv/tensor.h"
#include "models/flux2/config.h"

namespace flowkv::flux2 {

// "tiny" (width 64, 1 double + 2 single blocks: tests and quick runs), "small" (the KV
// benchmark's default: Klein-9B-KV-shaped - in_channels 128, head_dim 128, text width 3d - at
// width 384 = 3 heads, 2 double + 6 single blocks) and "medium" (width 1024 = 8 heads, 2 double
// + 6 single: the forward benchmark).
bool builtin_config(const std::string& name, Config* out);
std::vector<std::string> builtin_names();

// Weights under diffusers names: linear weights ~ N(0, 1/fan_in), norm weights 1 + 0.1 N(0,1).
// Each value depends only on (seed, tensor name, index), not on generation order.
std::map<std::string, Tensor> random_weights(const Config& c, uint64_t seed, DType dtype);

// Deterministic N(0, 1) values (tests and the benchmark's inputs).
void fill_normal(float* out, int64_t n, uint64_t seed, float scale = 1.0f);

}  // namespace flowkv::flux2
