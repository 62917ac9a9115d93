// Errors: every failure a user can cause (bad file, bad shape, budget too small) is reported
// as a flowkv::Error whose message names the problem and, where possible, what to do.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace flowkv {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
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
