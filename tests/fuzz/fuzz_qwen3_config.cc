// libFuzzer target: a Qwen3 text encoder config.json (transformers' Qwen3Config) as the encoder
// loader reads it; an accepted config's weight table is built and its to_json -> from_json
// round trip must be exact.
#include <cstddef>
#include <cstdint>
#include <string>

#include "fuzz_common.h"
#include "io/json.h"
#include "models/qwen3/config.h"
#include "models/qwen3/weights.h"

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
    const flowkv::qwen3::Config c = flowkv::qwen3::Config::from_json(j, "config.json");
    const auto table = flowkv::qwen3::weight_table(c);
    FUZZ_ASSERT(!table.empty(), "empty weight table");
    FUZZ_ASSERT(flowkv::qwen3::parameter_count(c) > 0, "no parameters");
    const flowkv::Json written = c.to_json();
    const flowkv::qwen3::Config again = flowkv::qwen3::Config::from_json(written, "round trip");
    FUZZ_ASSERT(again.to_json() == written, "to_json/from_json round trip changed %s",
                written.dump().c_str());
  });
  return 0;
}
