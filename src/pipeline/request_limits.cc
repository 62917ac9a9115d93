#include "pipeline/request_limits.h"

#include <sstream>

#include "core/checked.h"
#include "core/memory.h"
#include "flowkv/error.h"
#include "flowkv/limits.h"

namespace flowkv::pipeline {

int64_t grid_tokens(int64_t h, int64_t w, std::string_view what) {
  FLOWKV_CHECK(h > 0 && w > 0, what, ": the grid ", h, "x", w, " must be positive");
  const int64_t n = checked_mul(h, w, what);
  FLOWKV_CHECK(n <= limits::kMaxTokens, what, ": ", h, "x", w, " = ", n,
               " tokens is more than the limit of ", limits::kMaxTokens);
  return n;
}

int64_t sum_tokens(int64_t text, const std::vector<int64_t>& images, int64_t target) {
  FLOWKV_CHECK(text >= 0 && target >= 0, "token counts cannot be negative");
  int64_t n = checked_add(text, target, "sequence tokens");
  for (int64_t t : images) {
    FLOWKV_CHECK(t >= 0, "token counts cannot be negative");
    n = checked_add(n, t, "sequence tokens");
  }
  return n;
}

void check_request_limits(const RequestSize& r) {
  FLOWKV_CHECK(r.batch >= 1 && r.batch <= 1024, "denoise: batch ", r.batch,
               " must be in [1, 1024]");
  FLOWKV_CHECK(r.steps >= 1 && r.steps <= limits::kMaxSteps, "denoise: ", r.steps,
               " steps; give between 1 and ", limits::kMaxSteps);
  FLOWKV_CHECK(r.images >= 0 && r.images <= limits::kMaxReferences, "denoise: ", r.images,
               " reference or condition images; at most ", limits::kMaxReferences);
  FLOWKV_CHECK(r.tokens >= 1 && r.tokens <= limits::kMaxTokens, "denoise: the sequence has ",
               r.tokens, " tokens; at most ", limits::kMaxTokens);
}

void check_request_memory(const cost::ModelShape& model, const RequestSize& r) {
  const int64_t activations = cost::activation_bytes(model, r.batch, r.tokens);
  check_memory(checked_add(r.kv_bytes, activations, "request memory"),
               "this request (KV caches and activations)",
               "use fewer or smaller images, a smaller size, or free memory");
}

void check_kv_budget(int64_t need, int64_t budget, std::string_view what, std::string_view advice) {
  if (budget < 0 || need <= budget) return;
  std::ostringstream m;
  m << what << " needs " << need << " bytes (" << static_cast<double>(need) / (1 << 30)
    << " GiB) but the KV budget (kv_budget_bytes) is " << budget << " bytes ("
    << static_cast<double>(budget) / (1 << 30) << " GiB); raise the budget, " << advice;
  throw KVBudgetError(m.str(), need, budget);
}

}  // namespace flowkv::pipeline
