// The typed public handles, Flux2Transformer (flowkv/flux2.h) and QwenImage21Transformer
// (flowkv/qwen_image.h): thin facades over their families' transformers
// (families/flux2/impl.h, families/qwen21/impl.h), which load, build, write and run them.
// Each converts to the family-neutral Model, sharing the loaded transformer: the alias keeps a
// copy of the handle (and so its Impl) alive as long as the family's model holds it.
#include "families/flux2/impl.h"
#include "families/qwen21/impl.h"
#include "flowkv/flux2.h"
#include "flowkv/qwen_image.h"
#include "models/flux2/builtin.h"
#include "models/flux2/weights.h"
#include "models/qwen_image/builtin.h"

namespace flowkv {

Flux2Transformer Flux2Transformer::load(const std::string& path, const Flux2LoadOptions& opts) {
  Flux2Transformer t;
  t.impl_ = families::load_flux2(path, opts.dtype);
  return t;
}

Flux2Transformer Flux2Transformer::builtin(const std::string& name, uint64_t seed,
                                           const std::string& dtype) {
  Flux2Transformer t;
  t.impl_ = families::builtin_flux2(name, seed, dtype);
  return t;
}

std::vector<std::string> Flux2Transformer::builtin_names() {
  return flux2::builtin_names();
}

void Flux2Transformer::write_builtin(const std::string& name, uint64_t seed,
                                     const std::string& dtype, const std::string& dir) {
  families::write_flux2_builtin(name, seed, dtype, dir);
}

std::string Flux2Transformer::variant() const {
  return impl_->variant;
}
std::string Flux2Transformer::config_json() const {
  return impl_->model.config().to_json().dump(2);
}
std::string Flux2Transformer::compute_dtype() const {
  return families::flux2_compute_dtype(*impl_);
}
int64_t Flux2Transformer::parameters() const {
  return flux2::parameter_count(impl_->model.config());
}
int64_t Flux2Transformer::in_channels() const {
  return impl_->model.config().in_channels;
}
int64_t Flux2Transformer::text_channels() const {
  return impl_->model.config().joint_attention_dim;
}
int64_t Flux2Transformer::out_channels() const {
  return impl_->model.config().out_features();
}
int64_t Flux2Transformer::width() const {
  return impl_->model.config().dim();
}
int64_t Flux2Transformer::layers() const {
  return impl_->model.config().num_blocks();
}

Tensor Flux2Transformer::forward(const Flux2Call& call, ForwardProfile* profile,
                                 Workspace* ws) const {
  return families::flux2_forward(*impl_, call, profile, ws);
}

Model::Model(const Flux2Transformer& m)
    : impl_(std::make_shared<Impl>(
          families::flux2_loaded(std::shared_ptr<const Flux2Transformer::Impl>(
              std::make_shared<const Flux2Transformer>(m), &m.impl())))) {}

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

Model::Model(const QwenImage21Transformer& m)
    : impl_(std::make_shared<Impl>(
          families::qwen21_loaded(std::shared_ptr<const QwenImage21Transformer::Impl>(
              std::make_shared<const QwenImage21Transformer>(m), &m.impl())))) {}

}  // namespace flowkv
