// PNG and JPEG decoding to PIL's RGB, EXIF orientation, PNG encoding (see image.h).
#include "io/image.h"

#include <spng.h>
#include <turbojpeg.h>

#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <string_view>

#include "core/checked.h"
#include "flowkv/error.h"
#include "flowkv/limits.h"
#include "io/atomic_file.h"
#include "io/mapped_file.h"

namespace flowkv {

namespace {

constexpr uint8_t kPngSignature[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
// libjpeg decodes every scan of a progressive file again over the whole image: a small file
// with thousands of scans takes minutes. libjpeg-turbo's TJFLAG_LIMITSCANS stops at 500.
constexpr int kMaxJpegScans = 500;

}  // namespace

void check_image_size(int64_t width, int64_t height, const std::string& what) {
  FLOWKV_CHECK(width >= 1 && height >= 1, what, ": the image is ", width, "x", height,
               " pixels (empty)");
  FLOWKV_CHECK(width <= limits::kMaxImageSide && height <= limits::kMaxImageSide, what,
               ": the image is ", width, "x", height, " pixels; the largest side allowed is ",
               limits::kMaxImageSide);
  FLOWKV_CHECK(width * height <= limits::kMaxImagePixels, what, ": the image is ", width, "x",
               height, " = ", width * height, " pixels, more than the limit of ",
               limits::kMaxImagePixels, " (limits::kMaxImagePixels)");
}

namespace {

void check_pixels(int64_t width, int64_t height, int64_t max_pixels, const std::string& what) {
  FLOWKV_CHECK(width * height <= max_pixels, what, ": the image is ", width, "x", height, " = ",
               width * height, " pixels, more than the caller's limit of ", max_pixels);
}

// ---- EXIF and XMP orientation ----

// The Orientation tag (0x0112) of IFD0 of a TIFF-structured EXIF block (after "Exif\0\0").
std::optional<int> exif_orientation(std::string_view t) {
  if (t.size() >= 6 && t.substr(0, 6) == std::string_view("Exif\0\0", 6)) t.remove_prefix(6);
  if (t.size() < 8) return std::nullopt;
  const bool le = t.substr(0, 2) == "II";
  if (!le && t.substr(0, 2) != "MM") return std::nullopt;
  auto u16 = [&](size_t o) -> uint32_t {
    const auto a = static_cast<uint8_t>(t[o]), b = static_cast<uint8_t>(t[o + 1]);
    return le ? a | (b << 8) : (a << 8) | b;
  };
  auto u32 = [&](size_t o) -> uint32_t {
    return le ? u16(o) | (u16(o + 2) << 16) : (u16(o) << 16) | u16(o + 2);
  };
  const uint64_t ifd = u32(4);
  if (ifd + 2 > t.size()) return std::nullopt;
  const uint32_t n = u16(static_cast<size_t>(ifd));
  for (uint32_t i = 0; i < n; ++i) {
    const uint64_t e = ifd + 2 + uint64_t{12} * i;
    if (e + 12 > t.size()) break;
    if (u16(e) != 0x0112) continue;
    const uint32_t type = u16(e + 2);
    if (type == 3) return static_cast<int>(u16(e + 8));  // SHORT
    if (type == 4) return static_cast<int>(u32(e + 8));  // LONG
    return std::nullopt;
  }
  return std::nullopt;
}

// PIL's fallback: the first digit after tiff:Orientation=" or tiff:Orientation> in XMP.
std::optional<int> xmp_orientation(std::string_view xmp) {
  for (size_t p = xmp.find("tiff:Orientation"); p != std::string_view::npos;
       p = xmp.find("tiff:Orientation", p + 1)) {
    const size_t q = p + 16;
    if (q + 1 < xmp.size() && (xmp.substr(q, 2) == "=\"" || xmp[q] == '>')) {
      const size_t d = xmp[q] == '>' ? q + 1 : q + 2;
      if (d < xmp.size() && xmp[d] >= '0' && xmp[d] <= '9') return xmp[d] - '0';
    }
  }
  return std::nullopt;
}

// ImageOps.exif_transpose: orientations 2..8 as PIL's transposes; anything else leaves it.
Image apply_orientation(Image src, int orientation) {
  if (orientation < 2 || orientation > 8) return src;
  const int64_t w = src.width, h = src.height;
  const bool swap = orientation >= 5;  // transpose, rotate 270, transverse, rotate 90
  Image out;
  out.width = swap ? h : w;
  out.height = swap ? w : h;
  out.channels = src.channels;
  out.pixels.resize(src.pixels.size());
  for (int64_t y = 0; y < out.height; ++y) {
    for (int64_t x = 0; x < out.width; ++x) {
      int64_t sx = 0, sy = 0;  // the source pixel shown at (x, y)
      switch (orientation) {
        case 2:
          sx = w - 1 - x, sy = y;
          break;  // FLIP_LEFT_RIGHT
        case 3:
          sx = w - 1 - x, sy = h - 1 - y;
          break;  // ROTATE_180
        case 4:
          sx = x, sy = h - 1 - y;
          break;  // FLIP_TOP_BOTTOM
        case 5:
          sx = y, sy = x;
          break;  // TRANSPOSE
        case 6:
          sx = y, sy = h - 1 - x;
          break;  // ROTATE_270 (clockwise 90)
        case 7:
          sx = w - 1 - y, sy = h - 1 - x;
          break;  // TRANSVERSE
        case 8:
          sx = w - 1 - y, sy = x;
          break;  // ROTATE_90 (counter-clockwise)
      }
      std::memcpy(out.at(x, y), src.at(sx, sy), static_cast<size_t>(src.channels));
    }
  }
  return out;
}

// ---- PNG ----

struct SpngDeleter {
  void operator()(spng_ctx* c) const { spng_ctx_free(c); }
};
using SpngCtx = std::unique_ptr<spng_ctx, SpngDeleter>;

Image decode_png(const uint8_t* data, size_t size, const std::string& what, int64_t max_pixels,
                 PixelFormat format) {
  SpngCtx ctx(spng_ctx_new(0));
  FLOWKV_CHECK(ctx, what, ": out of memory creating the PNG decoder");
  auto check = [&](int r, const char* stage) {
    FLOWKV_CHECK(r == 0, what, ": not a valid PNG file (", stage, ": ", spng_strerror(r), ")");
  };
  // Text and other ancillary chunks are held in memory: bound them, and the dimensions
  // (spng refuses larger ones while reading the header).
  check(spng_set_chunk_limits(ctx.get(), size_t{16} << 20, size_t{64} << 20), "limits");
  check(spng_set_image_limits(ctx.get(), static_cast<uint32_t>(limits::kMaxImageSide),
                              static_cast<uint32_t>(limits::kMaxImageSide)),
        "limits");
  check(spng_set_png_buffer(ctx.get(), data, size), "input");
  spng_ihdr ihdr{};
  const int hr = spng_get_ihdr(ctx.get(), &ihdr);
  if (hr == SPNG_EWIDTH || hr == SPNG_EHEIGHT || hr == SPNG_EUSER_WIDTH ||
      hr == SPNG_EUSER_HEIGHT) {
    fail(what, ": the PNG header gives a size outside the limits (", spng_strerror(hr),
         "; the largest side allowed is ", limits::kMaxImageSide, ")");
  }
  check(hr, "header");
  check_image_size(ihdr.width, ihdr.height, what);
  check_pixels(ihdr.width, ihdr.height, max_pixels, what);

  // 16-bit grey without alpha: PIL's "I;16", which convert("RGB") clips at 255.
  // A colour key (tRNS of grey or RGB) is alpha to convert("RGBA") only.
  const bool grey16 = ihdr.color_type == SPNG_COLOR_TYPE_GRAYSCALE && ihdr.bit_depth == 16;
  const bool rgba = format == PixelFormat::kRGBA;
  const int fmt = grey16 ? SPNG_FMT_RAW : rgba ? SPNG_FMT_RGBA8 : SPNG_FMT_RGB8;
  const int channels = rgba ? 4 : 3;
  size_t bytes = 0;
  check(spng_decoded_image_size(ctx.get(), fmt, &bytes), "size");
  Image img = Image::blank(ihdr.width, ihdr.height, what, channels);
  std::vector<uint8_t> raw;
  uint8_t* out = img.pixels.data();
  if (grey16) {
    raw.resize(bytes);
    out = raw.data();
  } else {
    FLOWKV_CHECK(bytes == img.pixels.size(), what, ": unexpected decoded PNG size");
  }
  check(spng_decode_image(ctx.get(), out, bytes, fmt, rgba && !grey16 ? SPNG_DECODE_TRNS : 0),
        "image data");
  if (grey16) {
    // PIL's "I;16" keeps a tRNS key as info["transparency"]; convert("RGBA") of "I;16" goes
    // through "L" (clipped) and drops it: opaque.
    for (int64_t i = 0; i < img.width * img.height; ++i) {
      const int v = (raw[2 * i] << 8) | raw[2 * i + 1];
      const auto c = static_cast<uint8_t>(v > 255 ? 255 : v);
      uint8_t* p = img.pixels.data() + channels * i;
      p[0] = p[1] = p[2] = c;
      if (rgba) p[3] = 255;
    }
  }

  // Orientation: eXIf (read with the chunks after the image data), else XMP in iTXt.
  std::optional<int> orientation;
  spng_exif exif{};
  if (spng_get_exif(ctx.get(), &exif) == 0 && exif.data != nullptr) {
    orientation = exif_orientation(std::string_view(exif.data, exif.length));
  }
  if (!orientation) {
    uint32_t n = 0;
    if (spng_get_text(ctx.get(), nullptr, &n) == 0 && n > 0) {
      std::vector<spng_text> text(n);
      if (spng_get_text(ctx.get(), text.data(), &n) == 0) {
        for (const spng_text& t : text) {
          if (std::string_view(t.keyword) == "XML:com.adobe.xmp" && t.text != nullptr) {
            orientation = xmp_orientation(std::string_view(t.text, t.length));
          }
        }
      }
    }
  }
  return orientation ? apply_orientation(std::move(img), *orientation) : img;
}

// ---- JPEG ----

struct JpegMetadata {
  std::optional<int> orientation;
  int scans = 0;
};

// Walks the JPEG's markers: the EXIF and XMP blocks as PIL keeps them (every APP1 Exif payload
// appended to the first, the last XMP) and the number of scans. Malformed structure is left
// for libjpeg to report.
JpegMetadata scan_jpeg(const uint8_t* d, size_t n) {
  JpegMetadata m;
  std::string exif;
  std::string_view xmp;
  size_t p = 2;  // after SOI
  while (p + 4 <= n) {
    if (d[p] != 0xFF) break;
    const uint8_t marker = d[p + 1];
    if (marker == 0xFF) {  // fill byte
      ++p;
      continue;
    }
    if (marker == 0xD8 || marker == 0x01 || (marker >= 0xD0 && marker <= 0xD7)) {
      p += 2;
      continue;
    }
    if (marker == 0xD9) break;  // EOI
    const size_t len = (size_t{d[p + 2]} << 8) | d[p + 3];
    if (len < 2 || p + 2 + len > n) break;
    const std::string_view seg(reinterpret_cast<const char*>(d + p + 4), len - 2);
    if (marker == 0xE1 && seg.substr(0, 6) == std::string_view("Exif\0\0", 6)) {
      exif += exif.empty() ? seg : seg.substr(6);
    } else if (marker == 0xE1 &&
               seg.substr(0, 29) == std::string_view("http://ns.adobe.com/xap/1.0/\0", 29)) {
      xmp = seg.substr(29);
    }
    p += 2 + len;
    if (marker == 0xDA) {  // SOS: skip the entropy-coded data to the next real marker
      if (++m.scans > kMaxJpegScans) break;
      while (p + 1 < n &&
             !(d[p] == 0xFF && d[p + 1] != 0x00 && !(d[p + 1] >= 0xD0 && d[p + 1] <= 0xD7))) {
        ++p;
      }
    }
  }
  if (!exif.empty()) m.orientation = exif_orientation(exif);
  if (!m.orientation && !xmp.empty()) m.orientation = xmp_orientation(xmp);
  return m;
}

struct TjDeleter {
  void operator()(void* h) const { tjDestroy(h); }
};

Image decode_jpeg(const uint8_t* data, size_t size, const std::string& what, int64_t max_pixels,
                  PixelFormat format) {
  const JpegMetadata meta = scan_jpeg(data, size);
  FLOWKV_CHECK(meta.scans <= kMaxJpegScans, what, ": the JPEG has more than ", kMaxJpegScans,
               " scans (a progressive file this fragmented is refused: decoding it costs one pass "
               "over the whole image per scan)");
  std::unique_ptr<void, TjDeleter> tj(tjInitDecompress());
  FLOWKV_CHECK(tj, what, ": cannot create the JPEG decoder: ", tjGetErrorStr2(nullptr));
  FLOWKV_CHECK(size <= static_cast<size_t>(ULONG_MAX), what, ": file too large");
  int w = 0, h = 0, subsamp = 0, colorspace = 0;
  FLOWKV_CHECK(tjDecompressHeader3(tj.get(), data, static_cast<unsigned long>(size), &w, &h,
                                   &subsamp, &colorspace) == 0,
               what, ": not a valid JPEG file (", tjGetErrorStr2(tj.get()), ")");
  FLOWKV_CHECK(w > 0 && h > 0, what, ": not a valid JPEG file (no frame header)");
  check_image_size(w, h, what);
  check_pixels(w, h, max_pixels, what);
  const bool cmyk = colorspace == TJCS_CMYK || colorspace == TJCS_YCCK;
  Image img = Image::blank(w, h, what);
  std::vector<uint8_t> four;
  uint8_t* out = img.pixels.data();
  if (cmyk) {
    four.resize(static_cast<size_t>(checked_mul(img.width * img.height, 4, what)));
    out = four.data();
  }
  // libjpeg's warnings are not fatal to PIL (e.g. extraneous bytes before a marker), except a
  // premature end: PIL refuses a truncated file, where libjpeg would pad it with grey.
  const int r = tjDecompress2(tj.get(), data, static_cast<unsigned long>(size), out, w, 0, h,
                              cmyk ? TJPF_CMYK : TJPF_RGB, 0);
  if (r != 0) {
    const std::string msg = tjGetErrorStr2(tj.get());
    const bool warning = tjGetErrorCode(tj.get()) == TJERR_WARNING;
    FLOWKV_CHECK(warning && msg.find("Premature end") == std::string::npos, what,
                 warning ? ": truncated JPEG data (" : ": corrupt JPEG data (", msg, ")");
  }
  if (cmyk) {
    // PIL reads 4-channel JPEGs as Adobe's inverted CMYK ("CMYK;I"), then converts to RGB with
    // each channel = (255 - K) - C (255 - K) / 255 in its rounded integer form.
    for (int64_t i = 0; i < img.width * img.height; ++i) {
      const int nk = four[4 * i + 3];  // 255 - K, K being the inverted stored value
      for (int c = 0; c < 3; ++c) {
        const int v = 255 - four[4 * i + c];  // C, M or Y
        const int t = v * nk + 128;
        const int mul = ((t >> 8) + t) >> 8;
        const int o = nk - mul;
        img.pixels[3 * i + c] = static_cast<uint8_t>(o < 0 ? 0 : o > 255 ? 255 : o);
      }
    }
  }
  if (format == PixelFormat::kRGBA) img = to_rgba(img);
  return meta.orientation ? apply_orientation(std::move(img), *meta.orientation) : img;
}

}  // namespace

Image Image::blank(int64_t width, int64_t height, const std::string& what, int64_t channels) {
  check_image_size(width, height, what);
  FLOWKV_CHECK(channels == 3 || channels == 4, what, ": ", channels,
               " channels (RGB or RGBA expected)");
  Image img;
  img.width = width;
  img.height = height;
  img.channels = channels;
  img.pixels.assign(static_cast<size_t>(width * height * channels), 0);
  return img;
}

Image decode_image(const uint8_t* data, size_t size, const std::string& what, int64_t max_pixels,
                   PixelFormat format) {
  FLOWKV_CHECK(size > 0, what, ": the file is empty, not an image");
  if (size >= 8 && std::memcmp(data, kPngSignature, 8) == 0)
    return decode_png(data, size, what, max_pixels, format);
  if (size >= 3 && data[0] == 0xFF && data[1] == 0xD8 && data[2] == 0xFF) {
    return decode_jpeg(data, size, what, max_pixels, format);
  }
  fail(what, ": not a PNG or JPEG file (unrecognised signature)");
}

Image load_image(const std::string& path, PixelFormat format) {
  const std::string bytes = read_file(path, limits::kMaxImageFileBytes, "image");
  return decode_image(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), "image " + path,
                      limits::kMaxImagePixels, format);
}

Image to_rgba(const Image& image) {
  if (image.channels == 4) return image;
  FLOWKV_CHECK(image.channels == 3, "to_rgba: ", image.channels, " channels");
  Image out = Image::blank(image.width, image.height, "RGBA image", 4);
  for (int64_t i = 0; i < image.width * image.height; ++i) {
    std::memcpy(&out.pixels[4 * i], &image.pixels[3 * i], 3);
    out.pixels[4 * i + 3] = 255;
  }
  return out;
}

Image to_rgb(const Image& image) {
  if (image.channels == 3) return image;
  FLOWKV_CHECK(image.channels == 4, "to_rgb: ", image.channels, " channels");
  Image out = Image::blank(image.width, image.height, "RGB image", 3);
  for (int64_t i = 0; i < image.width * image.height; ++i) {
    std::memcpy(&out.pixels[3 * i], &image.pixels[4 * i], 3);
  }
  return out;
}

Image over_white(const Image& rgba) {
  FLOWKV_CHECK(rgba.channels == 4, "over_white: ", rgba.channels, " channels (RGBA expected)");
  Image out = Image::blank(rgba.width, rgba.height, "RGB image", 3);
  for (int64_t i = 0; i < rgba.width * rgba.height; ++i) {
    const int a = rgba.pixels[4 * i + 3];
    for (int c = 0; c < 3; ++c) {
      // Paste.c's BLEND: DIV255(white * (255 - a) + colour * a), DIV255(v) = ((v + 128) >> 8 +
      // v + 128) >> 8.
      const int t = 255 * (255 - a) + rgba.pixels[4 * i + c] * a + 128;
      out.pixels[3 * i + c] = static_cast<uint8_t>(((t >> 8) + t) >> 8);
    }
  }
  return out;
}

std::string encode_png(const Image& image, const std::string& parameters) {
  check_image_size(image.width, image.height, "PNG to write");
  FLOWKV_CHECK(image.channels == 3 || image.channels == 4, "PNG to write: ", image.channels,
               " channels (RGB or RGBA expected)");
  FLOWKV_CHECK(
      image.pixels.size() == static_cast<size_t>(image.width * image.height * image.channels),
      "PNG to write: ", image.pixels.size(), " bytes of pixels for ", image.width, "x",
      image.height, image.channels == 4 ? " RGBA" : " RGB");
  FLOWKV_CHECK(static_cast<int64_t>(parameters.size()) <= limits::kMaxPngTextBytes,
               "PNG parameters text: ", parameters.size(), " bytes, more than the limit of ",
               limits::kMaxPngTextBytes);
  FLOWKV_CHECK(parameters.find('\0') == std::string::npos,
               "PNG parameters text: contains a NUL byte");
  SpngCtx ctx(spng_ctx_new(SPNG_CTX_ENCODER));
  FLOWKV_CHECK(ctx, "out of memory creating the PNG encoder");
  auto check = [](int r, const char* stage) {
    FLOWKV_CHECK(r == 0, "encoding PNG (", stage, "): ", spng_strerror(r));
  };
  check(spng_set_option(ctx.get(), SPNG_ENCODE_TO_BUFFER, 1), "buffer");
  spng_ihdr ihdr{};
  ihdr.width = static_cast<uint32_t>(image.width);
  ihdr.height = static_cast<uint32_t>(image.height);
  ihdr.bit_depth = 8;
  ihdr.color_type =
      image.channels == 4 ? SPNG_COLOR_TYPE_TRUECOLOR_ALPHA : SPNG_COLOR_TYPE_TRUECOLOR;
  check(spng_set_ihdr(ctx.get(), &ihdr), "header");
  spng_text text{};
  std::string body = parameters;  // spng takes a non-const pointer
  if (!parameters.empty()) {
    std::snprintf(text.keyword, sizeof(text.keyword), "%s", "parameters");
    bool ascii = true;
    for (const char c : parameters) ascii = ascii && static_cast<unsigned char>(c) < 0x80;
    text.type = ascii ? SPNG_TEXT : SPNG_ITXT;
    text.length = body.size();
    text.text = body.data();
    text.language_tag = const_cast<char*>("");
    text.translated_keyword = const_cast<char*>("");
    check(spng_set_text(ctx.get(), &text, 1), "text chunk");
  }
  check(spng_encode_image(ctx.get(), image.pixels.data(), image.pixels.size(), SPNG_FMT_PNG,
                          SPNG_ENCODE_FINALIZE),
        "image");
  size_t len = 0;
  int err = 0;
  void* buf = spng_get_png_buffer(ctx.get(), &len, &err);
  check(err, "output");
  std::string out(static_cast<const char*>(buf), len);
  std::free(buf);
  return out;
}

void save_png(const std::string& path, const Image& image, const std::string& parameters) {
  const std::string bytes = encode_png(image, parameters);
  AtomicFile file(path);
  file.write(bytes);
  file.commit();
}

std::string read_png_parameters(const std::string& path) {
  const std::string bytes = read_file(path, limits::kMaxImageFileBytes, "image");
  SpngCtx ctx(spng_ctx_new(0));
  FLOWKV_CHECK(ctx, "out of memory creating the PNG decoder");
  spng_set_chunk_limits(ctx.get(), size_t{16} << 20, size_t{64} << 20);
  spng_set_png_buffer(ctx.get(), bytes.data(), bytes.size());
  spng_ihdr ihdr{};
  const int r = spng_get_ihdr(ctx.get(), &ihdr);
  FLOWKV_CHECK(r == 0, "image ", path, ": not a valid PNG file (", spng_strerror(r), ")");
  uint32_t n = 0;
  if (spng_get_text(ctx.get(), nullptr, &n) != 0 || n == 0) return "";
  std::vector<spng_text> text(n);
  if (spng_get_text(ctx.get(), text.data(), &n) != 0) return "";
  for (const spng_text& t : text) {
    if (std::string_view(t.keyword) == "parameters") return std::string(t.text, t.length);
  }
  return "";
}

}  // namespace flowkv
