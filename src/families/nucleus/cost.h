// What the NucleusMoE-Image family adds to its model for the rest of the engine: its shape in
// the cost model (models do not include cost/).
#pragma once

#include <cstdint>

#include "cost/cost_model.h"
#include "models/nucleus/config.h"

namespace flowkv::nucleus {

// num_layers single-stream blocks over the image tokens, whose keys are [image | text]: GQA
// (k and v of num_key_value_heads x head_dim), the MLP averaged over the layers (dense SwiGLU,
// or a mixture of experts: router, shared expert, and the routed experts' E x C rows of an
// image of `image_tokens` tokens), the text as keys only (encoder_proj, add_k_proj, add_v_proj).
cost::ModelShape cost_shape(const Config& c, int64_t image_tokens, int64_t kv_bytes_per_element);

}  // namespace flowkv::nucleus

namespace flowkv::families {

// [text (keys and values only, cacheable), target]: the rules engine derives the cache.
TokenLayout nucleus_layout(int64_t text, int64_t target);

}  // namespace flowkv::families
