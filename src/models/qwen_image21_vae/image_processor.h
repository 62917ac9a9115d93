// The image side of QwenImage21Pipeline: diffusers' VaeImageProcessor(vae_scale_factor=16,
// vae_latent_channels=64) on PIL RGBA images.
//
// preprocess (VaeImageProcessor.preprocess of one PIL image, as the pipeline calls it with the
// image already converted to RGBA): the size is rounded down to multiples of 16
// (get_default_height_width), the image resized with PIL's LANCZOS (for RGBA: premultiplied,
// resized, un-premultiplied; nothing when the size is unchanged), then float32(v) / 255 and
// 2x - 1: [1, 4, H, W] in [-1, 1]. No RGB conversion (do_convert_rgb is false), so alpha is the
// fourth channel the VAE reads.
//
// postprocess (output_type "pil"): (x * 0.5 + 0.5).clamp(0, 1), times 255, rounded half to
// even, to uint8; a 4-channel image becomes a PIL "RGBA" image: alpha is the decoder's fourth
// channel as is (nothing is composited). QwenImage21Pipeline returns these RGBA images.
#pragma once

#include <vector>

#include "flowkv/tensor.h"
#include "io/image.h"

namespace flowkv::qwen21_vae {

// The pipeline's VAE scale factor (QwenImage21Pipeline.vae_scale_factor).
inline constexpr int64_t kImageMultiple = 16;

// height / width 0: the image's own size. The rounded size must not be 0 (an Error naming it).
Tensor preprocess(const Image& image, int64_t height = 0, int64_t width = 0);
// image [B, 4, H, W] (about [-1, 1]) -> B RGBA images.
std::vector<Image> postprocess(const Tensor& image);

}  // namespace flowkv::qwen21_vae
