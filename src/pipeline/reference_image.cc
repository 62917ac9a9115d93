// FLUX.2 Klein reference preprocessing and image postprocessing (see reference_image.h). The
// float steps round as numpy / torch float32 do: compiled without contraction
// (src/CMakeLists.txt), each product and sum one rounding.
#include "pipeline/reference_image.h"

#include <cmath>

#include "flowkv/error.h"

namespace flowkv {

namespace {
constexpr int64_t kMinSide = 64, kMaxAspect = 8, kMaxArea = 1024 * 1024, kMultiple = 16;
}  // namespace

Image flux2_reference_image(const Image& image, const std::string& what) {
  const int64_t w = image.width, h = image.height;
  FLOWKV_CHECK(w >= kMinSide && h >= kMinSide, what, ": image too small: ", w, "x", h,
               "; both sides must be at least ", kMinSide, " pixels");
  // max(w / h, h / w) > 8, in exact integers.
  FLOWKV_CHECK(w <= kMaxAspect * h && h <= kMaxAspect * w, what, ": aspect ratio too extreme: ", w,
               "x", h, "; the largest allowed is ", kMaxAspect, ":1");
  Image img = image;
  if (w * h > kMaxArea) {
    const double scale = std::sqrt(static_cast<double>(kMaxArea) / static_cast<double>(w * h));
    const auto nw = static_cast<int64_t>(static_cast<double>(w) * scale);
    const auto nh = static_cast<int64_t>(static_cast<double>(h) * scale);
    img = resize_lanczos(image, nw, nh);
  }
  const int64_t cw = img.width / kMultiple * kMultiple, ch = img.height / kMultiple * kMultiple;
  if (cw == img.width && ch == img.height) return img;
  return crop(img, (img.width - cw) / 2, (img.height - ch) / 2, cw, ch);
}

Tensor image_to_tensor(const Image& image) {
  const int64_t hw = image.width * image.height, ch = image.channels;
  Tensor t = Tensor::empty({1, ch, image.height, image.width});
  float* out = t.f32();
  for (int64_t i = 0; i < hw; ++i) {
    for (int64_t c = 0; c < ch; ++c) {
      const float x = static_cast<float>(image.pixels[ch * i + c]) / 255.0f;
      out[c * hw + i] = 2.0f * x - 1.0f;
    }
  }
  return t;
}

Image tensor_to_image(const Tensor& t) {
  const Shape& s = t.shape();
  const int64_t ch = s.size() == 4 ? s[1] : s.empty() ? 0 : s[0];
  FLOWKV_CHECK(((s.size() == 4 && s[0] == 1) || s.size() == 3) && (ch == 3 || ch == 4),
               "decoded image: expected a [1, 3 or 4, H, W] tensor");
  FLOWKV_CHECK(t.dtype() == DType::kF32, "decoded image: expected float32");
  const int64_t h = s[s.size() - 2], w = s[s.size() - 1];
  Image img = Image::blank(w, h, "decoded image", ch);
  const float* in = t.f32();
  const int64_t hw = w * h;
  for (int64_t i = 0; i < hw; ++i) {
    for (int64_t c = 0; c < ch; ++c) {
      float x = in[c * hw + i] * 0.5f + 0.5f;
      // clamp(0, 1) keeps NaN; numpy's NaN -> uint8 cast is undefined: 0 here.
      if (std::isnan(x)) x = 0.0f;
      x = x < 0.0f ? 0.0f : x > 1.0f ? 1.0f : x;
      img.pixels[ch * i + c] = static_cast<uint8_t>(std::nearbyint(x * 255.0f));
    }
  }
  return img;
}

}  // namespace flowkv
