#include "cache/policy.h"
#include "families/family.h"
#include "flowkv/limits.h"
#include "flowkv/model.h"
#include "flowkv/step_cache.h"

namespace flowkv {

std::vector<StepCachePolicy> step_cache_policies() {
  std::vector<StepCachePolicy> out;
  for (const cache::PolicyInfo& p : cache::registered_policies())
    out.push_back({p.name, p.summary});
  return out;
}

void check_step_caches(const std::vector<std::string>& specs) {
  // No model: knobs only. As many blocks as any model may have, so that block counts are only
  // refused when no model could take them (the request checks them against its model).
  cache::Topology t;
  t.blocks.resize(static_cast<size_t>(limits::kMaxBlocks));
  t.model_known = false;
  cache::make_policies(specs, t);
}

void check_step_caches(const std::vector<std::string>& specs, const Model& model) {
  cache::make_policies(specs, model.impl().model->topology());
}

}  // namespace flowkv
