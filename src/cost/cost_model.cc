#include "cost/cost_model.h"

#include "core/checked.h"
#include "flowkv/error.h"

namespace flowkv::cost {

namespace {

// Pairs of segment i's queries with segment j's keys.
double pairs(const TokenLayout& l, size_t i, size_t j) {
  const double qi = double(l.segments[i].tokens), kj = double(l.segments[j].tokens);
  if (i == j && l.segments[i].causal) return qi * (qi + 1) / 2;
  return qi * kj;
}

}  // namespace

StepCost step_cost(const ModelShape& m, const TokenLayout& l, const std::vector<bool>& cached) {
  FLOWKV_CHECK(cached.size() == l.segments.size(), "cost: one cached flag per segment");
  StepCost s;
  const double per_token = m.linear_flops_per_token_layer() * double(m.layers);
  const double per_pair = 4.0 * double(m.width) * double(m.layers);
  for (size_t i = 0; i < l.segments.size(); ++i) {
    SegmentCost c;
    c.name = l.segments[i].name;
    c.tokens = l.segments[i].tokens;
    c.live = !cached[i];
    if (c.live && l.segments[i].keys_only) {
      c.linear = m.keys_only_flops * double(m.layers) * double(c.tokens);
    } else if (c.live) {
      c.linear = per_token * double(c.tokens);
      for (int j : l.segments[i].reads)
        c.attention += per_pair * pairs(l, i, static_cast<size_t>(j));
    }
    s.linear += c.linear;
    s.attention += c.attention;
    s.segments.push_back(c);
  }
  return s;
}

double predicted_speedup(double uncached_step, double cached_step, int steps) {
  FLOWKV_CHECK(steps >= 1, "steps must be at least 1");
  const double n = steps;
  return n * uncached_step / (uncached_step + (n - 1) * cached_step);
}

int64_t kv_payload_bytes(const ModelShape& m, int64_t cached_tokens, int branches) {
  return 2 * m.layers * cached_tokens * m.kv() * m.kv_bytes_per_element * branches;
}

}  // namespace flowkv::cost

namespace flowkv::cost {

int64_t activation_bytes(const ModelShape& m, int64_t batch, int64_t tokens) {
  const int64_t per_token =
      checked_add(checked_mul(8, m.width, "activation width"),
                  checked_mul(3, m.mlp_hidden, "activation width"), "activation width");
  return checked_mul(
      checked_mul(checked_mul(batch, tokens, "activation rows"), per_token, "activation elements"),
      8, "activation bytes");
}

}  // namespace flowkv::cost
