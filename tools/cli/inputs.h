// Deterministic inputs for the CLI's runs.
#pragma once

#include "flowkv/flux2.h"

namespace flowkv::cli {

// An h x w target grid (ids (0, y, x, 0)) and `text` text tokens (ids (0, 0, 0, l)), with
// uniform [-1, 1) values from `seed`, timestep 0.75.
Flux2Call demo_call(const Flux2Transformer& m, int64_t h, int64_t w, int64_t text, uint64_t seed);

// FNV-1a hash of bytes (printed as the fingerprint of an output).
uint64_t fnv1a(const void* p, size_t n);

}  // namespace flowkv::cli
