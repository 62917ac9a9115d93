#include "cache/policy.h"
#include "flowkv/step_cache.h"

namespace flowkv {

std::vector<StepCachePolicy> step_cache_policies() {
  std::vector<StepCachePolicy> out;
  for (const cache::PolicyInfo& p : cache::registered_policies())
    out.push_back({p.name, p.summary});
  return out;
}

void check_step_caches(const std::vector<std::string>& specs) {
  cache::Topology t;
  t.model = "flux2";
  t.blocks.resize(1024);
  cache::make_policies(specs, t);
}

}  // namespace flowkv
