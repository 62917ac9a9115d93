// Fingerprints of the CLI's outputs.
#pragma once

#include <cstddef>
#include <cstdint>

namespace flowkv::cli {

// FNV-1a hash of bytes (printed as the fingerprint of an output).
uint64_t fnv1a(const void* p, size_t n);

}  // namespace flowkv::cli
