// Qwen3 weight names: the one table (transformers' Qwen3ForCausalLM keys and shapes).
#pragma once

#include <string>
#include <vector>

#include "io/checkpoint.h"
#include "models/qwen3/config.h"

namespace flowkv::qwen3 {

enum class GlobalW { kEmbedTokens, kNorm, kLmHead, kCount };
enum class LayerW {
  kInputNorm,
  kQProj,
  kKProj,
  kVProj,
  kOProj,
  kQNorm,
  kKNorm,
  kPostAttnNorm,
  kGateProj,
  kUpProj,
  kDownProj,
  kQBias,  // Qwen2 only (Config::attention_bias)
  kKBias,
  kVBias,
  kCount
};

// The decoder's keys start with `prefix`: "model." in Qwen3ForCausalLM, "model.language_model." in
// Qwen3VLForConditionalGeneration (the language side of Qwen-Image 2.1's encoder). lm_head.weight
// has no prefix in either.
inline constexpr const char* kPrefix = "model.";
std::string weight_name(GlobalW w, const std::string& prefix = kPrefix);
std::string weight_name(int64_t layer, LayerW w, const std::string& prefix = kPrefix);
Shape weight_shape(const Config& c, GlobalW w);
Shape weight_shape(const Config& c, LayerW w);
// Whether a layer of this config has the tensor: q_norm/k_norm with qk_norm, the q/k/v biases
// with attention_bias.
bool has_weight(const Config& c, LayerW w);

// Every tensor a checkpoint of this config holds (lm_head only when the embeddings are untied).
std::vector<ExpectedTensor> weight_table(const Config& c, const std::string& prefix = kPrefix);

// The tensors an encoder that computes hidden states up to index `last` (0: the embeddings,
// k: after k layers, num_hidden_layers: after the final norm) reads: the embeddings, layers
// [0, last), and the final norm only when last == num_hidden_layers. Never lm_head.
std::vector<ExpectedTensor> needed_table(const Config& c, int64_t last,
                                         const std::string& prefix = kPrefix);

int64_t parameter_count(const Config& c);

}  // namespace flowkv::qwen3
