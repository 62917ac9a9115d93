// diffusers' VaeImageProcessor (do_normalize, no RGB conversion, resample "lanczos") on PIL
// images of 3 (RGB) or 4 (RGBA) channels, as the Qwen-Image pipelines call it.
//
// preprocess of one PIL image: the size is rounded down to multiples of `multiple`
// (get_default_height_width), the image resized with PIL's LANCZOS (RGBA premultiplied;
// nothing when the size is unchanged), then float32(v) / 255 and 2x - 1: [1, C, H, W] in
// [-1, 1].
//
// postprocess (output_type "pil"): (x * 0.5 + 0.5).clamp(0, 1), times 255, rounded half to
// even, to uint8 images of C channels.
#pragma once

#include <vector>

#include "flowkv/tensor.h"
#include "io/image.h"

namespace flowkv {

// height / width 0: the image's own size. The rounded size must not be 0 (an Error naming it).
Tensor vae_preprocess(const Image& image, int64_t channels, int64_t multiple, int64_t height,
                      int64_t width);
// image [B, C, H, W] (about [-1, 1]) -> B images.
std::vector<Image> vae_postprocess(const Tensor& image, int64_t channels);

}  // namespace flowkv
