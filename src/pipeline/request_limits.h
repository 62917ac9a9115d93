// A request's sizes against flowkv's limits (flowkv/limits.h), and its predicted memory (KV
// memories and activations, through the cost model) against the memory budget: checked before
// the request allocates anything.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "cost/cost_model.h"

namespace flowkv::pipeline {

// h x w tokens of a latent grid, each side positive; `what` names the grid in errors.
int64_t grid_tokens(int64_t h, int64_t w, std::string_view what);

// Tokens of a whole sequence: text, images, target (each >= 0), added without overflow.
int64_t sum_tokens(int64_t text, const std::vector<int64_t>& images, int64_t target);

struct RequestSize {
  int64_t batch = 1;  // sequences of one forward (CFG branches batched count twice)
  int64_t steps = 1;
  int64_t images = 0;    // reference or condition images
  int64_t tokens = 0;    // of the whole sequence (text, images, target)
  int64_t kv_bytes = 0;  // the request's KV memories together
};

// Counts against the limits (first: the sizes below are only computed within them).
void check_request_limits(const RequestSize& r);
// KV memories and activations against the memory budget.
void check_request_memory(const cost::ModelShape& model, const RequestSize& r);

// Throws KVBudgetError when `need` bytes of KV memory exceed `budget` (negative: no budget);
// `what` names the cache, `advice` what else helps. Names options, never command-line flags.
void check_kv_budget(int64_t need, int64_t budget, std::string_view what, std::string_view advice);

}  // namespace flowkv::pipeline
