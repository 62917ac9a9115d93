// The (family, built-in model) pairs the per-family tests run over, derived from the registry:
// a new family is tested by registering.
#pragma once

#include <cctype>
#include <cstring>
#include <ostream>
#include <string>
#include <vector>

#include "flowkv/model.h"

namespace flowkv::test {

struct FamilyCase {
  std::string family, builtin;
};
inline void PrintTo(const FamilyCase& c, std::ostream* os) {
  *os << c.family << "/" << c.builtin;
}

inline std::vector<FamilyCase> all_builtins() {
  std::vector<FamilyCase> out;
  for (const FamilyInfo& f : registered_families()) {
    for (const std::string& b : f.builtins) out.push_back({f.name, b});
  }
  return out;
}

// A test name for a case: the built-in's name with anything but letters and digits as '_'.
inline std::string case_name(const FamilyCase& c) {
  std::string n = c.builtin;
  for (char& ch : n) ch = std::isalnum(static_cast<unsigned char>(ch)) ? ch : '_';
  return n;
}

// Settings under which each block-level policy skips or reuses something on random-weight
// models (they change a lot from step to step: thresholds high enough to fire).
inline const std::vector<std::string> kModelFiring = {
    "fbcache:threshold=10",
    "dbcache:fn=1,threshold=10,warmup=1",
    "teacache:threshold=10",
    "magcache:ratios=flux1,threshold=0.5",
    "taylorseer:interval=2,before=1",
    "fora:interval=2",
    "pab:lo=-1,hi=2000",
    "seacache:threshold=10",
    "meancache:budget=3",
};

inline bool same_bits(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() &&
         std::memcmp(a.raw(), b.raw(), static_cast<size_t>(a.nbytes())) == 0;
}

}  // namespace flowkv::test
