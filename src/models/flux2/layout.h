// The token layout FLUX.2 Klein KV checkpoints are trained for, as cache rules see it, and the
// model's shape for the cost model.
#pragma once

#include <vector>

#include "cost/cost_model.h"
#include "models/flux2/config.h"
#include "segments/layout.h"

namespace flowkv::flux2 {

// [text, ref 1 .. ref k, target]: references read references only and are modulated from
// `ref_timestep`; text and target read everything and follow the current step.
TokenLayout klein_kv_layout(int64_t text_tokens, const std::vector<int64_t>& ref_tokens,
                            int64_t target_tokens, float ref_timestep = 0.0f);

cost::ModelShape cost_shape(const Config& c, int64_t kv_bytes_per_element);

}  // namespace flowkv::flux2
