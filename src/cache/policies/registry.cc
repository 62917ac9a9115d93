// The built-in policies: one line each. A new policy is a new file in this folder, one line
// here, its tests and its entry in docs/caches.md; no model, pipeline or enum changes.
#include "cache/policy.h"

namespace flowkv::cache {

#define FLOWKV_POLICY(name) void register_##name();
#include "cache/policies/list.inc"
#undef FLOWKV_POLICY

void register_builtin_policies() {
#define FLOWKV_POLICY(name) register_##name();
#include "cache/policies/list.inc"
#undef FLOWKV_POLICY
}

}  // namespace flowkv::cache
