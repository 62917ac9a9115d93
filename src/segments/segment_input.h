// One segment of a model call's sequence, as data (design.md, "Segments are data"): its kind,
// tokens and inputs, the timestep that modulates it, and how its keys and values travel this
// call. Every family's forward takes a list of these; a new kind of conditioning is a new
// segment, not new fields through every layer. Which fields a family reads, and which routes
// it allows per kind, is documented by that family's forward arguments.
#pragma once

#include <cstdint>
#include <string>

#include "segments/layout.h"

namespace flowkv {

class KVMemory;  // cache/kv_memory.h: only pointed to here

// How a segment's keys and values travel one call.
enum class KVRoute {
  kCompute,          // computed live, read by this call only
  kComputeAndStore,  // computed live and stored into `store` (the prefill call)
  kSplice,           // not computed: its post-RoPE K/V are read from `memory`
};

struct SegmentKV {
  KVRoute route = KVRoute::kCompute;
  KVMemory* store = nullptr;         // kComputeAndStore
  const KVMemory* memory = nullptr;  // kSplice
};

// The route of a segment over a denoising loop: a cached segment is computed and stored into
// `memory` until it holds every layer (the first step), and spliced from it after that (later
// steps; every step when the memory came filled from the reference store); the others are
// computed every step.
inline SegmentKV loop_route(bool cached, bool stored, KVMemory* memory) {
  if (!cached) return {};
  if (!stored) return {.route = KVRoute::kComputeAndStore, .store = memory};
  return {.route = KVRoute::kSplice, .memory = memory};
}

// A latent image grid in tokens (after patchification).
struct ImageGrid {
  int64_t h = 0, w = 0;
  int64_t tokens() const { return h * w; }
};

// Which timestep modulates a segment: the call's (the step's), or a fixed one (cache rule 2).
struct SegmentTime {
  bool fixed = false;
  float timestep = 0;  // in [0, 1], when fixed
};

struct SegmentInput {
  SegmentKind kind = SegmentKind::kTarget;
  std::string name{};  // "text", "ref 1", "condition 2", "target": error messages name it
  // Input rows [B, tokens, channels]: latent channels for images, text features for text.
  // Batch element b's first row is rows + b * batch_rows * channels (batch_rows 0: tokens), so
  // a segment can be a view into a buffer that holds several. Unused when the route is kSplice.
  const float* rows = nullptr;
  int64_t tokens = 0;
  int64_t batch_rows = 0;
  const float* ids = nullptr;  // position ids where the family takes them (FLUX.2: [tokens, 4])
  ImageGrid grid{};            // the image grid where the family takes it (Qwen-Image-2.1)
  // Qwen-Image-2.1 text: slots [tokens] (1 where a row is a condition-image slot) and the
  // validity mask [B, tokens] (0 for padding; nullptr: every row valid).
  const uint8_t* slots = nullptr;
  const uint8_t* valid = nullptr;
  SegmentTime time{};
  SegmentKV kv{};
};

}  // namespace flowkv
