// Image files: PNG (libspng) and JPEG (libjpeg-turbo's TurboJPEG) in, PNG out, and PIL's
// Lanczos resize. Decoding gives what diffusers' load_image gives: PIL's Image.open, then
// ImageOps.exif_transpose, then convert("RGB"), as 8-bit RGB pixels:
// - grey is replicated; alpha (grey + alpha, RGBA, palette tRNS) is dropped, not composited;
// - 16-bit samples keep their high byte, except 16-bit grey without alpha, which PIL opens as
//   "I;16" and converts by clipping at 255 (a sample of 1000 becomes 255);
// - 1, 2 and 4-bit grey are scaled to 0..255; palettes are looked up;
// - CMYK and YCCK JPEGs are read with Adobe's inverted polarity and converted as PIL does
//   (R = 255 - K - C (255 - K) / 255, rounded);
// - the EXIF orientation (JPEG APP1 Exif, PNG eXIf; else XMP tiff:Orientation) is applied.
// Every failure is a flowkv::Error naming the file: not an image, corrupt, truncated, or
// larger than limits::kMaxImagePixels (checked from the header, before pixels are allocated).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "flowkv/limits.h"

namespace flowkv {

// 8-bit RGB pixels, rows top to bottom, [H, W, 3].
struct Image {
  static constexpr int64_t kChannels = 3;
  int64_t width = 0, height = 0;
  std::vector<uint8_t> pixels;

  uint8_t* at(int64_t x, int64_t y) { return pixels.data() + (y * width + x) * 3; }
  const uint8_t* at(int64_t x, int64_t y) const { return pixels.data() + (y * width + x) * 3; }
  // An image of the given size, pixels zero; the size is checked against the limits.
  static Image blank(int64_t width, int64_t height, const std::string& what);
};

// 8-bit RGBA pixels with straight (not premultiplied) alpha, rows top to bottom, [H, W, 4]:
// PIL's "RGBA" mode, what Qwen-Image-2.1's VAE reads and writes.
struct ImageRgba {
  static constexpr int64_t kChannels = 4;
  int64_t width = 0, height = 0;
  std::vector<uint8_t> pixels;

  uint8_t* at(int64_t x, int64_t y) { return pixels.data() + (y * width + x) * 4; }
  const uint8_t* at(int64_t x, int64_t y) const { return pixels.data() + (y * width + x) * 4; }
  static ImageRgba blank(int64_t width, int64_t height, const std::string& what);
};

// PIL's convert("RGBA") of an RGB image: alpha 255.
ImageRgba to_rgba(const Image& rgb);
// PIL's convert("RGB") of an RGBA image: alpha dropped (not composited).
Image to_rgb(const ImageRgba& rgba);

// Refuses an image size that is empty or beyond limits::kMaxImageSide / kMaxImagePixels.
void check_image_size(int64_t width, int64_t height, const std::string& what);

// Reads and decodes a PNG or JPEG file (told apart by their signatures, not the name).
Image load_image(const std::string& path);
// Decodes bytes in memory; `what` names the source in errors. `max_pixels` (at most the limit)
// lets a caller bound the work further (the fuzz targets: a small file may claim, and cost the
// decoding of, a large image).
Image decode_image(const uint8_t* data, size_t size, const std::string& what,
                   int64_t max_pixels = limits::kMaxImagePixels);

// The same as PIL's Image.open, ImageOps.exif_transpose, then convert("RGBA") (what
// QwenImage21Pipeline does to a condition image that is not RGBA already): PNG alpha kept
// (grey + alpha replicated; 16-bit samples keep their high byte), a tRNS colour key or palette
// alpha applied, 255 elsewhere and for JPEG; the other rules as load_image.
ImageRgba load_image_rgba(const std::string& path);
ImageRgba decode_image_rgba(const uint8_t* data, size_t size, const std::string& what,
                            int64_t max_pixels = limits::kMaxImagePixels);

// PNG bytes of an RGB image; `parameters`, when not empty, goes into a text chunk of that name
// (tEXt when it is ASCII, else UTF-8 iTXt, as PIL's PngInfo.add_text writes it), where
// A1111-style tools and PIL's Image.info["parameters"] find it.
std::string encode_png(const Image& image, const std::string& parameters = "");
// An RGBA image as an 8-bit RGBA PNG, likewise (PIL's save of an "RGBA" image).
std::string encode_png(const ImageRgba& image, const std::string& parameters = "");
// Writes encode_png's bytes atomically (io/atomic_file.h): the old file or the whole new one.
void save_png(const std::string& path, const Image& image, const std::string& parameters = "");
void save_png(const std::string& path, const ImageRgba& image, const std::string& parameters = "");
// The "parameters" text of a PNG file ("" when absent).
std::string read_png_parameters(const std::string& path);

// PIL's Image.resize((width, height), Image.LANCZOS) on an RGB image: Lanczos-3 scaled by the
// reduction factor (antialiased), horizontal pass then vertical, 22-bit fixed-point
// coefficients with 8-bit clipped intermediate rows, exactly as Pillow 13.0.0 rounds.
Image resize_lanczos(const Image& src, int64_t width, int64_t height);
// PIL's Image.resize on an RGBA image with LANCZOS: premultiplied by alpha (convert("RGBa"):
// c * a / 255 rounded as (t + (t >> 8)) >> 8 with t = c * a + 128), the four channels resized
// as above, then un-premultiplied (convert("RGBA"): min(255, 255 * c / a) truncated, c kept
// where a is 0 or 255). The same size returns a copy, as PIL does, without the round trip.
ImageRgba resize_lanczos(const ImageRgba& src, int64_t width, int64_t height);
// The pixels [x, x + width) x [y, y + height), which must lie inside the image.
Image crop(const Image& src, int64_t x, int64_t y, int64_t width, int64_t height);

}  // namespace flowkv
