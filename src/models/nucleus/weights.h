// NucleusMoE-Image transformer weight names and shapes: the one name table (diffusers names).
#pragma once

#include <string>
#include <vector>

#include "io/checkpoint.h"
#include "models/nucleus/config.h"

namespace flowkv::nucleus {

namespace wn {
// Top level. Linears with ".bias" beside their ".weight" where noted.
inline constexpr const char* kTime1 = "time_text_embed.timestep_embedder.linear_1";  // + bias
inline constexpr const char* kTime2 = "time_text_embed.timestep_embedder.linear_2";  // + bias
inline constexpr const char* kTimeNorm = "time_text_embed.norm.weight";              // RMSNorm [D]
inline constexpr const char* kTxtNorm = "txt_norm.weight";                           // RMSNorm [C]
inline constexpr const char* kImgIn = "img_in";                                      // + bias
inline constexpr const char* kNormOut = "norm_out.linear";  // + bias: [scale, shift]
inline constexpr const char* kProjOut = "proj_out.weight";  // no bias
// Per block: "transformer_blocks.{i}." + one of these.
inline constexpr const char* kImgMod = "img_mod.1";  // + bias: [scale1, gate1, scale2, gate2]
inline constexpr const char* kEncoderProj = "encoder_proj";  // + bias
inline constexpr const char* kToQ = "attn.to_q.weight";
inline constexpr const char* kToK = "attn.to_k.weight";
inline constexpr const char* kToV = "attn.to_v.weight";
inline constexpr const char* kAddK = "attn.add_k_proj.weight";
inline constexpr const char* kAddV = "attn.add_v_proj.weight";
inline constexpr const char* kToOut = "attn.to_out.0.weight";
inline constexpr const char* kNormQ = "attn.norm_q.weight";
inline constexpr const char* kNormK = "attn.norm_k.weight";
inline constexpr const char* kNormAddedQ = "attn.norm_added_q.weight";  // stored, never used
inline constexpr const char* kNormAddedK = "attn.norm_added_k.weight";
// Dense blocks: diffusers' SwiGLU FeedForward (value rows first, then gate rows).
inline constexpr const char* kMlpIn = "img_mlp.net.0.proj.weight";  // [2F, D]
inline constexpr const char* kMlpOut = "img_mlp.net.2.weight";      // [D, F]
// MoE blocks: "transformer_blocks.{i}." + kMoE + one of moe.h's wmoe names.
inline constexpr const char* kMoE = "img_mlp.";
}  // namespace wn

inline std::string block_name(int64_t i, const char* leaf) {
  return "transformer_blocks." + std::to_string(i) + "." + leaf;
}

// Every tensor of a checkpoint of config c; MoE expert tensors in `output_major` layout
// (gate_up_proj [E, 2I, D], down_proj [E, D, I], as `flowkv quantize` writes them) or as
// diffusers stores them ([E, D, 2I], [E, I, D]).
std::vector<ExpectedTensor> weight_table(const Config& c, bool output_major = false);

}  // namespace flowkv::nucleus
