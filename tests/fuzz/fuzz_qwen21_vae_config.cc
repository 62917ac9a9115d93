// libFuzzer target: a Qwen-Image-2.1 or Qwen-Image VAE config.json (vae/config.json) as the
// loaders read it (parse_json, then qwen21_vae::Config::from_json and qwen_vae::Config::from_json),
// and what they do next with an accepted config: its weight table and parameter count. An
// accepted config must survive to_json -> from_json.
#include <cstddef>
#include <cstdint>
#include <string>

#include "fuzz_common.h"
#include "io/json.h"
#include "models/qwen_image21_vae/config.h"
#include "models/qwen_image21_vae/weights.h"
#include "models/qwen_image_vae/config.h"
#include "models/qwen_image_vae/weights.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  flowkv::fuzz::expect_only_flowkv_errors([&] {
    namespace q = flowkv::qwen_vae;
    const flowkv::Json j = flowkv::parse_json(text, "config.json");
    const q::Config c = q::Config::from_json(j, "config.json");
    const auto table = q::weight_table(c);
    FUZZ_ASSERT(q::parameter_count(c) > 0 && !table.empty(), "an empty Qwen-Image VAE");
    const flowkv::Json written = c.to_json();
    const q::Config again = q::Config::from_json(written, "round trip");
    FUZZ_ASSERT(again.to_json() == written, "to_json/from_json round trip changed %s",
                written.dump().c_str());
  });
  flowkv::fuzz::expect_only_flowkv_errors([&] {
    namespace q = flowkv::qwen21_vae;
    const flowkv::Json j = flowkv::parse_json(text, "config.json");
    const q::Config c = q::Config::from_json(j, "config.json");
    const auto table = q::weight_table(c);
    const int64_t params = q::parameter_count(c);
    FUZZ_ASSERT(params > 0 && !table.empty(), "%lld parameters in %zu tensors",
                static_cast<long long>(params), table.size());
    const flowkv::Json written = c.to_json();
    const q::Config again = q::Config::from_json(written, "round trip");
    FUZZ_ASSERT(again.to_json() == written, "to_json/from_json round trip changed %s",
                written.dump().c_str());
  });
  return 0;
}
