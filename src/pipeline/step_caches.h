// The step-cache policies of one request, as pipelines drive them: created fresh from the
// request's specs (so no state outlives or crosses requests), told where each model call sits,
// and summarised at the end.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "cache/policy.h"
#include "flowkv/step_cache.h"

namespace flowkv::pipeline {

class StepCaches {
 public:
  StepCaches(const std::vector<std::string>& specs, const cache::Topology& topology);
  bool active() const { return !policy_.empty(); }
  // Sets the step for the next model call; returns the hooks the model should call (nullptr
  // when no policy is active).
  cache::BlockHooks* at(const cache::StepContext& ctx);
  cache::Policy& policy() { return policy_; }
  std::vector<StepCacheStats> stats() const;

 private:
  cache::Composite policy_;
};

}  // namespace flowkv::pipeline
