// The loaded size of a model's weights, from the types they are stored in: what
// check_weights_fit compares with the memory budget before anything is packed.
#pragma once

#include <functional>
#include <map>
#include <string>

#include "io/checkpoint.h"
#include "ops/linear.h"

namespace flowkv {

inline std::function<int64_t(const ExpectedTensor&)> held_bytes(
    const std::map<std::string, TensorInfo>& stored, DType compute) {
  return [&stored, compute](const ExpectedTensor& e) {
    const auto it = stored.find(e.name);
    const DType t = it != stored.end() && it->second.dtype_known ? it->second.dtype : DType::kF32;
    return ops::held_weight_bytes(t, e.shape, compute);
  };
}

}  // namespace flowkv
