// libFuzzer target: a Qwen-Image config.json read by both Qwen parsers (Qwen-Image-2.1 and
// Qwen-Image), as inspect does after class_name(); an accepted config's weight table is built
// and its to_json -> from_json round trip must be exact.
#include <cstddef>
#include <cstdint>
#include <string>

#include "fuzz_common.h"
#include "io/json.h"
#include "models/qwen_image/config.h"
#include "models/qwen_image/weights.h"

namespace {

template <class C>
void read_as(const flowkv::Json& j) {
  flowkv::fuzz::expect_only_flowkv_errors([&] {
    const C c = C::from_json(j, "config.json");
    const auto table = flowkv::qwen::weight_table(c);
    FUZZ_ASSERT(!table.empty(), "empty weight table");
    const flowkv::Json written = c.to_json();
    const C again = C::from_json(written, "round trip");
    FUZZ_ASSERT(again.to_json() == written, "to_json/from_json round trip changed %s",
                written.dump().c_str());
  });
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  flowkv::Json j;
  bool parsed = false;
  flowkv::fuzz::expect_only_flowkv_errors([&] {
    j = flowkv::parse_json(text, "config.json");
    parsed = true;
  });
  if (!parsed) return 0;
  (void)flowkv::qwen::class_name(j);
  read_as<flowkv::qwen::Config21>(j);
  read_as<flowkv::qwen::ConfigQwenImage>(j);
  return 0;
}
