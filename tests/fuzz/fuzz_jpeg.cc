// libFuzzer target: JPEG decoding (io/image.h, TurboJPEG, with the marker walk that reads EXIF
// and XMP orientation and counts scans) on arbitrary bytes. The input gets a JPEG signature so
// that every run reaches the JPEG path. A decoded image must have the size its pixels say and
// lie within the limits.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "flowkv/limits.h"
#include "fuzz_common.h"
#include "io/image.h"

// A small input may claim a large image and cost its whole decoding (as in every decoder): the
// target bounds it (4M pixels) so that runs stay well under the 10 s timeout under ASan.
constexpr int64_t kMaxFuzzPixels = int64_t{1} << 22;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<uint8_t> bytes(data, data + size);
  if (bytes.size() < 3 || bytes[0] != 0xFF || bytes[1] != 0xD8 || bytes[2] != 0xFF) {
    bytes.insert(bytes.begin(), {0xFF, 0xD8, 0xFF});
  }
  flowkv::fuzz::expect_only_flowkv_errors([&] {
    const flowkv::Image img =
        flowkv::decode_image(bytes.data(), bytes.size(), "fuzz.jpg", kMaxFuzzPixels);
    FUZZ_ASSERT(img.width >= 1 && img.height >= 1 && img.width * img.height <= kMaxFuzzPixels,
                "accepted a %lldx%lld image", static_cast<long long>(img.width),
                static_cast<long long>(img.height));
    FUZZ_ASSERT(img.pixels.size() == static_cast<size_t>(img.width * img.height * 3),
                "%zu bytes of pixels for %lldx%lld", img.pixels.size(),
                static_cast<long long>(img.width), static_cast<long long>(img.height));
  });
  return 0;
}
