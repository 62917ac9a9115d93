// The token layout FLUX.2 Klein KV checkpoints are trained for, as cache rules see it. (Its
// shape for the cost model is the family's: families/flux2/cost.h.)
#pragma once

#include <vector>

#include "models/flux2/config.h"
#include "segments/layout.h"

namespace flowkv::flux2 {

// [text, ref 1 .. ref k, target]: references read references only and are modulated from
// `ref_timestep`; text and target read everything and follow the current step.
TokenLayout klein_kv_layout(int64_t text_tokens, const std::vector<int64_t>& ref_tokens,
                            int64_t target_tokens, float ref_timestep = 0.0f);

}  // namespace flowkv::flux2
