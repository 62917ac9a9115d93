// The memory budget: what a model, its activations and a request's caches may take, checked
// before anything is allocated, so an impossible request is a flowkv::Error that names the
// figures instead of a process the OS kills.
#pragma once

#include <cstdint>
#include <string_view>

namespace flowkv {

// Bytes the system can still give (MemAvailable), or total memory where that is unknown.
int64_t available_memory_bytes();

// The budget in force: set_memory_budget's value, or available memory when it is 0 (default).
// Negative: no check.
void set_memory_budget_bytes(int64_t bytes);
int64_t memory_budget_bytes();

// Throws a flowkv::Error when `need` bytes exceed the budget; `what` says what needs them and
// `advice` what to do about it.
void check_memory(int64_t need, std::string_view what, std::string_view advice = "");

// The process's peak resident set (VmHWM) in bytes, -1 where unknown; reset_peak_rss() starts
// a new peak from the current RSS (false where the kernel does not allow it).
int64_t peak_rss_bytes();
bool reset_peak_rss();

}  // namespace flowkv
