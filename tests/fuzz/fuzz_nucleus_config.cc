// libFuzzer target: a NucleusMoE-Image transformer config.json, as inspect and the loader read
// it: an accepted config's weight table (both expert layouts), cost shape inputs and MoE layer
// plan are built, and its to_json -> from_json round trip must be exact.
#include <cstddef>
#include <cstdint>
#include <string>

#include "fuzz_common.h"
#include "io/json.h"
#include "models/nucleus/config.h"
#include "models/nucleus/weights.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  flowkv::Json j;
  bool parsed = false;
  flowkv::fuzz::expect_only_flowkv_errors([&] {
    j = flowkv::parse_json(text, "config.json");
    parsed = true;
  });
  if (!parsed) return 0;
  flowkv::fuzz::expect_only_flowkv_errors([&] {
    const flowkv::nucleus::Config c = flowkv::nucleus::Config::from_json(j, "config.json");
    for (const bool output_major : {false, true}) {
      FUZZ_ASSERT(!flowkv::nucleus::weight_table(c, output_major).empty(), "empty weight table");
    }
    for (int64_t l = 0; l < c.num_layers; ++l) {
      if (c.is_moe(l)) FUZZ_ASSERT(c.capacity_factor(l) >= 0, "a negative capacity factor");
    }
    FUZZ_ASSERT(c.dense_inner() >= 0 && c.kv_dim() > 0 && c.out_features() > 0, "bad widths");
    const flowkv::Json written = c.to_json();
    const flowkv::nucleus::Config again = flowkv::nucleus::Config::from_json(written, "round trip");
    FUZZ_ASSERT(again.to_json() == written, "to_json/from_json round trip changed %s",
                written.dump().c_str());
  });
  return 0;
}
