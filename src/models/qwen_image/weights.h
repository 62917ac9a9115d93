// Qwen-Image family weight names: one table per model (diffusers names and shapes).
#pragma once

#include <string>
#include <vector>

#include "io/checkpoint.h"
#include "models/qwen_image/config.h"

namespace flowkv::qwen {

// Qwen-Image-2.1 (no biases anywhere).
namespace w21 {
inline constexpr const char* kTime1 = "time_text_embed.timestep_embedder.linear_1.weight";
inline constexpr const char* kTime2 = "time_text_embed.timestep_embedder.linear_2.weight";
inline constexpr const char* kTextNorm = "txt_in.text_norm.weight";  // zero-centred: scale - 1
inline constexpr const char* kTextIn = "txt_in.in_layer.weight";
inline constexpr const char* kTextOut = "txt_in.out_layer.weight";
inline constexpr const char* kImgIn = "img_in.weight";
inline constexpr const char* kModulation = "modulation.1.weight";
inline constexpr const char* kNormOut = "norm_out.linear.weight";
inline constexpr const char* kProjOut = "proj_out.weight";
// Per block: "transformer_blocks.{i}." + one of these.
inline constexpr const char* kToQ = "attn.to_q.weight";
inline constexpr const char* kToK = "attn.to_k.weight";
inline constexpr const char* kToV = "attn.to_v.weight";
inline constexpr const char* kToOut = "attn.to_out.0.weight";
inline constexpr const char* kNormQ = "attn.norm_q.weight";
inline constexpr const char* kNormK = "attn.norm_k.weight";
inline constexpr const char* kGate = "img_mlp.gate_layer.weight";
inline constexpr const char* kProj = "img_mlp.proj.weight";
inline constexpr const char* kOut = "img_mlp.out.weight";
}  // namespace w21

// Qwen-Image (dual stream; every linear has a bias named like its weight with ".bias").
namespace wqi {
inline constexpr const char* kTime1 = "time_text_embed.timestep_embedder.linear_1";
inline constexpr const char* kTime2 = "time_text_embed.timestep_embedder.linear_2";
inline constexpr const char* kTxtNorm = "txt_norm.weight";
inline constexpr const char* kImgIn = "img_in";
inline constexpr const char* kTxtIn = "txt_in";
inline constexpr const char* kNormOut = "norm_out.linear";
inline constexpr const char* kProjOut = "proj_out";
// Per block ("transformer_blocks.{i}."): linears (".weight" + ".bias") and norms (".weight").
inline constexpr const char* kImgMod = "img_mod.1";
inline constexpr const char* kTxtMod = "txt_mod.1";
inline constexpr const char* kToQ = "attn.to_q";
inline constexpr const char* kToK = "attn.to_k";
inline constexpr const char* kToV = "attn.to_v";
inline constexpr const char* kAddQ = "attn.add_q_proj";
inline constexpr const char* kAddK = "attn.add_k_proj";
inline constexpr const char* kAddV = "attn.add_v_proj";
inline constexpr const char* kToOut = "attn.to_out.0";
inline constexpr const char* kToAddOut = "attn.to_add_out";
inline constexpr const char* kImgMlpIn = "img_mlp.net.0.proj";
inline constexpr const char* kImgMlpOut = "img_mlp.net.2";
inline constexpr const char* kTxtMlpIn = "txt_mlp.net.0.proj";
inline constexpr const char* kTxtMlpOut = "txt_mlp.net.2";
inline constexpr const char* kNormQ = "attn.norm_q.weight";
inline constexpr const char* kNormK = "attn.norm_k.weight";
inline constexpr const char* kNormAddedQ = "attn.norm_added_q.weight";
inline constexpr const char* kNormAddedK = "attn.norm_added_k.weight";
}  // namespace wqi

inline std::string block_name(int64_t i, const char* leaf) {
  return "transformer_blocks." + std::to_string(i) + "." + leaf;
}

std::vector<ExpectedTensor> weight_table(const Config21& c);
std::vector<ExpectedTensor> weight_table(const ConfigQwenImage& c);

}  // namespace flowkv::qwen
