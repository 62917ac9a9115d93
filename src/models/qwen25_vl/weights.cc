#include "models/qwen25_vl/weights.h"

#include "models/qwen3/weights.h"

namespace flowkv::qwen25_vl {

std::string text_prefix(Layout layout) {
  return layout == Layout::kLanguageModel ? "model.language_model." : "model.";
}

Layout detect_layout(const std::map<std::string, TensorInfo>& tensors) {
  const std::string embed =
      qwen3::weight_name(qwen3::GlobalW::kEmbedTokens, text_prefix(Layout::kLanguageModel));
  return tensors.count(embed) ? Layout::kLanguageModel : Layout::kModel;
}

std::map<std::string, TensorInfo> text_tensors(const std::map<std::string, TensorInfo>& tensors,
                                               Layout layout) {
  const std::string prefix = text_prefix(layout);
  std::map<std::string, TensorInfo> out;
  for (const auto& [name, info] : tensors) {
    if (!name.starts_with(prefix)) continue;
    // "model." also begins the names of the other layout (model.visual.*, and text weights a
    // detection did not pick): they are not this layout's text weights.
    if (layout == Layout::kModel &&
        (name.starts_with("model.visual.") || name.starts_with("model.language_model."))) {
      continue;
    }
    out.emplace(name, info);
  }
  return out;
}

std::vector<ExpectedTensor> text_weight_table(const Config& c, Layout layout) {
  return qwen3::needed_table(c.text, c.text.num_hidden_layers, text_prefix(layout));
}

}  // namespace flowkv::qwen25_vl
