// libFuzzer target: the safetensors header parser (io/safetensors.h), on the input as a file.
// Each input is parsed twice, as read_safetensors_header calls the parser: once as a whole file
// (file size = input size) and once as the header of a larger file (the data section runs on
// past the input, as when only the 8 + N header bytes are read). A successful parse must leave
// every tensor inside the data section, sized by its shape and dtype, without overlaps.
#include <cstddef>
#include <cstdint>
#include <string>

#include "fuzz_common.h"
#include "io/safetensors.h"

namespace {

using flowkv::SafetensorsHeader;

void check_invariants(const SafetensorsHeader& h, int64_t file_size) {
  FUZZ_ASSERT(h.data_start >= 8 && h.data_start <= file_size, "data_start %lld, file size %lld",
              static_cast<long long>(h.data_start), static_cast<long long>(file_size));
  const int64_t data_size = file_size - h.data_start;
  int64_t prev_end = 0;
  for (const flowkv::TensorInfo& t : h.tensors) {
    FUZZ_ASSERT(t.begin >= 0 && t.begin <= t.end && t.end <= data_size,
                "tensor '%s' accepted with data [%lld, %lld) outside [0, %lld)", t.name.c_str(),
                static_cast<long long>(t.begin), static_cast<long long>(t.end),
                static_cast<long long>(data_size));
    for (int64_t d : t.shape) {
      FUZZ_ASSERT(d >= 0, "tensor '%s' accepted with a negative dimension", t.name.c_str());
    }
    if (t.dtype_known) {
      // Bounded by the data section, so this product cannot overflow for an accepted tensor.
      __int128 bytes = flowkv::dtype_size(t.dtype);
      for (int64_t d : t.shape) bytes *= d;
      FUZZ_ASSERT(bytes == t.end - t.begin, "tensor '%s': span %lld bytes does not match shape",
                  t.name.c_str(), static_cast<long long>(t.end - t.begin));
    }
    if (t.end > t.begin) {
      FUZZ_ASSERT(t.begin >= prev_end, "tensor '%s' overlaps the one before it", t.name.c_str());
      prev_end = t.end;
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  for (const int64_t file_size :
       {static_cast<int64_t>(size), static_cast<int64_t>(size) + (1 << 30)}) {
    flowkv::fuzz::expect_only_flowkv_errors([&] {
      const SafetensorsHeader h =
          flowkv::parse_safetensors_header("fuzz.safetensors", bytes, file_size);
      check_invariants(h, file_size);
    });
  }
  return 0;
}
