// Reference images into the FLUX.2 Klein pipelines, and decoded images out, as diffusers 0.42.1
// does (Flux2KleinPipeline / Flux2KleinKVPipeline __call__ step 4, Flux2ImageProcessor,
// VaeImageProcessor.preprocess / postprocess):
// 1. refused when a side is under 64 pixels or the aspect ratio over 8 (check_image_input);
// 2. above 1024 x 1024 pixels, resized with PIL's Lanczos to int(w * s) x int(h * s),
//    s = sqrt(1024^2 / (w h)) (_resize_to_target_area);
// 3. both sides rounded down to a multiple of 16 and centre-cropped to it, left and top offsets
//    (w - w16) / 2 rounded down (Flux2ImageProcessor._resize_and_crop crops, never resizes);
// 4. float32 [1, 3, H, W] = 2 * (v / 255) - 1.
// Decoded pixels: x float32 -> clamp(x * 0.5 + 0.5, 0, 1) -> round_half_even(x * 255) as uint8.
#pragma once

#include <cstdint>
#include <string>

#include "flowkv/tensor.h"
#include "io/image.h"

namespace flowkv {

// Steps 1-3: the image the pipeline encodes; `what` names it in errors.
Image flux2_reference_image(const Image& image, const std::string& what);
// Step 4: [1, C, H, W] in [-1, 1], C = the image's channels (3, or 4 for RGBA).
Tensor image_to_tensor(const Image& image);
// [1, C, H, W] or [C, H, W] float32 in [-1, 1], C = 3 or 4, to 8-bit RGB or RGBA (diffusers'
// postprocess to PIL).
Image tensor_to_image(const Tensor& t);

}  // namespace flowkv
