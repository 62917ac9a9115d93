#include "models/qwen3/weights.h"

#include <iterator>

namespace flowkv::qwen3 {

namespace {

constexpr const char* kGlobalNames[] = {
    "embed_tokens.weight", "norm.weight",
    "lm_head.weight",  // never prefixed
};
constexpr const char* kLayerNames[] = {
    "input_layernorm.weight",  "self_attn.q_proj.weight",
    "self_attn.k_proj.weight", "self_attn.v_proj.weight",
    "self_attn.o_proj.weight", "self_attn.q_norm.weight",
    "self_attn.k_norm.weight", "post_attention_layernorm.weight",
    "mlp.gate_proj.weight",    "mlp.up_proj.weight",
    "mlp.down_proj.weight",    "self_attn.q_proj.bias",
    "self_attn.k_proj.bias",   "self_attn.v_proj.bias",
};
static_assert(std::size(kGlobalNames) == static_cast<size_t>(GlobalW::kCount));
static_assert(std::size(kLayerNames) == static_cast<size_t>(LayerW::kCount));

}  // namespace

std::string weight_name(GlobalW w, const std::string& prefix) {
  if (w == GlobalW::kLmHead) return kGlobalNames[static_cast<int>(w)];
  return prefix + kGlobalNames[static_cast<int>(w)];
}
std::string weight_name(int64_t layer, LayerW w, const std::string& prefix) {
  return prefix + "layers." + std::to_string(layer) + "." + kLayerNames[static_cast<int>(w)];
}

Shape weight_shape(const Config& c, GlobalW w) {
  switch (w) {
    case GlobalW::kEmbedTokens:
    case GlobalW::kLmHead:
      return {c.vocab_size, c.hidden_size};
    case GlobalW::kNorm:
      return {c.hidden_size};
    case GlobalW::kCount:
      break;
  }
  return {};
}

Shape weight_shape(const Config& c, LayerW w) {
  const int64_t h = c.hidden_size, f = c.intermediate_size;
  switch (w) {
    case LayerW::kInputNorm:
    case LayerW::kPostAttnNorm:
      return {h};
    case LayerW::kQNorm:
    case LayerW::kKNorm:
      return {c.head_dim};
    case LayerW::kQProj:
      return {c.q_width(), h};
    case LayerW::kKProj:
    case LayerW::kVProj:
      return {c.kv_width(), h};
    case LayerW::kOProj:
      return {h, c.q_width()};
    case LayerW::kGateProj:
    case LayerW::kUpProj:
      return {f, h};
    case LayerW::kDownProj:
      return {h, f};
    case LayerW::kQBias:
      return {c.q_width()};
    case LayerW::kKBias:
    case LayerW::kVBias:
      return {c.kv_width()};
    case LayerW::kCount:
      break;
  }
  return {};
}

bool has_weight(const Config& c, LayerW w) {
  switch (w) {
    case LayerW::kQNorm:
    case LayerW::kKNorm:
      return c.qk_norm;
    case LayerW::kQBias:
    case LayerW::kKBias:
    case LayerW::kVBias:
      return c.attention_bias;
    default:
      return true;
  }
}

std::vector<ExpectedTensor> weight_table(const Config& c, const std::string& prefix) {
  std::vector<ExpectedTensor> t = needed_table(c, c.num_hidden_layers, prefix);
  if (!c.tie_word_embeddings) {
    t.push_back({weight_name(GlobalW::kLmHead), weight_shape(c, GlobalW::kLmHead)});
  }
  return t;
}

std::vector<ExpectedTensor> needed_table(const Config& c, int64_t last, const std::string& prefix) {
  std::vector<ExpectedTensor> t;
  t.push_back({weight_name(GlobalW::kEmbedTokens, prefix), weight_shape(c, GlobalW::kEmbedTokens)});
  for (int64_t l = 0; l < last && l < c.num_hidden_layers; ++l) {
    for (int i = 0; i < static_cast<int>(LayerW::kCount); ++i) {
      const auto w = static_cast<LayerW>(i);
      if (!has_weight(c, w)) continue;
      t.push_back({weight_name(l, w, prefix), weight_shape(c, w)});
    }
  }
  if (last >= c.num_hidden_layers) {
    t.push_back({weight_name(GlobalW::kNorm, prefix), weight_shape(c, GlobalW::kNorm)});
  }
  return t;
}

int64_t parameter_count(const Config& c) {
  int64_t n = 0;
  for (const ExpectedTensor& e : weight_table(c)) n += shape_numel(e.shape);
  return n;
}

}  // namespace flowkv::qwen3
