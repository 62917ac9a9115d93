// A pipeline folder's scheduler/scheduler_config.json, read as diffusers 0.42.1's
// FlowMatchEulerDiscreteScheduler reads it (design.md: every config the folder carries is read,
// or refused by name).
#pragma once

#include <string>

#include "io/json.h"
#include "sched/flow_match.h"

namespace flowkv::sched {

// Every __init__ field of FlowMatchEulerDiscreteScheduler, missing or null ones taking the
// class defaults (FlowMatchConfig{}), plus the extra keys sigma_min / sigma_max that its sigma
// conversions read. Refused, with a flowkv::Error naming `path` and the field:
// stochastic_sampling true (a fresh noise draw at each step), more than one of
// use_karras_sigmas / use_exponential_sigmas / use_beta_sigmas, a time_shift_type other than
// "exponential" or "linear", a _class_name other than FlowMatchEulerDiscreteScheduler, values of
// the wrong type or out of range, and any other key not starting with "_" (diffusers would warn
// and ignore it; use_flow_sigmas in particular changes the Klein pipelines' sigmas).
FlowMatchConfig scheduler_config_from_json(const Json& j, const std::string& path);

// scheduler_dir/scheduler_config.json, read and checked as above.
FlowMatchConfig read_scheduler_config(const std::string& scheduler_dir);

}  // namespace flowkv::sched
