// libFuzzer target: `flowkv inspect` (the public inspect API and its report) on a folder built
// from the input. Input layout (little-endian):
//   bytes 0-1  length L of config.json
//   bytes 2-5  P: zero bytes appended to the safetensors file (a sparse hole, so a small input
//              can describe a full-size data section)
//   byte  6    flags: bit 0 set: inspect the .safetensors file alone (a BFL single file), not
//              the folder
//   then L bytes of config.json, then the start of diffusion_pytorch_model.safetensors.
// tests/fuzz/make_seeds.sh writes the golden transformer folders in this layout.
#include <cstddef>
#include <cstdint>
#include <string>

#include "flowkv/inspect.h"
#include "fuzz_common.h"

namespace {

namespace fs = std::filesystem;
constexpr size_t kPrefix = 7;

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static flowkv::fuzz::ScratchDir scratch("inspect");
  if (size < kPrefix) return 0;
  const size_t config_len = std::min<size_t>(flowkv::fuzz::read_le(data, 2), size - kPrefix);
  const uint64_t pad = flowkv::fuzz::read_le(data + 2, 4);
  const bool single_file = (data[6] & 1) != 0;
  const fs::path dir = scratch.path() / "transformer";
  const fs::path weights = dir / "diffusion_pytorch_model.safetensors";
  fs::remove_all(dir);
  fs::create_directories(dir);
  flowkv::fuzz::write_file(dir / "config.json", data + kPrefix, config_len);
  const size_t st_len = size - kPrefix - config_len;
  flowkv::fuzz::write_file(weights, data + kPrefix + config_len, st_len);
  if (pad > 0) fs::resize_file(weights, st_len + pad);
  const std::string target = single_file ? weights.string() : scratch.path().string();
  flowkv::fuzz::expect_only_flowkv_errors([&] {
    const flowkv::InspectReport r = flowkv::inspect(target);
    const std::string text = flowkv::format_report(r);
    FUZZ_ASSERT(!text.empty(), "empty report");
  });
  return 0;
}
