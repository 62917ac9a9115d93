// Deterministic random weights for built-in models and tests: each value depends only on
// (seed, tensor name, index), not on the order tensors are generated in.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "flowkv/tensor.h"
#include "io/checkpoint.h"

namespace flowkv {

// Matrices ~ N(0, 1/fan_in); vectors = center(name) + 0.1 N(0, 1) (norm weights around 1,
// zero-centred norms and biases around 0).
std::map<std::string, Tensor> random_weights(
    const std::vector<ExpectedTensor>& table, uint64_t seed, DType dtype,
    const std::function<float(const std::string&)>& center);

// Deterministic N(0, scale^2) values.
void fill_normal(float* out, int64_t n, uint64_t seed, float scale = 1.0f);

}  // namespace flowkv
