// The public Flux2Transformer's implementation: a loaded flux2::Model plus its name. Here, below
// the API, because the family wraps the handle (families/flux2/family.cc) and the API defines it.
#pragma once

#include "flowkv/flux2.h"
#include "models/flux2/model.h"

namespace flowkv {

struct Flux2Transformer::Impl {
  flux2::Model model;
  std::string variant;
  bool int8 = false;  // linear layers in 8-bit integer arithmetic
};

// Parses "auto" / "f32" / "bf16" / "int8".
flux2::LoadOptions parse_dtype_option(const std::string& dtype);

}  // namespace flowkv
