#include "models/qwen_image_vae/image_processor.h"

#include "models/common/vae_image_processor.h"

namespace flowkv::qwen_vae {

Tensor preprocess(const Image& rgb, int64_t height, int64_t width) {
  return vae_preprocess(rgb, 3, kImageMultiple, height, width);
}

std::vector<Image> postprocess(const Tensor& image) {
  return vae_postprocess(image, 3);
}

}  // namespace flowkv::qwen_vae
