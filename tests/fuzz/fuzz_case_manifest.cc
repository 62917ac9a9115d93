// libFuzzer target: a case manifest (cases.json, flowkv/calibrate.h), as flowkv calibrate reads
// it; an accepted manifest has at least one case, each with a name, and every reference path
// resolved inside the folder unless the manifest gave an absolute one.
#include <cstddef>
#include <cstdint>
#include <string>

#include "flowkv/calibrate.h"
#include "fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  flowkv::fuzz::expect_only_flowkv_errors([&] {
    const flowkv::CaseManifest m = flowkv::parse_case_manifest(text, "dir", "cases.json");
    FUZZ_ASSERT(!m.cases.empty(), "an accepted manifest without cases%s", "");
    for (const flowkv::EvalCase& c : m.cases) {
      for (const std::string& r : c.references) {
        FUZZ_ASSERT(!r.empty() && (r[0] == '/' || r.rfind("dir/", 0) == 0),
                    "reference '%s' neither absolute nor under the folder", r.c_str());
      }
    }
  });
  return 0;
}
