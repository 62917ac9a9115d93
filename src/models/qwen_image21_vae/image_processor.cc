#include "models/qwen_image21_vae/image_processor.h"

#include "models/common/vae_image_processor.h"

namespace flowkv::qwen21_vae {

Tensor preprocess(const Image& image, int64_t height, int64_t width) {
  return vae_preprocess(image, 4, kImageMultiple, height, width);
}

std::vector<Image> postprocess(const Tensor& image) {
  return vae_postprocess(image, 4);
}

}  // namespace flowkv::qwen21_vae
