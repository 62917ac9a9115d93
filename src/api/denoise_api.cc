// denoise() and kv_bytes_needed() for every family: the family's adapter driven by the one loop
// (families/load_run.cc).
#include "families/family.h"
#include "flowkv/model.h"
#include "pipeline/denoise.h"

namespace flowkv {

DenoiseResult denoise(const Model& model, const DenoiseInputs& in, const DenoiseOptions& opts,
                      Workspace* ws) {
  return families::run_family_denoise(model.impl(), in, opts, std::nullopt, ws);
}

int64_t kv_bytes_needed(const Model& model, const DenoiseInputs& in, const DenoiseOptions& opts) {
  const DenoiseOptions o = families::resolve_steps(model.impl(), opts);
  return pipeline::planned_kv_bytes(*model.impl().model->adapter(in, o));
}

}  // namespace flowkv
