// A built-in NucleusMoE-Image-shaped model with deterministic random weights (family tests).
#pragma once

#include <map>
#include <string>
#include <vector>

#include "flowkv/tensor.h"
#include "models/nucleus/config.h"

namespace flowkv::nucleus {

// "nucleus-tiny": 5 blocks x 64 (4 query heads, 2 KV heads of 16), layers 0-2 dense (SwiGLU
// 128), 3-4 mixture-of-experts (4 experts of 32, capacity factor 2), 2x2-packed 4-channel
// latents, 24-wide text features, RoPE axes (4, 6, 6).
bool builtin_config(const std::string& name, Config* out);
std::vector<std::string> builtin_names();
// Every tensor of weight_table(c) (experts as diffusers stores them); norm weights around 1,
// biases around 0.
std::map<std::string, Tensor> random_weights(const Config& c, uint64_t seed, DType dtype);

}  // namespace flowkv::nucleus
