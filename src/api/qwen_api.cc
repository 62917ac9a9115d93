#include "flowkv/qwen_image.h"

#include "families/flux2/impl.h"
#include "families/qwen21/impl.h"
#include "flowkv/error.h"
#include "models/qwen_image/builtin.h"

namespace flowkv {

namespace {

qwen::LoadOptions21 options21(const std::string& dtype) {
  const flux2::LoadOptions f = parse_dtype_option(dtype);
  qwen::LoadOptions21 o;
  o.auto_dtype = f.auto_dtype;
  o.compute = f.compute;
  o.int8 = f.int8;
  return o;
}

std::string describe(const qwen::Config21& c) {
  return "Qwen-Image-2.1 (" + std::to_string(c.num_layers) + " blocks, width " +
         std::to_string(c.dim()) +
         (c.causal_condition ? ", causal_condition" : ", no causal_condition") + ")";
}

}  // namespace

QwenImage21Transformer QwenImage21Transformer::load(const std::string& path,
                                                    const std::string& dtype) {
  auto impl = std::make_shared<Impl>();
  const qwen::LoadOptions21 o = options21(dtype);
  impl->model = qwen::Model21::load(path, o);
  impl->int8 = o.int8;
  impl->variant = describe(impl->model.config());
  QwenImage21Transformer t;
  t.impl_ = std::move(impl);
  return t;
}

QwenImage21Transformer QwenImage21Transformer::builtin(const std::string& name, uint64_t seed,
                                                       const std::string& dtype) {
  qwen::Config21 c;
  FLOWKV_CHECK(qwen::builtin_config21(name, &c), "no built-in Qwen-Image-2.1 model '", name,
               "' (choose qwen21-tiny or qwen21-small)");
  const qwen::LoadOptions21 o = options21(dtype);
  const DType store = !o.auto_dtype && o.compute == DType::kBF16 ? DType::kBF16 : DType::kF32;
  auto impl = std::make_shared<Impl>();
  impl->model = qwen::Model21::from_tensors(qwen::random_weights21(c, seed, store), c, o);
  impl->int8 = o.int8;
  impl->variant = "built-in '" + name + "' (" + describe(c) + ", random weights)";
  QwenImage21Transformer t;
  t.impl_ = std::move(impl);
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
  return impl_->int8 ? "INT8" : std::string(dtype_name(impl_->model.compute_dtype()));
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

}  // namespace flowkv
