// libFuzzer target: a sharded checkpoint's index (diffusion_pytorch_model.safetensors.index.json)
// and the scan that follows it. The input is written as the index into a scratch folder that
// holds the golden multi_guidance transformer (its config.json and its five shards, as sparse
// copies: real headers, zero data) plus hostile neighbours an index may name: a symlink loop, a
// dangling symlink, a folder, a FIFO (opening it must not block), an empty file. scan_checkpoint
// runs lenient (inspect) and strict (the loader).
#include <sys/stat.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "fuzz_common.h"
#include "io/checkpoint.h"
#include "io/mapped_file.h"

namespace {

namespace fs = std::filesystem;

// A safetensors file with the header of `src` and a hole for its data.
void sparse_copy(const fs::path& src, const fs::path& dst) {
  const std::string head = flowkv::read_file_prefix(src.string(), 8);
  const uint64_t n = flowkv::fuzz::read_le(reinterpret_cast<const uint8_t*>(head.data()), 8);
  flowkv::fuzz::write_file(dst,
                           flowkv::read_file_prefix(src.string(), static_cast<int64_t>(8 + n)));
  fs::resize_file(dst, fs::file_size(src));
}

const fs::path& fixture() {
  static flowkv::fuzz::ScratchDir dir("shard-index");
  static bool made = false;
  if (!made) {
    const fs::path golden = fs::path(FLOWKV_GOLDEN_DIR) / "flux2/multi_guidance/transformer";
    fs::copy_file(golden / "config.json", dir.path() / "config.json");
    for (const auto& e : fs::directory_iterator(golden)) {
      if (e.path().extension() == ".safetensors") {
        sparse_copy(e.path(), dir.path() / e.path().filename());
      }
    }
    fs::create_symlink("loop.safetensors", dir.path() / "loop.safetensors");
    fs::create_symlink("nonexistent.safetensors", dir.path() / "dangling.safetensors");
    fs::create_directory(dir.path() / "dir.safetensors");
    if (mkfifo((dir.path() / "fifo.safetensors").c_str(), 0600) != 0) std::abort();
    flowkv::fuzz::write_file(dir.path() / "empty.safetensors", "");
    made = true;
  }
  return dir.path();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const fs::path& dir = fixture();
  flowkv::fuzz::write_file(dir / "diffusion_pytorch_model.safetensors.index.json", data, size);
  flowkv::fuzz::expect_only_flowkv_errors([&] {
    const flowkv::CheckpointScan scan = flowkv::scan_checkpoint(dir.string(), /*lenient=*/true);
    for (const auto& [name, t] : scan.tensors) {
      FUZZ_ASSERT(t.begin >= 0 && t.begin <= t.end, "tensor '%s' has data [%lld, %lld)",
                  name.c_str(), static_cast<long long>(t.begin), static_cast<long long>(t.end));
    }
  });
  flowkv::fuzz::expect_only_flowkv_errors([&] {
    const flowkv::CheckpointScan scan = flowkv::scan_checkpoint(dir.string(), /*lenient=*/false);
    FUZZ_ASSERT(!scan.files.empty(), "a strict scan accepted a checkpoint without files");
  });
  return 0;
}
