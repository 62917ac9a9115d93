// What the FLUX.2 family adds to its model for the rest of the engine: its shape in the cost
// model (models do not include cost/).
#pragma once

#include <cstdint>

#include "cost/cost_model.h"
#include "models/flux2/config.h"

namespace flowkv::flux2 {

// Double and single blocks all cache K/V; the MLP hidden size is mlp_ratio * width.
cost::ModelShape cost_shape(const Config& c, int64_t kv_bytes_per_element);

}  // namespace flowkv::flux2
