// What the Qwen-Image-2.1 family adds to its model for the rest of the engine: its shape in the
// cost model (models do not include cost/).
#pragma once

#include <cstdint>

#include "cost/cost_model.h"
#include "models/qwen_image/config.h"

namespace flowkv::qwen {

// One stream of num_layers joint blocks, each caching K/V; MLP hidden as the config says.
cost::ModelShape cost_shape(const Config21& c, int64_t kv_bytes_per_element);

}  // namespace flowkv::qwen
