#include "pipeline/step_caches.h"

namespace flowkv::pipeline {

StepCaches::StepCaches(const std::vector<std::string>& specs, const cache::Topology& topology)
    : policy_(cache::make_policies(specs, topology)) {}

cache::BlockHooks* StepCaches::at(const cache::StepContext& ctx) {
  if (!active()) return nullptr;
  policy_.set_step(ctx);
  return &policy_;
}

std::vector<StepCacheStats> StepCaches::stats() const {
  std::vector<StepCacheStats> out;
  for (const auto& p : policy_.parts()) {
    const cache::PolicyStats& s = p->stats();
    out.push_back({p->name(), p->describe(), s.decisions, p->report(), p->measured(), s.blocks_run,
                   s.blocks_skipped, s.sublayers_computed, s.sublayers_reused, s.calls_full,
                   s.calls_skipped, s.branches_skipped});
  }
  return out;
}

}  // namespace flowkv::pipeline
