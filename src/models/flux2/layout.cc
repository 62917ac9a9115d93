#include "models/flux2/layout.h"

namespace flowkv::flux2 {

TokenLayout klein_kv_layout(int64_t text_tokens, const std::vector<int64_t>& ref_tokens,
                            int64_t target_tokens, float ref_timestep) {
  TokenLayout l;
  const int k = static_cast<int>(ref_tokens.size());
  std::vector<int> all, refs;
  for (int i = 0; i < k + 2; ++i) all.push_back(i);
  for (int i = 0; i < k; ++i) refs.push_back(1 + i);
  l.segments.push_back({"text", SegmentKind::kText, text_tokens, true, false, 0, all});
  for (int i = 0; i < k; ++i) {
    l.segments.push_back({"ref " + std::to_string(i + 1), SegmentKind::kReference,
                          ref_tokens[static_cast<size_t>(i)], true, true, ref_timestep, refs});
  }
  l.segments.push_back({"target", SegmentKind::kTarget, target_tokens, false, false, 0, all});
  return l;
}

}  // namespace flowkv::flux2
