// QwenImage21Transformer::forward: one forward of Qwen-Image-2.1 from tensors, symmetrical with
// Flux2Transformer::forward. Every shape is checked here, where the tensors enter, with a
// flowkv::Error naming the field.
#include <string>
#include <utility>

#include "families/forward_run.h"
#include "core/arena.h"
#include "core/checked.h"
#include "families/qwen21/cost.h"
#include "families/qwen21/impl.h"
#include "flowkv/error.h"
#include "flowkv/qwen_image.h"
#include "pipeline/request_limits.h"

namespace flowkv {

namespace {

void need(const Tensor& t, int ndim, const std::string& what) {
  FLOWKV_CHECK(t.defined() && t.ndim() == ndim && t.dtype() == DType::kF32, what,
               " must be an F32 ", ndim, "-D tensor",
               t.defined() ? ", got " + shape_str(t.shape()) : "");
}

// The call's shapes against the model; returns the batch.
int64_t check_call(const Qwen21Call& call, const qwen::Config21& c) {
  need(call.img, 3, "img");
  need(call.txt, 3, "txt");
  need(call.timestep, 1, "timestep");
  const int64_t b = call.img.dim(0), l = call.txt.dim(1);
  const int64_t n = pipeline::grid_tokens(call.height, call.width, "the target grid");
  FLOWKV_CHECK(call.img.dim(1) == n && call.img.dim(2) == c.in_channels, "img is ",
               shape_str(call.img.shape()), "; expected [B, ", call.height, "*", call.width, ", ",
               c.in_channels, "]");
  FLOWKV_CHECK(call.txt.dim(0) == b && call.txt.dim(2) == c.context_in_dim, "txt is ",
               shape_str(call.txt.shape()), "; expected [", b, ", L, ", c.context_in_dim, "]");
  FLOWKV_CHECK(call.txt_slots.empty() || static_cast<int64_t>(call.txt_slots.size()) == l,
               "txt_slots has ", call.txt_slots.size(), " entries for ", l, " txt rows");
  if (call.txt_mask.defined()) {
    FLOWKV_CHECK(
        call.txt_mask.ndim() == 2 && call.txt_mask.dim(0) == b && call.txt_mask.dim(1) == l,
        "txt_mask is ", shape_str(call.txt_mask.shape()), "; expected [", b, ", ", l, "]");
  }
  for (size_t i = 0; i < call.conditions.size(); ++i) {
    const ReferenceLatents& cond = call.conditions[i];
    const std::string what = "conditions[" + std::to_string(i) + "]";
    need(cond.latents, 3, what);
    const int64_t tokens = pipeline::grid_tokens(cond.height, cond.width, what + "'s grid");
    FLOWKV_CHECK(cond.latents.dim(0) == b && cond.latents.dim(1) == tokens &&
                     cond.latents.dim(2) == c.in_channels,
                 what, " is ", shape_str(cond.latents.shape()), "; expected [", b, ", ",
                 cond.height, "*", cond.width, ", ", c.in_channels, "]");
  }
  FLOWKV_CHECK(call.timestep.dim(0) == b, "timestep has ", call.timestep.dim(0),
               " values for a batch of ", b);
  return b;
}

// The sequence as segments: [text, conditions..., target], the prefix computed (no cache).
qwen::Args21 args_of(const Qwen21Call& call, const qwen::Model21& m,
                     const std::vector<uint8_t>& valid) {
  qwen::Args21 a;
  a.batch = call.img.dim(0);
  const SegmentTime prefix_time = m.prefix_time();
  a.segments.push_back({.kind = SegmentKind::kText,
                        .name = "text",
                        .rows = call.txt.f32(),
                        .tokens = call.txt.dim(1),
                        .slots = call.txt_slots.empty() ? nullptr : call.txt_slots.data(),
                        .valid = valid.empty() ? nullptr : valid.data(),
                        .time = prefix_time});
  for (size_t i = 0; i < call.conditions.size(); ++i) {
    const ReferenceLatents& cond = call.conditions[i];
    a.segments.push_back({.kind = SegmentKind::kReference,
                          .name = "condition " + std::to_string(i + 1),
                          .rows = cond.latents.f32(),
                          .tokens = cond.latents.dim(1),
                          .grid = {cond.height, cond.width},
                          .time = prefix_time});
  }
  a.segments.push_back({.kind = SegmentKind::kTarget,
                        .name = "target",
                        .rows = call.img.f32(),
                        .tokens = call.img.dim(1),
                        .grid = {call.height, call.width}});
  a.timestep = call.timestep.f32();
  return a;
}

}  // namespace

Tensor QwenImage21Transformer::forward(const Qwen21Call& call, ForwardProfile* profile,
                                       Workspace* ws) const {
  const qwen::Model21& m = impl_->model;
  const qwen::Config21& c = m.config();
  const int64_t b = check_call(call, c);
  std::vector<int64_t> images;
  for (const ReferenceLatents& cond : call.conditions) images.push_back(cond.latents.dim(1));
  pipeline::RequestSize size{
      .batch = b,
      .images = static_cast<int64_t>(images.size()),
      // Each slot row stands for 4 tokens: the text rows bound the sequence from below.
      .tokens = pipeline::sum_tokens(call.txt.dim(1), images, call.img.dim(1))};
  pipeline::check_request_limits(size);
  pipeline::check_request_memory(qwen::cost_shape(c, 2), size);
  std::vector<uint8_t> valid;
  if (call.txt_mask.defined()) {
    const Tensor f = call.txt_mask.to_f32();
    for (int64_t i = 0; i < f.numel(); ++i) valid.push_back(f.f32()[i] != 0);
  }
  Tensor out = Tensor::empty({b, call.img.dim(1), c.out_features()});
  qwen::Args21 a = args_of(call, m, valid);
  a.out = out.f32();
  families::ForwardRun run(ws, call.check_finite, profile);
  run.input("img", call.img);
  run.input("txt", call.txt);
  run.input("timestep", call.timestep);
  for (size_t i = 0; i < call.conditions.size(); ++i)
    run.input("conditions[" + std::to_string(i) + "]", call.conditions[i].latents);
  m.forward(run.context(), a);
  run.finish(out);
  return out;
}

}  // namespace flowkv
