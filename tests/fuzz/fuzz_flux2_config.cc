// libFuzzer target: a FLUX.2 config.json as inspect and the loader read it (parse_json, then
// flux2::Config::from_json), and what they do next with an accepted config: its variant name,
// its weight table and parameter count. An accepted config must survive to_json -> from_json.
#include <cstddef>
#include <cstdint>
#include <string>

#include "fuzz_common.h"
#include "io/json.h"
#include "models/flux2/config.h"
#include "models/flux2/weights.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  flowkv::fuzz::expect_only_flowkv_errors([&] {
    const flowkv::Json j = flowkv::parse_json(text, "config.json");
    const flowkv::flux2::Config c = flowkv::flux2::Config::from_json(j, "config.json");
    const std::string variant = flowkv::flux2::variant_name(c);
    const auto table = flowkv::flux2::weight_table(c);
    const int64_t params = flowkv::flux2::parameter_count(c);
    FUZZ_ASSERT(params >= 0 && !table.empty(), "%lld parameters in %zu tensors",
                static_cast<long long>(params), table.size());
    const flowkv::Json written = c.to_json();
    const flowkv::flux2::Config again = flowkv::flux2::Config::from_json(written, "round trip");
    FUZZ_ASSERT(again.to_json() == written, "to_json/from_json round trip changed %s",
                written.dump().c_str());
  });
  return 0;
}
