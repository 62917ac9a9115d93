#include "cache/policy.h"
#include "families/family.h"
#include "flowkv/error.h"
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

std::vector<StepCacheExpectation> expected_step_cache_work(const std::vector<std::string>& specs,
                                                           int steps, int branches) {
  FLOWKV_CHECK(steps >= 1, "a run of ", steps, " steps");
  cache::Topology t;
  t.blocks.resize(static_cast<size_t>(limits::kMaxBlocks));
  t.model_known = false;
  std::vector<StepCacheExpectation> out;
  const auto policies = cache::make_policies(specs, t);
  for (size_t i = 0; i < policies.size(); ++i) {
    StepCacheExpectation e;
    e.spec = specs[i];
    if (const auto w = policies[i]->expected(steps, branches)) {
      e.known = true;
      e.upper_bound = w->upper_bound;
      e.skipped_fraction = w->skipped_fraction;
      e.text = w->text;
      e.unit = w->unit;
    } else {
      e.text =
          "decided from the model's activations at run time (measure it: flowkv bench or "
          "showcase with --cache " +
          specs[i] + ")";
    }
    out.push_back(std::move(e));
  }
  return out;
}

void check_step_caches(const std::vector<std::string>& specs, const Model& model) {
  cache::make_policies(specs, model.impl().model->topology());
}

}  // namespace flowkv
