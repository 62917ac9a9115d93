#include "segments/layout.h"

#include "flowkv/error.h"

namespace flowkv {

int TokenLayout::index_of(SegmentKind kind) const {
  for (size_t i = 0; i < segments.size(); ++i) {
    if (segments[i].kind == kind) return static_cast<int>(i);
  }
  return -1;
}

int64_t TokenLayout::tokens() const {
  int64_t n = 0;
  for (const Segment& s : segments) n += s.tokens;
  return n;
}

Cacheability check_cacheable(const TokenLayout& l) {
  const size_t n = l.segments.size();
  Cacheability c;
  c.cacheable.assign(n, false);
  c.broken.assign(n, {});
  for (size_t i = 0; i < n; ++i) {
    const Segment& s = l.segments[i];
    c.cacheable[i] = s.constant_input && s.fixed_time;
    if (!s.constant_input) c.broken[i].push_back("its input changes at every step (rule 1)");
    if (!s.fixed_time) {
      c.broken[i].push_back("it is modulated by the current timestep, not a fixed one (rule 2)");
    }
  }
  // Rule 3 as a fixed point: drop any candidate that reads a segment that is not cacheable.
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t i = 0; i < n; ++i) {
      if (!c.cacheable[i]) continue;
      for (int r : l.segments[i].reads) {
        if (!c.cacheable[static_cast<size_t>(r)]) {
          c.cacheable[i] = false;
          changed = true;
          break;
        }
      }
    }
  }
  for (size_t i = 0; i < n; ++i) {
    for (int r : l.segments[i].reads) {
      if (!c.cacheable[static_cast<size_t>(r)]) {
        c.broken[i].push_back("it attends to '" + l.segments[static_cast<size_t>(r)].name +
                              "', which is not cacheable (rule 3)");
      }
    }
  }
  return c;
}

CachePlan plan_cache(const TokenLayout& l, bool cache_exact, bool text_kv_approx,
                     const std::vector<int>& also_require) {
  const Cacheability c = check_cacheable(l);
  CachePlan p;
  p.cached.assign(l.segments.size(), false);
  for (int i : also_require) {
    if (c.cacheable[static_cast<size_t>(i)]) continue;
    std::string why;
    for (const std::string& b : c.broken[static_cast<size_t>(i)]) why += "\n  - " + b;
    fail("cannot cache '", l.segments[static_cast<size_t>(i)].name, "' exactly:", why,
         "\nIts K/V would change between steps. To reuse its step-0 K/V anyway, ask for the "
         "named approximation '",
         kTextKvApprox, "'.");
  }
  if (cache_exact) {
    for (size_t i = 0; i < l.segments.size(); ++i) p.cached[i] = c.cacheable[i];
  }
  if (text_kv_approx) {
    const int t = l.index_of(SegmentKind::kText);
    FLOWKV_CHECK(t >= 0, "text-kv-approx: this layout has no text segment");
    p.cached[static_cast<size_t>(t)] = true;
    p.approximate = !c.cacheable[static_cast<size_t>(t)];
  }
  return p;
}

}  // namespace flowkv
