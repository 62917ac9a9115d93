// Pictures as 8-bit pixels, and PNG / JPEG files: what a tool needs to read a reference or a
// ground truth and to write a result (the metrics in flowkv/metrics.h compare them).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace flowkv {

// 8-bit pixels, rows top to bottom, [H, W, channels]: RGB (3) or RGBA (4, straight alpha).
struct Image {
  int64_t width = 0, height = 0;
  int64_t channels = 3;
  std::vector<uint8_t> pixels;

  uint8_t* at(int64_t x, int64_t y) { return pixels.data() + (y * width + x) * channels; }
  const uint8_t* at(int64_t x, int64_t y) const {
    return pixels.data() + (y * width + x) * channels;
  }
  // An image of the given size, pixels zero; the size is checked against the limits.
  static Image blank(int64_t width, int64_t height, const std::string& what, int64_t channels = 3);
};

// What decoding converts to: PIL's convert("RGB") (alpha dropped), or convert("RGBA") (alpha
// kept: grey + alpha, RGBA, a palette's or a colour key's tRNS; opaque where there is none).
enum class PixelFormat { kRGB, kRGBA };

// Reads and decodes a PNG or JPEG file (told apart by their signatures, not the name) as
// diffusers' load_image does (src/io/image.h has the details). Every failure is a flowkv::Error
// naming the file: not an image, corrupt, truncated, or larger than limits::kMaxImagePixels.
Image load_image(const std::string& path, PixelFormat format = PixelFormat::kRGB);

// Writes an RGB or RGBA image as a PNG, atomically (the old file or the whole new one);
// `parameters`, when not empty, goes into a "parameters" text chunk.
void save_png(const std::string& path, const Image& image, const std::string& parameters = "");

// The same PNG as save_png writes, in memory (a server's response, a test's decode round trip):
// `parameters`, when not empty, goes into a "parameters" text chunk (tEXt when it is ASCII, else
// UTF-8 iTXt, as PIL's PngInfo.add_text writes it), where A1111-style tools and PIL's
// Image.info["parameters"] find it. A flowkv::Error for a bad image or text.
std::string encode_png(const Image& image, const std::string& parameters = "");

}  // namespace flowkv
