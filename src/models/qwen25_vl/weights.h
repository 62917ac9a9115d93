// Qwen2.5-VL language-model weight names: the qwen3 table (models/qwen3/weights.h) in its Qwen2
// form (q/k/v biases, no q/k norms) under one of the two key layouts in circulation.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "io/checkpoint.h"
#include "models/qwen25_vl/config.h"

namespace flowkv::qwen25_vl {

enum class Layout {
  // model.layers.N.*, model.embed_tokens, model.norm (visual.*, lm_head beside them): what
  // transformers 4.x saved (the released Qwen-Image text_encoder/) and 5.24's save_pretrained
  // still writes (it reverts its load-time renaming).
  kModel,
  // model.language_model.layers.N.* etc. (model.visual.* beside them): the module names, which
  // transformers 5.24's loader maps the other layout to.
  kLanguageModel,
};

// "model." or "model.language_model.".
std::string text_prefix(Layout layout);

// The layout of a checkpoint's tensors: kLanguageModel when it holds
// model.language_model.embed_tokens.weight, else kModel.
Layout detect_layout(const std::map<std::string, TensorInfo>& tensors);

// The tensors of that layout that belong to the language model (the vision tower's and lm_head
// left out).
std::map<std::string, TensorInfo> text_tensors(const std::map<std::string, TensorInfo>& tensors,
                                               Layout layout);

// What the language model reads: the embeddings, every layer (with its q/k/v biases) and the
// final norm. lm_head is not needed (the prompt encoder takes hidden states).
std::vector<ExpectedTensor> text_weight_table(const Config& c, Layout layout = Layout::kModel);

}  // namespace flowkv::qwen25_vl
