// The image side of the Qwen-Image pipelines: diffusers' VaeImageProcessor(vae_scale_factor =
// 2 * 8 = 16) on PIL RGB images (QwenImagePipeline, QwenImageEditPlusPipeline).
//
// preprocess (VaeImageProcessor.preprocess of one PIL RGB image, as _encode_vae_image's caller
// gives it): the size is rounded down to multiples of 16 (get_default_height_width; the
// processor's factor is twice the VAE's 8 because the latents are packed 2x2), the image
// resized with PIL's LANCZOS (nothing when the size is unchanged), then float32(v) / 255 and
// 2x - 1: [1, 3, H, W] in [-1, 1].
//
// postprocess (output_type "pil"): (x * 0.5 + 0.5).clamp(0, 1), times 255, rounded half to
// even, to RGB uint8 images.
#pragma once

#include <vector>

#include "flowkv/tensor.h"
#include "io/image.h"

namespace flowkv::qwen_vae {

// The pipelines' image multiple (VaeImageProcessor's vae_scale_factor = vae_scale_factor * 2).
inline constexpr int64_t kImageMultiple = 16;

// height / width 0: the image's own size. The rounded size must not be 0 (an Error naming it).
Tensor preprocess(const Image& rgb, int64_t height = 0, int64_t width = 0);
// image [B, 3, H, W] (about [-1, 1]) -> B RGB images.
std::vector<Image> postprocess(const Tensor& image);

}  // namespace flowkv::qwen_vae
