// The boundary where outside input enters (a file, a config, a request): whatever a library
// below throws there (nlohmann's type and range errors, std::filesystem_error, std::bad_alloc,
// std::out_of_range from a standard conversion) becomes a flowkv::Error naming the input.
#pragma once

#include <exception>
#include <new>
#include <string_view>

#include "flowkv/error.h"

namespace flowkv {

template <class Fn>
auto at_input_boundary(std::string_view what, Fn&& fn) -> decltype(fn()) {
  try {
    return fn();
  } catch (const Error&) {
    throw;
  } catch (const std::bad_alloc&) {
    fail(what, ": out of memory while reading it");
  } catch (const std::exception& e) {
    fail(what, ": ", e.what());
  }
}

}  // namespace flowkv
