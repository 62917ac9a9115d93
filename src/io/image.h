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

#include "flowkv/image.h"
#include "flowkv/limits.h"

namespace flowkv {

// Refuses an image size that is empty or beyond limits::kMaxImageSide / kMaxImagePixels.
void check_image_size(int64_t width, int64_t height, const std::string& what);

// The Image type, load_image, save_png and encode_png are public: flowkv/image.h.

// Decodes bytes in memory; `what` names the source in errors. `max_pixels` (at most the limit)
// lets a caller bound the work further (the fuzz targets: a small file may claim, and cost the
// decoding of, a large image).
Image decode_image(const uint8_t* data, size_t size, const std::string& what,
                   int64_t max_pixels = limits::kMaxImagePixels,
                   PixelFormat format = PixelFormat::kRGB);

// The "parameters" text of a PNG file ("" when absent).
std::string read_png_parameters(const std::string& path);

// PIL's Image.resize((width, height), Image.LANCZOS) on an RGB or RGBA image: Lanczos-3 scaled
// by the reduction factor (antialiased), horizontal pass then vertical, 22-bit fixed-point
// coefficients with 8-bit clipped intermediate rows, exactly as Pillow 13.0.0 rounds. RGBA is
// resized premultiplied, as PIL does (RGBA -> RGBa -> resize -> RGBA).
Image resize_lanczos(const Image& src, int64_t width, int64_t height);
// PIL's Image.resize((width, height), Image.BICUBIC): Keys' cubic (a = -0.5), support 2 scaled
// by the reduction factor, with the same fixed-point passes and rounding as resize_lanczos
// (the Qwen2-VL / Qwen3-VL image processor's PIL path).
Image resize_bicubic(const Image& src, int64_t width, int64_t height);
// PIL's convert("RGBA") of an RGB image (alpha 255); an RGBA image is returned as it is.
Image to_rgba(const Image& image);
// PIL's convert("RGB") of an RGBA image: alpha dropped (not composited); RGB is returned as is.
Image to_rgb(const Image& image);
// An RGBA image pasted over opaque white through its alpha, as
// Image.new("RGB", size, white).paste(image, mask=image.getchannel("A")) rounds: RGB out.
Image over_white(const Image& rgba);
// The pixels [x, x + width) x [y, y + height), which must lie inside the image.
Image crop(const Image& src, int64_t x, int64_t y, int64_t width, int64_t height);

}  // namespace flowkv
