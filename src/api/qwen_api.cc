// The public QwenImage21Transformer: a thin handle over the Qwen-Image-2.1 family's transformer
// (families/qwen21/impl.h), which loads, builds and runs it.
#include "flowkv/qwen_image.h"

#include "families/qwen21/impl.h"
#include "models/qwen_image/builtin.h"

namespace flowkv {

QwenImage21Transformer QwenImage21Transformer::load(const std::string& path,
                                                    const std::string& dtype) {
  QwenImage21Transformer t;
  t.impl_ = families::load_qwen21(path, dtype);
  return t;
}

QwenImage21Transformer QwenImage21Transformer::builtin(const std::string& name, uint64_t seed,
                                                       const std::string& dtype) {
  QwenImage21Transformer t;
  t.impl_ = families::builtin_qwen21(name, seed, dtype);
  return t;
}

std::vector<std::string> QwenImage21Transformer::builtin_names() {
  return qwen::builtin_names21();
}
std::string QwenImage21Transformer::variant() const {
  return impl_->variant;
}
std::string QwenImage21Transformer::config_json() const {
  return impl_->model.config().to_json().dump(2);
}
std::string QwenImage21Transformer::compute_dtype() const {
  return families::qwen21_compute_dtype(*impl_);
}
int64_t QwenImage21Transformer::in_channels() const {
  return impl_->model.config().in_channels;
}
int64_t QwenImage21Transformer::text_channels() const {
  return impl_->model.config().context_in_dim;
}
bool QwenImage21Transformer::causal_condition() const {
  return impl_->model.config().causal_condition;
}

Tensor QwenImage21Transformer::forward(const Qwen21Call& call, ForwardProfile* profile,
                                       Workspace* ws) const {
  return families::qwen21_forward(*impl_, call, profile, ws);
}

// The handle converts to the family-neutral Model, sharing the loaded transformer: the alias
// keeps a copy of this handle (and so its Impl) alive as long as the family's model holds it.
Model::Model(const QwenImage21Transformer& m)
    : impl_(std::make_shared<Impl>(
          families::qwen21_loaded(std::shared_ptr<const QwenImage21Transformer::Impl>(
              std::make_shared<const QwenImage21Transformer>(m), &m.impl())))) {}

}  // namespace flowkv
