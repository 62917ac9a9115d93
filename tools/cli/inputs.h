// What several commands read or print: prompt files, fingerprints of outputs.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace flowkv::cli {

// FNV-1a hash of bytes (printed as the fingerprint of an output).
uint64_t fnv1a(const void* p, size_t n);

// One prompt per line of a file (blank lines skipped, a trailing CR dropped); an Error naming
// the --prompts file when it cannot be read or holds none (generate, bench-tokenizer).
std::vector<std::string> read_prompts(const std::string& path);

}  // namespace flowkv::cli
