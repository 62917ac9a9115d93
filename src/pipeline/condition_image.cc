// Qwen-Image-2.1 condition images (see condition_image.h).
#include "pipeline/condition_image.h"

#include <cmath>

#include "flowkv/error.h"

namespace flowkv {

namespace {
constexpr int64_t kMultiple = 32;  // QwenImage21Pipeline: calculate_dimensions rounds to 32

int64_t round_to_multiple(double x) {
  // Python's round(x / 32) * 32: halves go to the even multiple (nearbyint under the default
  // rounding mode).
  return static_cast<int64_t>(std::nearbyint(x / kMultiple)) * kMultiple;
}
}  // namespace

std::pair<int64_t, int64_t> qwen21_dimensions(int64_t resolution, int64_t width, int64_t height,
                                              const std::string& what) {
  FLOWKV_CHECK(resolution >= 1 && width >= 1 && height >= 1, what, ": empty size");
  const double area = static_cast<double>(resolution) * static_cast<double>(resolution);
  const double ratio = static_cast<double>(width) / static_cast<double>(height);
  const double w = std::sqrt(area * ratio);
  const double h = w / ratio;
  const int64_t ow = round_to_multiple(w), oh = round_to_multiple(h);
  FLOWKV_CHECK(ow >= kMultiple && oh >= kMultiple, what, ": a ", width, "x", height,
               " image resized to about ", resolution, "x", resolution,
               " pixels keeps a side under ", kMultiple,
               " pixels (aspect ratio too extreme for the resolution; diffusers fails here too)");
  return {ow, oh};
}

Image qwen21_condition_image(const Image& image, int64_t resolution, const std::string& what) {
  const auto [w, h] = qwen21_dimensions(resolution, image.width, image.height, what);
  return resize_lanczos(to_rgba(image), w, h);
}

}  // namespace flowkv
