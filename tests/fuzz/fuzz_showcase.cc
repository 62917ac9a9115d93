// libFuzzer target: flowkv showcase's case manifest and sweep file (flowkv/showcase.h), the
// same bytes read as each. An accepted manifest has 1 to kMaxShowcaseCases cases with
// file-safe, unique names; an accepted sweep has unique labels whose slugs are unique too.
#include <cstddef>
#include <cstdint>
#include <set>
#include <string>

#include "flowkv/showcase.h"
#include "fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  flowkv::fuzz::expect_only_flowkv_errors([&] {
    const flowkv::ShowcaseManifest m = flowkv::parse_showcase_manifest(text, "/base", "cases.json");
    FUZZ_ASSERT(
        !m.cases.empty() && static_cast<int64_t>(m.cases.size()) <= flowkv::kMaxShowcaseCases,
        "%zu cases accepted", m.cases.size());
    std::set<std::string> names;
    for (const flowkv::ShowcaseCase& c : m.cases) {
      FUZZ_ASSERT(names.insert(c.name).second, "case name '%s' twice", c.name.c_str());
      FUZZ_ASSERT(c.name.find('/') == std::string::npos && c.name[0] != '.',
                  "case name '%s' is not a file name", c.name.c_str());
    }
  });
  flowkv::fuzz::expect_only_flowkv_errors([&] {
    std::set<std::string> slugs;
    for (const flowkv::ShowcaseConfig& c : flowkv::parse_showcase_sweep(text, "sweep.json")) {
      FUZZ_ASSERT(slugs.insert(flowkv::showcase_slug(c.label)).second, "slug of '%s' twice",
                  c.label.c_str());
    }
  });
  return 0;
}
