// Position and time embeddings shared by the flow transformers.
#pragma once

#include <cstdint>
#include <vector>

namespace flowkv {

// diffusers get_timestep_embedding(t, channels, flip_sin_to_cos=True, downscale_freq_shift=0,
// scale): out = [cos(a_0..), sin(a_0..)], a_i = (t * f_i) * scale, f_i = exp(-ln(10000) * i /
// (channels/2)), all in f32 with PyTorch's operation order (scale 1 skips the multiply).
void timestep_sinusoid(float t, int64_t channels, float* out, float scale = 1.0f);

// Interleaved-pair RoPE tables (diffusers get_1d_rotary_pos_embed with use_real=True,
// repeat_interleave_real=True, float64 frequencies): for token s and axis a with dims d_a,
// angle_k = ids[s, a] * theta^(-2k/d_a), written as cos/sin pairs [c0, c0, c1, c1, ...].
// ids: [tokens, ids_stride] (the first axes.size() columns are used); cos, sin: [tokens, sum d_a].
void rope_tables(const float* ids, int64_t tokens, int64_t ids_stride,
                 const std::vector<int64_t>& axes_dims, double theta, float* cos, float* sin);

}  // namespace flowkv
