// The loaded FLUX.2 weights: linear layers prepacked for oneDNN, norm vectors as f32.
#pragma once

#include <vector>

#include "models/flux2/model.h"

namespace flowkv::flux2 {

struct DoubleBlockWeights {
  ops::Linear qkv, qkv_txt;  // to_q|to_k|to_v and add_q|add_k|add_v stacked: [3D, D]
  ops::Linear out, out_txt;  // to_out.0, to_add_out
  ops::Linear ff_in, ff_out, ff_txt_in, ff_txt_out;
  std::vector<float> norm_q, norm_k, norm_added_q, norm_added_k;
};

struct SingleBlockWeights {
  ops::Linear qkv_mlp;  // [3D + 2F, D]: Q, K, V, gate, value
  ops::Linear out;      // [D, D + F]
  std::vector<float> norm_q, norm_k;
};

struct Model::Weights {
  Config cfg;
  DType compute = DType::kF32;
  ops::Linear x_embedder, context_embedder;
  ops::Linear time_1, time_2, guidance_1, guidance_2;  // guidance_* empty without guidance
  ops::Linear mod_img, mod_txt, mod_single, norm_out, proj_out;
  std::vector<DoubleBlockWeights> doubles;
  std::vector<SingleBlockWeights> singles;
};

}  // namespace flowkv::flux2
