// Token layouts and the rules that make a K/V cache exact.
//
// A forward's sequence is a list of segments (text, reference images, target). Each declares
// whether its input is constant across denoising steps, which timestep modulates it, and which
// segments its queries read. A segment is cacheable exactly when (1) its input is constant,
// (2) it is modulated from a fixed timestep, and (3) every segment it reads is cacheable: then
// its K/V are the same at every step and layer, for any weights. The check derives this from the
// declared rules; nothing is assumed per model.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace flowkv {

enum class SegmentKind { kText, kReference, kTarget };

struct Segment {
  std::string name;  // "text", "ref 1", "target"
  SegmentKind kind = SegmentKind::kText;
  int64_t tokens = 0;
  bool constant_input = true;  // rule 1: the same input at every step
  bool fixed_time = false;     // rule 2: modulated from a fixed timestep
  float fixed_timestep = 0;    // that timestep, when fixed_time
  std::vector<int> reads;      // rule 3: segments its queries attend to (indices)
  bool causal = false;         // its queries see keys of its own segment causally (Qwen text)
  // It enters only as keys and values projected from its input (no queries, no MLP, no
  // modulation: NucleusMoE-Image's text); `reads` is then empty.
  bool keys_only = false;
};

struct TokenLayout {
  std::vector<Segment> segments;
  int index_of(SegmentKind kind) const;  // first segment of that kind, -1 if none
  int64_t tokens() const;
};

struct Cacheability {
  std::vector<bool> cacheable;                   // per segment
  std::vector<std::vector<std::string>> broken;  // per segment: the rules it breaks
};

Cacheability check_cacheable(const TokenLayout& layout);

// The one named approximation: reusing a non-cacheable segment's step-0 K/V anyway.
inline constexpr const char* kTextKvApprox = "text-kv-approx";

// Which segments a request caches. Exact caching of a segment that is not cacheable is refused
// with an Error naming every broken rule and the approximation that would allow it.
struct CachePlan {
  std::vector<bool> cached;  // per segment
  bool approximate = false;  // true when text-kv-approx is on
};
CachePlan plan_cache(const TokenLayout& layout, bool cache_exact, bool text_kv_approx,
                     const std::vector<int>& also_require = {});

}  // namespace flowkv
