// Measurement helpers for the benchmarks: medians, peak resident memory, progress lines.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace flowkv::cli {

double median(std::vector<double> v);

// Peak resident set size of this process since the last reset, in bytes (VmHWM), or -1.
int64_t peak_rss_bytes();
// Starts a new peak-RSS window (writes 5 to /proc/self/clear_refs). False if unsupported.
bool reset_peak_rss();

// One progress line on stderr, rewritten in place on a terminal.
void progress(const std::string& line);
void progress_done();

// "2G", "512M", "1000" -> bytes.
int64_t parse_bytes(const std::string& s);
std::vector<int> parse_int_list(const std::string& s, const char* what);
// "AxB" with positive A and B, in the order written; `form` names what they are in the error
// ("16x16 (latent tokens, height x width)").
std::pair<int64_t, int64_t> parse_dims(const std::string& s, const char* what, const char* form);

}  // namespace flowkv::cli
