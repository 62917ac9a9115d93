// libFuzzer target: PNG decoding (io/image.h, libspng) on arbitrary bytes. A decoded image must
// have the size its pixels say and lie within the limits; small ones are then re-encoded
// (with a parameters text) and decoded again to the same pixels, and resized (PIL's Lanczos).
// The RGBA decoder (convert("RGBA")) runs on the same bytes: it must accept exactly what the RGB
// one accepts, with the same RGB values, and its images go through the same round trip and the
// premultiplied RGBA resize.
#include <cstddef>
#include <cstdint>

#include "flowkv/limits.h"
#include "fuzz_common.h"
#include "io/image.h"

// A small input may claim a large image and cost its whole decoding (as in every decoder): the
// target bounds it (4M pixels) so that runs stay well under the 10 s timeout under ASan.
constexpr int64_t kMaxFuzzPixels = int64_t{1} << 22;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  flowkv::fuzz::expect_only_flowkv_errors([&] {
    const flowkv::Image img = flowkv::decode_image(data, size, "fuzz.png", kMaxFuzzPixels);
    FUZZ_ASSERT(img.width >= 1 && img.height >= 1 && img.width * img.height <= kMaxFuzzPixels,
                "accepted a %lldx%lld image", static_cast<long long>(img.width),
                static_cast<long long>(img.height));
    FUZZ_ASSERT(img.pixels.size() == static_cast<size_t>(img.width * img.height * 3),
                "%zu bytes of pixels for %lldx%lld", img.pixels.size(),
                static_cast<long long>(img.width), static_cast<long long>(img.height));
    if (img.width * img.height > 4096) return;
    const std::string png = flowkv::encode_png(img, "fuzz\nparameters");
    const flowkv::Image back = flowkv::decode_image(reinterpret_cast<const uint8_t*>(png.data()),
                                                    png.size(), "re-encoded");
    FUZZ_ASSERT(back.pixels == img.pixels, "PNG round trip changed the pixels");
    const flowkv::Image r = flowkv::resize_lanczos(img, img.width / 2 + 1, img.height * 2 + 1);
    FUZZ_ASSERT(r.pixels.size() == static_cast<size_t>(r.width * r.height * 3), "resize size");
  });
  flowkv::fuzz::expect_only_flowkv_errors([&] {
    const flowkv::Image img =
        flowkv::decode_image(data, size, "fuzz.png", kMaxFuzzPixels, flowkv::PixelFormat::kRGBA);
    FUZZ_ASSERT(img.pixels.size() == static_cast<size_t>(img.width * img.height * 4),
                "%zu bytes of RGBA pixels for %lldx%lld", img.pixels.size(),
                static_cast<long long>(img.width), static_cast<long long>(img.height));
    const flowkv::Image rgb = flowkv::decode_image(data, size, "fuzz.png", kMaxFuzzPixels);
    FUZZ_ASSERT(flowkv::to_rgb(img).pixels == rgb.pixels, "RGBA and RGB decodes differ in RGB");
    if (img.width * img.height > 4096) return;
    const std::string png = flowkv::encode_png(img);
    const flowkv::Image back =
        flowkv::decode_image(reinterpret_cast<const uint8_t*>(png.data()), png.size(), "re-encoded",
                             kMaxFuzzPixels, flowkv::PixelFormat::kRGBA);
    FUZZ_ASSERT(back.pixels == img.pixels, "RGBA PNG round trip changed the pixels");
    const flowkv::Image r = flowkv::resize_lanczos(img, img.width * 2 + 1, img.height / 2 + 1);
    FUZZ_ASSERT(r.pixels.size() == static_cast<size_t>(r.width * r.height * 4), "RGBA resize");
  });
  return 0;
}
