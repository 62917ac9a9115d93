#include "models/qwen3_vl/image_processor.h"

#include <cmath>
#include <cstring>

#include "core/boundary.h"
#include "core/checked.h"
#include "core/memory.h"
#include "flowkv/error.h"
#include "flowkv/limits.h"

namespace flowkv::qwen3_vl {

namespace {

constexpr int64_t kMaxPatch = 1024;
constexpr int64_t kMaxFactor = 64;

// Python's round(x) for a non-negative double: half to even.
int64_t py_round(double x) {
  const double fl = std::floor(x), diff = x - fl;
  const auto i = static_cast<int64_t>(fl);
  if (diff > 0.5) return i + 1;
  if (diff < 0.5) return i;
  return i % 2 == 0 ? i : i + 1;
}

std::string string_field(const Json& j, const char* key, const std::string& def,
                         const std::string& src) {
  if (!j.contains(key) || j[key].is_null()) return def;
  FLOWKV_CHECK(j[key].is_string(), src, ": ", key, " must be a string");
  return j[key].get<std::string>();
}

// image_mean / image_std: a list of three numbers, or one number for every channel.
std::array<double, 3> triple(const Json& j, const char* key, const std::array<double, 3>& def,
                             const std::string& src) {
  if (!j.contains(key) || j[key].is_null()) return def;
  const Json& v = j[key];
  std::array<double, 3> out{};
  if (v.is_number()) {
    const double x = json_number(j, key, 0, -1e6, 1e6, src);
    return {x, x, x};
  }
  FLOWKV_CHECK(v.is_array() && v.size() == 3, src, ": ", key,
               " must be a number or a list of 3 numbers (one per RGB channel)");
  for (size_t i = 0; i < 3; ++i) {
    const std::string where = src + ": " + key + "[" + std::to_string(i) + "]";
    FLOWKV_CHECK(v[i].is_number() && std::isfinite(v[i].get<double>()) &&
                     std::abs(v[i].get<double>()) <= 1e6,
                 where, " must be a finite number");
    out[i] = v[i].get<double>();
  }
  return out;
}

ImageProcessorConfig from_json_unguarded(const Json& j, const std::string& src) {
  FLOWKV_CHECK(j.is_object(), src, ": preprocessor config is not a JSON object");
  const std::string type = string_field(j, "image_processor_type", "Qwen2VLImageProcessor", src);
  FLOWKV_CHECK(type == "Qwen2VLImageProcessor" || type == "Qwen2VLImageProcessorFast" ||
                   type == "Qwen2VLImageProcessorPil",
               src, ": image_processor_type is \"", type,
               "\": only the Qwen2-VL image processor (used by Qwen3-VL) is supported");
  ImageProcessorConfig c;
  c.patch_size = json_int(j, "patch_size", c.patch_size, 1, kMaxPatch, src);
  c.temporal_patch_size = json_int(j, "temporal_patch_size", c.temporal_patch_size, 1, 64, src);
  c.merge_size = json_int(j, "merge_size", c.merge_size, 1, kMaxFactor, src);
  // Qwen2VLImageProcessorPil.__init__: top-level min_pixels / max_pixels override
  // size.shortest_edge / size.longest_edge.
  if (j.contains("size") && !j["size"].is_null()) {
    const Json& s = j["size"];
    const std::string where = src + ": size";
    FLOWKV_CHECK(s.is_object(), where, " must be an object");
    FLOWKV_CHECK(!s.contains("height") && !s.contains("width"), where,
                 " has height/width: a fixed resize is not how the Qwen2-VL processor sizes "
                 "images (it needs shortest_edge and longest_edge)");
    c.min_pixels = json_int(s, "shortest_edge", c.min_pixels, 0, limits::kMaxImagePixels, where);
    c.max_pixels = json_int(s, "longest_edge", c.max_pixels, 0, limits::kMaxImagePixels, where);
  }
  c.min_pixels = json_int(j, "min_pixels", c.min_pixels, 0, limits::kMaxImagePixels, src);
  c.max_pixels = json_int(j, "max_pixels", c.max_pixels, 0, limits::kMaxImagePixels, src);
  c.do_resize = json_bool(j, "do_resize", c.do_resize, src);
  c.do_rescale = json_bool(j, "do_rescale", c.do_rescale, src);
  c.do_normalize = json_bool(j, "do_normalize", c.do_normalize, src);
  c.rescale_factor = json_number(j, "rescale_factor", c.rescale_factor, 0, 1e6, src);
  c.image_mean = triple(j, "image_mean", c.image_mean, src);
  c.image_std = triple(j, "image_std", c.image_std, src);
  const int64_t resample = json_int(j, "resample", 3, 0, 5, src);
  FLOWKV_CHECK(resample == 3, src, ": resample is ", resample,
               ": only 3 (PIL bicubic, the Qwen2-VL processor's default) is supported");
  FLOWKV_CHECK(!json_bool(j, "do_center_crop", false, src), src,
               ": do_center_crop is true: center cropping is not supported");
  FLOWKV_CHECK(!json_bool(j, "do_pad", false, src), src,
               ": do_pad is true: padding is not supported");
  c.validate(src);
  return c;
}

}  // namespace

ImageProcessorConfig ImageProcessorConfig::from_json(const Json& j, const std::string& src) {
  return at_input_boundary(src, [&] { return from_json_unguarded(j, src); });
}

ImageProcessorConfig ImageProcessorConfig::read(const std::string& path) {
  const Json j = read_json_file(path);
  return from_json(j, path);
}

void ImageProcessorConfig::validate(const std::string& src) const {
  FLOWKV_CHECK(factor() <= kMaxPatch * 4, src, ": patch_size ", patch_size, " x merge_size ",
               merge_size, " is too large");
  FLOWKV_CHECK(min_pixels <= max_pixels, src, ": min_pixels (size.shortest_edge) ", min_pixels,
               " exceeds max_pixels (size.longest_edge) ", max_pixels);
  FLOWKV_CHECK(!do_resize || max_pixels >= factor() * factor(), src, ": max_pixels ", max_pixels,
               " is below one merged patch (", factor(), "x", factor(), " pixels)");
  for (int c = 0; c < 3; ++c) {
    FLOWKV_CHECK(!do_normalize || image_std[c] != 0, src, ": image_std[", c, "] is 0");
  }
}

std::array<int64_t, 2> smart_resize(int64_t height, int64_t width, int64_t factor,
                                    int64_t min_pixels, int64_t max_pixels) {
  FLOWKV_CHECK(height >= 1 && width >= 1 && factor >= 1, "smart_resize: empty image ", width, "x",
               height);
  const double h = static_cast<double>(height), w = static_cast<double>(width);
  const double f = static_cast<double>(factor);
  FLOWKV_CHECK(std::max(h, w) / std::min(h, w) <= 200, "image processor: a ", width, "x", height,
               " image has an aspect ratio above 200, which the Qwen2-VL processor refuses");
  int64_t hb = py_round(h / f) * factor, wb = py_round(w / f) * factor;
  // Products in double: exact for every size within the image limits.
  if (static_cast<double>(hb) * static_cast<double>(wb) > static_cast<double>(max_pixels)) {
    const double beta = std::sqrt((h * w) / static_cast<double>(max_pixels));
    hb = std::max(factor, static_cast<int64_t>(std::floor(h / beta / f)) * factor);
    wb = std::max(factor, static_cast<int64_t>(std::floor(w / beta / f)) * factor);
  } else if (static_cast<double>(hb) * static_cast<double>(wb) < static_cast<double>(min_pixels)) {
    const double beta = std::sqrt(static_cast<double>(min_pixels) / (h * w));
    hb = static_cast<int64_t>(std::ceil(h * beta / f)) * factor;
    wb = static_cast<int64_t>(std::ceil(w * beta / f)) * factor;
  }
  FLOWKV_CHECK(hb >= factor && wb >= factor, "image processor: a ", width, "x", height,
               " image resizes to ", wb, "x", hb,
               ", an empty patch grid (min_pixels is 0 and the image is smaller than half of ",
               factor, " pixels on a side)");
  check_image_size(wb, hb, "image processor: the resized image");
  return {hb, wb};
}

std::array<int64_t, 3> image_grid(const ImageProcessorConfig& cfg, int64_t width, int64_t height) {
  int64_t h = height, w = width;
  if (cfg.do_resize) {
    const auto hw = smart_resize(height, width, cfg.factor(), cfg.min_pixels, cfg.max_pixels);
    h = hw[0], w = hw[1];
  } else {
    FLOWKV_CHECK(h % cfg.factor() == 0 && w % cfg.factor() == 0, "image processor: a ", width, "x",
                 height, " image is not a multiple of ", cfg.factor(),
                 " pixels on each side, and do_resize is false");
  }
  return {1, h / cfg.patch_size, w / cfg.patch_size};
}

int64_t image_token_count(const ImageProcessorConfig& cfg, int64_t width, int64_t height) {
  const auto g = image_grid(cfg, width, height);
  return g[0] * g[1] * g[2] / (cfg.merge_size * cfg.merge_size);
}

ProcessedImages process_images(const ImageProcessorConfig& cfg, std::span<const Image> images) {
  FLOWKV_CHECK(!images.empty(), "image processor: no image");
  const int64_t P = cfg.patch_size, M = cfg.merge_size, T = cfg.temporal_patch_size;
  const int64_t D = cfg.patch_dim();
  ProcessedImages out;
  int64_t rows = 0;
  for (size_t i = 0; i < images.size(); ++i) {
    const Image& im = images[i];
    check_image_size(im.width, im.height, "image processor: image " + std::to_string(i));
    FLOWKV_CHECK(static_cast<int64_t>(im.pixels.size()) == im.width * im.height * 3,
                 "image processor: image ", i, " holds ", im.pixels.size(), " bytes for ", im.width,
                 "x", im.height, " RGB pixels");
    out.grid_thw.push_back(image_grid(cfg, im.width, im.height));
    const auto& g = out.grid_thw.back();
    rows = checked_add(rows, g[0] * g[1] * g[2], "image processor patches");
  }
  FLOWKV_CHECK(rows <= limits::kMaxTokens, "image processor: ", rows,
               " patches exceed the limit of ", limits::kMaxTokens);
  check_memory(checked_mul(checked_mul(rows, D, "pixel_values"), 4, "pixel_values"),
               "image processor pixel_values", "use fewer or smaller images");
  out.pixel_values = Tensor::empty({rows, D});
  float* dst = out.pixel_values.f32();

  // The per-value float of each 8-bit sample and channel: rescale (float64 product, rounded to
  // float32), then normalize in float32, as numpy computes them.
  std::array<std::array<float, 256>, 3> lut{};
  for (int c = 0; c < 3; ++c) {
    const float mean = static_cast<float>(cfg.image_mean[c]);
    const float stdv = static_cast<float>(cfg.image_std[c]);
    for (int v = 0; v < 256; ++v) {
      float x = cfg.do_rescale ? static_cast<float>(static_cast<double>(v) * cfg.rescale_factor)
                               : static_cast<float>(v);
      if (cfg.do_normalize) x = (x - mean) / stdv;
      lut[c][v] = x;
    }
  }

  int64_t row = 0;
  for (size_t i = 0; i < images.size(); ++i) {
    const Image& src = images[i];
    const auto& g = out.grid_thw[i];
    const int64_t gh = g[1], gw = g[2];
    const Image resized = (gh * P == src.height && gw * P == src.width)
                              ? Image{}
                              : resize_bicubic(src, gw * P, gh * P);
    const Image& im = resized.pixels.empty() ? src : resized;
    // Rows in merge-block order (block row, block col, row in block, col in block); each row is
    // (channel, frame, py, px) with the one frame repeated T times.
    for (int64_t bh = 0; bh < gh / M; ++bh) {
      for (int64_t bw = 0; bw < gw / M; ++bw) {
        for (int64_t mh = 0; mh < M; ++mh) {
          for (int64_t mw = 0; mw < M; ++mw) {
            float* r = dst + row * D;
            const int64_t y0 = (bh * M + mh) * P, x0 = (bw * M + mw) * P;
            for (int64_t c = 0; c < 3; ++c) {
              float* frame0 = r + c * T * P * P;
              for (int64_t py = 0; py < P; ++py) {
                const uint8_t* px = im.at(x0, y0 + py) + c;
                for (int64_t qx = 0; qx < P; ++qx) frame0[py * P + qx] = lut[c][px[qx * 3]];
              }
              for (int64_t t = 1; t < T; ++t) {
                std::memcpy(frame0 + t * P * P, frame0, static_cast<size_t>(P * P) * sizeof(float));
              }
            }
            ++row;
          }
        }
      }
    }
  }
  return out;
}

}  // namespace flowkv::qwen3_vl
