#include "models/common/vae_image_processor.h"

#include <algorithm>
#include <cmath>

#include "flowkv/error.h"

namespace flowkv {

Tensor vae_preprocess(const Image& image, int64_t channels, int64_t multiple, int64_t height,
                      int64_t width) {
  const char* kind = channels == 4 ? "RGBA" : "RGB";
  check_image_size(image.width, image.height, "preprocess: the image");
  FLOWKV_CHECK(
      image.channels == channels &&
          image.pixels.size() == static_cast<size_t>(image.width * image.height * channels),
      "preprocess: expected an ", kind, " image, got ", image.channels, " channels");
  FLOWKV_CHECK(height >= 0 && width >= 0, "preprocess: negative target size ", width, "x", height);
  if (height == 0) height = image.height;
  if (width == 0) width = image.width;
  const int64_t h = height - height % multiple, w = width - width % multiple;
  FLOWKV_CHECK(h >= 1 && w >= 1, "preprocess: ", width, "x", height,
               " rounds down to an empty image (sizes are multiples of ", multiple, ")");
  const Image r = resize_lanczos(image, w, h);
  Tensor out = Tensor::empty({1, channels, h, w});
  float* o = out.f32();
  for (int64_t c = 0; c < channels; ++c) {
    for (int64_t i = 0; i < h * w; ++i) {
      // numpy: astype(float32) / 255.0 (an f32 division); torch: 2.0 * x - 1.0 in f32.
      const float v = static_cast<float>(r.pixels[size_t(i * channels + c)]) / 255.0f;
      o[c * h * w + i] = 2.0f * v - 1.0f;
    }
  }
  return out;
}

std::vector<Image> vae_postprocess(const Tensor& image, int64_t channels) {
  const char* kind = channels == 4 ? "RGBA" : "RGB";
  FLOWKV_CHECK(image.ndim() == 4 && image.dtype() == DType::kF32 && image.dim(1) == channels,
               "postprocess: expected an f32 ", kind, " image batch [B, ", channels,
               ", H, W], got ", shape_str(image.shape()));
  const int64_t b = image.dim(0), h = image.dim(2), w = image.dim(3);
  std::vector<Image> out;
  for (int64_t n = 0; n < b; ++n) {
    Image img = Image::blank(w, h, "postprocess", int(channels));
    const float* src = image.f32() + n * channels * h * w;
    for (int64_t c = 0; c < channels; ++c) {
      for (int64_t i = 0; i < h * w; ++i) {
        float v = src[c * h * w + i] * 0.5f;
        v = v + 0.5f;
        v = std::clamp(v, 0.0f, 1.0f);
        v = v * 255.0f;
        // numpy's round: half to even (the default rounding mode); NaN (undefined in numpy's
        // cast) becomes 0.
        const float r = std::isnan(v) ? 0.0f : std::nearbyint(v);
        img.pixels[size_t(i * channels + c)] = static_cast<uint8_t>(r);
      }
    }
    out.push_back(std::move(img));
  }
  return out;
}

}  // namespace flowkv
