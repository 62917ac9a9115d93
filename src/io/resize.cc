// PIL's Lanczos resize of 8-bit images, rounding as Pillow does (Resample.c's behaviour, read
// to match its numbers; the code is ours):
// - per output pixel, a window of input pixels centred at (i + 0.5) * scale, of half-width
//   3 * max(scale, 1), weighted by lanczos3((x - centre + 0.5) / max(scale, 1)) and normalised
//   to sum 1 in double;
// - weights become 22-bit fixed point (round half away from zero), sums start at 2^21 (a half)
//   and are clipped to 0..255 after the shift;
// - the horizontal pass runs first, over the rows the vertical pass needs, into 8-bit rows; a
//   pass whose size does not change is skipped.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numbers>
#include <vector>

#include "flowkv/error.h"
#include "io/image.h"

namespace flowkv {

namespace {

constexpr int kPrecisionBits = 32 - 8 - 2;

double sinc(double x) {
  if (x == 0.0) return 1.0;
  x *= std::numbers::pi;
  return std::sin(x) / x;
}

double lanczos3(double x) {
  return (x >= -3.0 && x < 3.0) ? sinc(x) * sinc(x / 3.0) : 0.0;
}

// The fixed-point taps of one axis: for output i, inputs [first[i], first[i] + count[i]) with
// weights taps[i * ksize ...].
struct Taps {
  int64_t ksize = 0;
  std::vector<int64_t> first, count;
  std::vector<int32_t> taps;
};

Taps make_taps(int64_t in_size, int64_t out_size) {
  const double scale = static_cast<double>(in_size) / static_cast<double>(out_size);
  const double filter_scale = scale < 1.0 ? 1.0 : scale;
  const double support = 3.0 * filter_scale;
  Taps t;
  t.ksize = static_cast<int64_t>(std::ceil(support)) * 2 + 1;
  t.first.resize(static_cast<size_t>(out_size));
  t.count.resize(static_cast<size_t>(out_size));
  t.taps.assign(static_cast<size_t>(out_size * t.ksize), 0);
  std::vector<double> w(static_cast<size_t>(t.ksize));
  for (int64_t i = 0; i < out_size; ++i) {
    const double centre = (static_cast<double>(i) + 0.5) * scale;
    const double inv = 1.0 / filter_scale;
    // Truncation toward zero, as a C cast of the rounded bound.
    int64_t lo = static_cast<int64_t>(centre - support + 0.5);
    if (lo < 0) lo = 0;
    int64_t hi = static_cast<int64_t>(centre + support + 0.5);
    if (hi > in_size) hi = in_size;
    const int64_t n = hi - lo;
    double sum = 0.0;
    for (int64_t x = 0; x < n; ++x) {
      w[x] = lanczos3((static_cast<double>(x + lo) - centre + 0.5) * inv);
      sum += w[x];
    }
    for (int64_t x = 0; x < n; ++x) {
      const double v = sum != 0.0 ? w[x] / sum : w[x];
      const double f = v * (1 << kPrecisionBits);
      t.taps[i * t.ksize + x] = static_cast<int32_t>(v < 0 ? -0.5 + f : 0.5 + f);
    }
    t.first[i] = lo;
    t.count[i] = n;
  }
  return t;
}

uint8_t clip8(int64_t v) {
  if (v >= (int64_t{1} << kPrecisionBits << 8)) return 255;
  if (v <= 0) return 0;
  return static_cast<uint8_t>(v >> kPrecisionBits);
}

// Rows [row0, row0 + rows) of src, resized horizontally to t's output width.
template <class Img>
Img horizontal(const Img& src, const Taps& t, int64_t out_w, int64_t row0, int64_t rows) {
  constexpr int64_t C = Img::kChannels;
  Img out;
  out.width = out_w;
  out.height = rows;
  out.pixels.resize(static_cast<size_t>(out_w * rows * C));
  for (int64_t y = 0; y < rows; ++y) {
    const uint8_t* in = src.at(0, row0 + y);
    for (int64_t x = 0; x < out_w; ++x) {
      const int32_t* k = &t.taps[x * t.ksize];
      const uint8_t* p = in + t.first[x] * C;
      int64_t acc[C];
      for (int64_t c = 0; c < C; ++c) acc[c] = 1 << (kPrecisionBits - 1);
      for (int64_t i = 0; i < t.count[x]; ++i) {
        for (int64_t c = 0; c < C; ++c) acc[c] += p[C * i + c] * k[i];
      }
      uint8_t* o = out.at(x, y);
      for (int64_t c = 0; c < C; ++c) o[c] = clip8(acc[c]);
    }
  }
  return out;
}

// src resized vertically; t's input rows start at row `shift` of the original image.
template <class Img>
Img vertical(const Img& src, const Taps& t, int64_t out_h, int64_t shift) {
  Img out;
  out.width = src.width;
  out.height = out_h;
  const int64_t stride = src.width * Img::kChannels;
  out.pixels.resize(static_cast<size_t>(stride * out_h));
  // Whole rows at a time (contiguous, vectorisable). 32-bit sums as Pillow's: 255 times the
  // positive taps (at most ~1.3 x 2^22) stays far below 2^31.
  std::vector<int32_t> acc(static_cast<size_t>(stride));
  for (int64_t y = 0; y < out_h; ++y) {
    const int32_t* k = &t.taps[y * t.ksize];
    const uint8_t* base = src.pixels.data() + (t.first[y] - shift) * stride;
    std::fill(acc.begin(), acc.end(), int32_t{1} << (kPrecisionBits - 1));
    for (int64_t i = 0; i < t.count[y]; ++i) {
      const uint8_t* row = base + i * stride;
      const int32_t w = k[i];
      for (int64_t c = 0; c < stride; ++c) acc[c] += row[c] * w;
    }
    uint8_t* o = out.at(0, y);
    for (int64_t c = 0; c < stride; ++c) o[c] = clip8(acc[c]);
  }
  return out;
}

template <class Img>
Img resize_any(const Img& src, int64_t width, int64_t height) {
  const Taps th = make_taps(src.width, width), tv = make_taps(src.height, height);
  const bool need_h = width != src.width, need_v = height != src.height;
  if (!need_v) return horizontal(src, th, width, 0, src.height);
  // The input rows the vertical pass reads.
  const int64_t row0 = tv.first[0];
  const int64_t row1 = tv.first[height - 1] + tv.count[height - 1];
  if (!need_h) return vertical(src, tv, height, 0);
  const Img tmp = horizontal(src, th, width, row0, row1 - row0);
  return vertical(tmp, tv, height, row0);
}

}  // namespace

Image resize_lanczos(const Image& src, int64_t width, int64_t height) {
  check_image_size(src.width, src.height, "resize: the source image");
  check_image_size(width, height, "resize: the target size");
  if (width == src.width && height == src.height) return src;
  return resize_any(src, width, height);
}

ImageRgba resize_lanczos(const ImageRgba& src, int64_t width, int64_t height) {
  check_image_size(src.width, src.height, "resize: the source image");
  check_image_size(width, height, "resize: the target size");
  if (width == src.width && height == src.height) return src;
  // convert("RGBa"): Pillow's MULDIV255.
  ImageRgba pm = src;
  for (size_t i = 0; i < pm.pixels.size(); i += 4) {
    const uint32_t a = pm.pixels[i + 3];
    for (size_t c = 0; c < 3; ++c) {
      const uint32_t t = pm.pixels[i + c] * a + 128;
      pm.pixels[i + c] = static_cast<uint8_t>(((t >> 8) + t) >> 8);
    }
  }
  ImageRgba out = resize_any(pm, width, height);
  // convert("RGBA") from "RGBa": 255 * c / a, truncated and clipped; kept where a is 0 or 255.
  for (size_t i = 0; i < out.pixels.size(); i += 4) {
    const uint32_t a = out.pixels[i + 3];
    if (a == 0 || a == 255) continue;
    for (size_t c = 0; c < 3; ++c) {
      out.pixels[i + c] =
          static_cast<uint8_t>(std::min<uint32_t>(255, 255 * uint32_t{out.pixels[i + c]} / a));
    }
  }
  return out;
}

Image crop(const Image& src, int64_t x, int64_t y, int64_t width, int64_t height) {
  FLOWKV_CHECK(x >= 0 && y >= 0 && width >= 1 && height >= 1 && x + width <= src.width &&
                   y + height <= src.height,
               "crop: ", width, "x", height, " at (", x, ", ", y, ") is outside the ", src.width,
               "x", src.height, " image");
  Image out;
  out.width = width;
  out.height = height;
  out.pixels.resize(static_cast<size_t>(width * height * 3));
  for (int64_t r = 0; r < height; ++r) {
    std::memcpy(out.at(0, r), src.at(x, y + r), static_cast<size_t>(width * 3));
  }
  return out;
}

}  // namespace flowkv
