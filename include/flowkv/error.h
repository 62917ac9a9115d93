// Errors: every failure a user can cause (bad file, bad shape, budget too small) is reported
// as a flowkv::Error whose message names the problem and, where possible, what to do.
#pragma once

#include <cstdint>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace flowkv {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A request whose exact KV cache would not fit the caller's KV budget (kv_budget_bytes): the
// figures, so that a front end can say it in its own terms (a CLI flag, an HTTP field).
class KVBudgetError : public Error {
 public:
  KVBudgetError(const std::string& what, int64_t need, int64_t budget)
      : Error(what), need_bytes(need), budget_bytes(budget) {}
  int64_t need_bytes, budget_bytes;
};

template <class... Parts>
[[noreturn]] void fail(Parts&&... parts) {
  std::ostringstream out;
  (out << ... << std::forward<Parts>(parts));
  throw Error(out.str());
}

}  // namespace flowkv

#define FLOWKV_CHECK(cond, ...)               \
  do {                                        \
    if (!(cond)) ::flowkv::fail(__VA_ARGS__); \
  } while (0)
