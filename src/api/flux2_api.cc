#include <cstring>

#include "families/forward_run.h"
#include "core/arena.h"
#include "core/checked.h"
#include "families/flux2/cost.h"
#include "families/flux2/impl.h"
#include "flowkv/error.h"
#include "io/checkpoint.h"
#include "models/flux2/builtin.h"
#include "pipeline/request_limits.h"

namespace flowkv {

namespace {
flux2::Config builtin_or_fail(const std::string& name) {
  flux2::Config c;
  if (!flux2::builtin_config(name, &c)) {
    std::string names;
    for (const auto& n : flux2::builtin_names()) names += (names.empty() ? "" : ", ") + n;
    fail("no built-in model '", name, "' (choose one of: ", names, ")");
  }
  return c;
}
}  // namespace

Flux2Transformer Flux2Transformer::load(const std::string& path, const Flux2LoadOptions& opts) {
  auto impl = std::make_shared<Impl>();
  const flux2::LoadOptions o = parse_dtype_option(opts.dtype);
  impl->model = flux2::Model::load(path, o);
  impl->int8 = o.int8;
  impl->variant = flux2::variant_name(impl->model.config());
  Flux2Transformer t;
  t.impl_ = std::move(impl);
  return t;
}

Flux2Transformer Flux2Transformer::builtin(const std::string& name, uint64_t seed,
                                           const std::string& dtype) {
  const flux2::Config c = builtin_or_fail(name);
  const flux2::LoadOptions o = parse_dtype_option(dtype);
  const DType store = !o.auto_dtype && o.compute == DType::kBF16 ? DType::kBF16 : DType::kF32;
  const flux2::WeightSource src(flux2::random_weights(c, seed, store));
  auto impl = std::make_shared<Impl>();
  impl->model = flux2::Model::from_source(src, c, o);
  impl->int8 = o.int8;
  impl->variant = "built-in '" + name + "' (" + flux2::variant_name(c) + ", random weights)";
  Flux2Transformer t;
  t.impl_ = std::move(impl);
  return t;
}

std::vector<std::string> Flux2Transformer::builtin_names() {
  return flux2::builtin_names();
}

void Flux2Transformer::write_builtin(const std::string& name, uint64_t seed,
                                     const std::string& dtype, const std::string& dir) {
  const flux2::Config c = builtin_or_fail(name);
  const DType store = parse_dtype_option(dtype).compute;
  const auto weights = flux2::random_weights(c, seed, store);
  std::vector<TensorToWrite> list;
  for (const ExpectedTensor& e : flux2::weight_table(c)) {
    const Tensor& t = weights.at(e.name);
    list.push_back({e.name, t.dtype(), t.shape(), t.raw()});
  }
  write_diffusers_folder(dir, c.to_json(), list);
}

std::string Flux2Transformer::variant() const {
  return impl_->variant;
}
std::string Flux2Transformer::config_json() const {
  return impl_->model.config().to_json().dump(2);
}
std::string Flux2Transformer::compute_dtype() const {
  return impl_->int8 ? "INT8" : std::string(dtype_name(impl_->model.compute_dtype()));
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
  const flux2::Config& c = impl_->model.config();
  auto need = [](const Tensor& t, int ndim, const char* what) {
    FLOWKV_CHECK(t.defined() && t.ndim() == ndim && t.dtype() == DType::kF32, what,
                 " must be an F32 ", ndim, "-D tensor",
                 t.defined() ? ", got " + shape_str(t.shape()) : "");
  };
  need(call.img, 3, "img");
  need(call.txt, 3, "txt");
  need(call.img_ids, 2, "img_ids");
  need(call.txt_ids, 2, "txt_ids");
  need(call.timestep, 1, "timestep");
  const int64_t b = call.img.dim(0), n = call.img.dim(1), l = call.txt.dim(1);
  FLOWKV_CHECK(call.img.dim(2) == c.in_channels, "img has ", call.img.dim(2),
               " channels per token; this model takes ", c.in_channels);
  FLOWKV_CHECK(call.txt.dim(0) == b && call.txt.dim(2) == c.joint_attention_dim, "txt is ",
               shape_str(call.txt.shape()), "; expected [", b, ", L, ", c.joint_attention_dim, "]");
  FLOWKV_CHECK(call.img_ids.dim(0) == n && call.img_ids.dim(1) == 4, "img_ids is ",
               shape_str(call.img_ids.shape()), "; expected [", n, ", 4]");
  FLOWKV_CHECK(call.txt_ids.dim(0) == l && call.txt_ids.dim(1) == 4, "txt_ids is ",
               shape_str(call.txt_ids.shape()), "; expected [", l, ", 4]");
  FLOWKV_CHECK(call.timestep.dim(0) == b, "timestep has ", call.timestep.dim(0),
               " values for a batch of ", b);
  if (call.guidance.defined()) {
    need(call.guidance, 1, "guidance");
    FLOWKV_CHECK(call.guidance.dim(0) == b, "guidance needs one value per batch element");
  }
  pipeline::RequestSize size{.batch = b, .tokens = checked_add(n, l, "forward tokens")};
  pipeline::check_request_limits(size);
  pipeline::check_request_memory(flux2::cost_shape(c, 2), size);
  Tensor out = Tensor::empty({b, n, c.out_features()});
  flux2::ForwardArgs a;
  a.batch = b;
  a.segments = {
      {.kind = SegmentKind::kText,
       .name = "text",
       .rows = call.txt.f32(),
       .tokens = l,
       .ids = call.txt_ids.f32()},
      {.kind = SegmentKind::kTarget,
       .name = "target",
       .rows = call.img.f32(),
       .tokens = n,
       .ids = call.img_ids.f32()},
  };
  a.timestep = call.timestep.f32();
  a.guidance = call.guidance.defined() ? call.guidance.f32() : nullptr;
  a.out = out.f32();
  families::ForwardRun run(ws, call.check_finite, profile);
  for (const auto& [t, name] : {std::pair{&call.img, "img"},
                                {&call.txt, "txt"},
                                {&call.timestep, "timestep"},
                                {&call.guidance, "guidance"}}) {
    run.input(name, *t);
  }
  impl_->model.forward(run.context(), a);
  run.finish(out);
  return out;
}

}  // namespace flowkv
