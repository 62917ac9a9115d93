// The public Model and the family-neutral API, through the family registry.
#include "families/family.h"
#include "flowkv/error.h"
#include "flowkv/model.h"
#include "pipeline/identity.h"
#include "pipeline/request_limits.h"

namespace flowkv {

std::vector<FamilyInfo> registered_families() {
  std::vector<FamilyInfo> out;
  for (const families::Family& f : families::registry()) out.push_back(f.info);
  return out;
}

const FamilyInfo& family_info(const std::string& name) {
  return families::by_name(name).info;
}

const FamilyInfo& detect_family(const std::string& model) {
  return families::resolve(model).info;
}

void export_builtin(const std::string& name, uint64_t seed, const std::string& dtype,
                    const std::string& dir) {
  const families::Family& f = families::resolve(name);
  FLOWKV_CHECK(f.has_builtin(name), "no built-in model '", name, "'");
  FLOWKV_CHECK(f.write_builtin, "the ", f.info.title, " family cannot write its built-in models");
  f.write_builtin(name, seed, dtype, dir);
}

void export_zero_weights(const std::string& name, const std::string& dtype,
                         const std::string& dir) {
  // "SHAPE-pipeline": the whole pipeline folder of a released shape, where its family writes one.
  const std::string suffix = "-pipeline";
  const bool pipeline = name.size() > suffix.size() &&
                        name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
  const families::Family& f =
      families::resolve(pipeline ? name.substr(0, name.size() - suffix.size()) : name);
  FLOWKV_CHECK(f.write_zeros, "the ", f.info.title, " family cannot write zero-weight shapes");
  f.write_zeros(name, dtype, dir);
}

Model Model::load(const std::string& path, const std::string& dtype) {
  return Model(std::make_shared<Impl>(families::load_transformer(path, dtype)));
}

Model Model::builtin(const std::string& name, uint64_t seed, const std::string& dtype) {
  for (const families::Family& f : families::registry()) {
    if (f.has_builtin(name))
      return Model(std::make_shared<Impl>(
          Impl{&f, f.builtin(name, seed, dtype),
               "builtin " + name + " seed " + std::to_string(seed) + " " + dtype}));
  }
  std::string names;
  for (const families::Family& f : families::registry()) {
    for (const std::string& n : f.info.builtins) names += (names.empty() ? "" : ", ") + n;
  }
  fail("no built-in model '", name, "' (choose one of: ", names, ")");
}

const FamilyInfo& Model::family() const {
  return impl_->family->info;
}
std::string Model::variant() const {
  return impl_->model->variant();
}
std::string Model::config_json() const {
  return impl_->model->config_json();
}
std::string Model::compute_dtype() const {
  return impl_->model->compute_dtype();
}
int64_t Model::in_channels() const {
  return impl_->model->in_channels();
}
int64_t Model::text_channels() const {
  return impl_->model->text_channels();
}

Tensor forward(const Model& model, const DenoiseInputs& in, const ForwardOptions& opts,
               ForwardProfile* profile, Workspace* ws) {
  return model.impl().model->forward(in, opts, profile, ws);
}

DenoiseInputs example_inputs(const Model& model, const ExampleShape& shape) {
  // Within the limits before anything is allocated.
  std::vector<int64_t> images;
  for (const auto& [h, w] : shape.references)
    images.push_back(pipeline::grid_tokens(h, w, "a reference grid"));
  const int64_t target = pipeline::grid_tokens(shape.height, shape.width, "the target grid");
  pipeline::check_request_limits(
      {.batch = shape.batch,
       .images = static_cast<int64_t>(images.size()),
       .tokens = pipeline::sum_tokens(shape.text_tokens, images, target)});
  return model.impl().model->example_inputs(shape);
}

KVPrediction predict(const Model& model, int64_t text_tokens,
                     const std::vector<int64_t>& image_tokens, int64_t target_tokens, int steps,
                     bool cfg) {
  return model.impl().model->predict(text_tokens, image_tokens, target_tokens, steps, cfg);
}

}  // namespace flowkv
