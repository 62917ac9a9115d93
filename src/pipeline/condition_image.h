// Condition images into Qwen-Image-2.1, as diffusers 0.42.1's QwenImage21Pipeline.__call__
// prepares them (steps 1 and 2 of its docstring):
// 1. converted to RGBA (PIL convert: RGB gets alpha 255), and resized with PIL's Lanczos
//    (premultiplied, as PIL resizes RGBA) to calculate_dimensions(resolution^2, w / h): about
//    resolution^2 pixels with the aspect ratio kept, both sides multiples of 32;
// 2. the VAE reads that RGBA image, [1, 4, H, W] in [-1, 1];
// 3. the prompt encoder reads it pasted over opaque white (RGB), through the Qwen3-VL
//    processor.
// The output size, when not given, is calculate_dimensions of the last image; given or not,
// both sides are floored to multiples of 32.
#pragma once

#include <cstdint>
#include <string>
#include <utility>

#include "io/image.h"

namespace flowkv {

// diffusers' calculate_dimensions(resolution^2, width / height): (width, height), each
// round(x / 32) * 32 with Python's round (halves to even). Refuses a result with a zero side
// (an aspect ratio too extreme for the resolution), naming `what`.
std::pair<int64_t, int64_t> qwen21_dimensions(int64_t resolution, int64_t width, int64_t height,
                                              const std::string& what);

// Step 1: the RGBA condition image at its pipeline size.
Image qwen21_condition_image(const Image& image, int64_t resolution, const std::string& what);

}  // namespace flowkv
