#include "api/flux2_impl.h"
#include "api/shared.h"
#include "core/arena.h"
#include "flowkv/error.h"
#include "flowkv/klein_kv.h"
#include "pipeline/klein_kv.h"
#include "pipeline/request_limits.h"

namespace flowkv {

namespace {

pipeline::KleinKVRequest to_request(const Flux2Transformer& model, const DenoiseInputs& in,
                                    const DenoiseOptions& o) {
  const flux2::Config& c = model.impl().model.config();
  auto check3 = [](const Tensor& t, const char* what) {
    FLOWKV_CHECK(t.defined() && t.ndim() == 3 && t.dtype() == DType::kF32, what,
                 " must be an F32 [B, tokens, channels] tensor");
  };
  check3(in.text, "text");
  check3(in.noise, "noise");
  const int64_t b = in.noise.dim(0);
  FLOWKV_CHECK(in.noise.dim(1) == pipeline::grid_tokens(in.height, in.width, "the target grid"),
               "noise has ", in.noise.dim(1), " tokens for a ", in.height, "x", in.width, " grid");
  FLOWKV_CHECK(in.noise.dim(2) == c.in_channels, "noise has ", in.noise.dim(2),
               " channels; this model takes ", c.in_channels);
  FLOWKV_CHECK(in.text.dim(0) == b && in.text.dim(2) == c.joint_attention_dim, "text is ",
               shape_str(in.text.shape()), "; expected [", b, ", L, ", c.joint_attention_dim, "]");
  pipeline::KleinKVRequest r;
  r.batch = b;
  r.text = in.text.f32();
  r.text_tokens = in.text.dim(1);
  r.noise = in.noise.f32();
  r.height = in.height;
  r.width = in.width;
  for (size_t i = 0; i < in.references.size(); ++i) {
    const ReferenceLatents& ref = in.references[i];
    check3(ref.latents, "reference latents");
    FLOWKV_CHECK(ref.latents.dim(0) == b &&
                     ref.latents.dim(1) ==
                         pipeline::grid_tokens(ref.height, ref.width, "a reference grid") &&
                     ref.latents.dim(2) == c.in_channels,
                 "reference ", i + 1, " is ", shape_str(ref.latents.shape()), "; expected [", b,
                 ", ", ref.height, "*", ref.width, ", ", c.in_channels, "]");
    r.refs.push_back({ref.latents.f32(), ref.height, ref.width});
  }
  r.steps = o.steps;
  r.mode = o.mode == KVMode::kCached ? pipeline::RefMode::kCached : pipeline::RefMode::kRecompute;
  r.cache_text = o.cache_text;
  r.text_kv_approx = o.text_kv_approx;
  r.kv_budget_bytes = o.kv_budget_bytes;
  r.on_step = o.on_step;
  r.step_caches = o.step_caches;
  return r;
}

}  // namespace

DenoiseResult denoise_klein_kv(const Flux2Transformer& model, const DenoiseInputs& in,
                               const DenoiseOptions& opts, Workspace* ws) {
  const pipeline::KleinKVRequest r = to_request(model, in, opts);
  Workspace local;
  Arena& arena = (ws ? *ws : local).arena();
  const pipeline::KleinKVResult res = pipeline::run_klein_kv({&arena}, model.impl().model, r);
  DenoiseResult out = api::denoise_result(res, in.noise.shape());
  out.approximate = res.plan.approximate;
  return out;
}

int64_t kv_bytes_needed(const Flux2Transformer& model, const DenoiseInputs& in,
                        const DenoiseOptions& opts) {
  return pipeline::planned_kv_bytes(model.impl().model, to_request(model, in, opts));
}

}  // namespace flowkv
