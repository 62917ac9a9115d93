// Measurement helpers for the benchmarks: medians, peak resident memory, progress lines.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "flowkv/dtype.h"

namespace flowkv::cli {

double median(std::vector<double> v);

// One progress line on stderr, rewritten in place on a terminal.
void progress(const std::string& line);
void progress_done();

// "2G", "512M", "1000" -> bytes (finite, non-negative, within 64 bits).
int64_t parse_bytes(const std::string& s, const char* what);
// A weight type by its lower-case name (f32, bf16, f16, q8_0, ..., q6_k).
DType parse_weight_type(const std::string& s, const char* what);
// "4,8,28": integers in [lo, hi].
std::vector<int> parse_int_list(const std::string& s, const char* what, int lo, int hi);
// "AxB" with A and B in [1, max_side] and A*B <= max_product, in the order written; `form`
// names what they are in the error ("16x16 (latent tokens, height x width)").
std::pair<int64_t, int64_t> parse_dims(const std::string& s, const char* what, const char* form,
                                       int64_t max_side, int64_t max_product);
// A latent grid "HxW" in tokens, at most flowkv::limits::kMaxTokens in all.
std::pair<int64_t, int64_t> parse_grid(const std::string& s, const char* what);

}  // namespace flowkv::cli
