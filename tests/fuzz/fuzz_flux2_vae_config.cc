// libFuzzer target: a FLUX.2 VAE config.json (vae/config.json) as the loader reads it
// (parse_json, then flux2_vae::Config::from_json), and what it does next with an accepted
// config: its weight table and parameter count. An accepted config must survive
// to_json -> from_json.
#include <cstddef>
#include <cstdint>
#include <string>

#include "fuzz_common.h"
#include "io/json.h"
#include "models/flux2_vae/config.h"
#include "models/flux2_vae/weights.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  flowkv::fuzz::expect_only_flowkv_errors([&] {
    const flowkv::Json j = flowkv::parse_json(text, "config.json");
    const flowkv::flux2_vae::Config c = flowkv::flux2_vae::Config::from_json(j, "config.json");
    const auto table = flowkv::flux2_vae::weight_table(c);
    const int64_t params = flowkv::flux2_vae::parameter_count(c);
    FUZZ_ASSERT(params > 0 && !table.empty(), "%lld parameters in %zu tensors",
                static_cast<long long>(params), table.size());
    const flowkv::Json written = c.to_json();
    const flowkv::flux2_vae::Config again =
        flowkv::flux2_vae::Config::from_json(written, "round trip");
    FUZZ_ASSERT(again.to_json() == written, "to_json/from_json round trip changed %s",
                written.dump().c_str());
  });
  return 0;
}
