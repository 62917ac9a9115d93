// Image files, resize and the Klein reference preprocessing against Pillow 13.0.0 and
// diffusers 0.42.1 (python/ref/dump_images.py writes tests/golden/images/): decoding equals
// load_image (open, exif_transpose, convert("RGB")); resize_lanczos equals
// Image.resize(LANCZOS) bit for bit, RGB and RGBA, in either pass order; the Klein
// preprocessing's sizes, pixels and floats; postprocess's uint8; PNG round trip with the
// "parameters" text; every bad input a flowkv::Error naming the file.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "flowkv/limits.h"
#include "io/image.h"
#include "io/json.h"
#include "pipeline/reference_image.h"
#include "temp_files.h"

namespace flowkv {
namespace {

using test::expect_error;
using test::read_file;
using test::TempDir;
using test::write_file;

std::string dir() {
  return std::string(FLOWKV_GOLDEN_DIR) + "/images/";
}
const Json& manifest() {
  static const Json m = read_json_file(dir() + "manifest.json");
  return m;
}

struct Diff {
  int max = 0;
  int64_t differing = 0;  // pixels with any channel different
};

Diff diff(const Image& a, const Image& b) {
  Diff d;
  const auto ch = static_cast<size_t>(a.channels);
  for (size_t i = 0; i < a.pixels.size(); i += ch) {
    bool any = false;
    for (size_t c = 0; c < ch; ++c) {
      const int v = std::abs(int{a.pixels[i + c]} - int{b.pixels[i + c]});
      d.max = std::max(d.max, v);
      any = any || v != 0;
    }
    d.differing += any;
  }
  return d;
}

// Every decode case equals Pillow's, bit for bit (PNG and JPEG alike: both libjpeg-turbo, ISLOW
// IDCT, fancy upsampling).
TEST(Image, DecodesAsPillowConvertRgb) {
  int n = 0;
  for (const Json& c : manifest()["decode"]) {
    const std::string file = c["file"];
    SCOPED_TRACE(file + " (PIL mode " + c["mode"].get<std::string>() + ")");
    const Image got = load_image(dir() + "in/" + file);
    const Image want = load_image(dir() + "expect/" + file + ".png");
    ASSERT_EQ(got.width, c["width"].get<int64_t>());
    ASSERT_EQ(got.height, c["height"].get<int64_t>());
    ASSERT_EQ(want.width, got.width);
    ASSERT_EQ(want.height, got.height);
    const Diff d = diff(got, want);
    EXPECT_EQ(d.max, 0) << d.differing << " pixels differ";
    ++n;
  }
  EXPECT_GE(n, 32);
}

TEST(Image, ResizeMatchesPillowLanczos) {
  int worst = 0, exact = 0, n = 0;
  int64_t differing = 0, pixels = 0;
  for (const Json& c : manifest()["resize"]) {
    const std::string name = c["expect"];
    SCOPED_TRACE(name);
    const PixelFormat fmt = c.contains("rgba") ? PixelFormat::kRGBA : PixelFormat::kRGB;
    const Image src = load_image(dir() + "in/" + c["src"].get<std::string>(), fmt);
    const Image got = resize_lanczos(src, c["width"], c["height"]);
    const Image want = load_image(dir() + "expect/" + name + ".png", fmt);
    ASSERT_EQ(got.channels, want.channels);
    ASSERT_EQ(got.width, want.width);
    ASSERT_EQ(got.height, want.height);
    const Diff d = diff(got, want);
    EXPECT_EQ(d.max, 0) << d.differing << " pixels differ";
    worst = std::max(worst, d.max);
    differing += d.differing;
    pixels += got.width * got.height;
    exact += d.max == 0;
    ++n;
  }
  std::printf(
      "resize vs Pillow LANCZOS: %d/%d cases bit-exact, max |diff| %d, %lld of %lld pixels "
      "differ\n",
      exact, n, worst, static_cast<long long>(differing), static_cast<long long>(pixels));
  EXPECT_GE(n, 26);
}

uint64_t fnv1a64(const std::vector<uint8_t>& bytes) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (const uint8_t b : bytes) h = (h ^ b) * 0x100000001b3ull;
  return h;
}

TEST(Image, KleinReferencePreprocessing) {
  for (const Json& c : manifest()["klein"]) {
    const std::string file = c["file"];
    SCOPED_TRACE(file);
    const Image got = flux2_reference_image(load_image(dir() + "in/" + file), file);
    ASSERT_EQ(got.width, c["width"].get<int64_t>());
    ASSERT_EQ(got.height, c["height"].get<int64_t>());
    const int64_t step = c["step"];
    const Image want = load_image(dir() + "expect/" + c["expect"].get<std::string>() + ".png");
    Image sub = Image::blank(want.width, want.height, "subsample");
    for (int64_t y = 0; y < want.height; ++y) {
      for (int64_t x = 0; x < want.width; ++x) {
        std::memcpy(sub.at(x, y), got.at(x * step, y * step), 3);
      }
    }
    const Diff d = diff(sub, want);
    EXPECT_LE(d.max, 1);
    char hash[17];
    std::snprintf(hash, sizeof(hash), "%016llx",
                  static_cast<unsigned long long>(fnv1a64(got.pixels)));
    std::printf(
        "klein %s -> %lldx%lld: max |diff| %d (%lld of %lld sampled pixels), all pixels "
        "%s\n",
        file.c_str(), static_cast<long long>(got.width), static_cast<long long>(got.height), d.max,
        static_cast<long long>(d.differing), static_cast<long long>(want.width * want.height),
        c["fnv1a64"] == hash ? "bit-exact (hash)" : "not bit-exact (hash differs)");
  }
}

TEST(Image, KleinRefusesWhatDiffusersRefuses) {
  expect_error([] { flux2_reference_image(Image::blank(63, 200, "t"), "ref.png"); },
               {"ref.png", "too small", "63x200"});
  expect_error([] { flux2_reference_image(Image::blank(600, 70, "t"), "ref.png"); },
               {"ref.png", "aspect ratio", "600x70"});
  // Exactly 8:1 is allowed, and 64x64 is.
  EXPECT_EQ(flux2_reference_image(Image::blank(512, 64, "t"), "r").width, 512);
  EXPECT_EQ(flux2_reference_image(Image::blank(64, 64, "t"), "r").height, 64);
}

std::vector<uint8_t> read_bytes(const std::string& path) {
  const std::string s = read_file(path);
  return {s.begin(), s.end()};
}

TEST(Image, TensorFromPixelsBitExact) {
  const std::vector<uint8_t> raw = read_bytes(dir() + "tensor.f32");
  ASSERT_EQ(raw.size(), 256u * 4);
  Image ramp = Image::blank(256, 1, "ramp");
  for (int v = 0; v < 256; ++v)
    ramp.pixels[3 * v] = ramp.pixels[3 * v + 1] = ramp.pixels[3 * v + 2] = v;
  const Tensor t = image_to_tensor(ramp);
  ASSERT_EQ(t.shape(), (Shape{1, 3, 1, 256}));
  for (int c = 0; c < 3; ++c) {
    EXPECT_EQ(std::memcmp(t.f32() + c * 256, raw.data(), raw.size()), 0) << "channel " << c;
  }
}

TEST(Image, PostprocessBitExact) {
  const std::vector<uint8_t> in = read_bytes(dir() + "post_in.f32");
  const std::vector<uint8_t> want = read_bytes(dir() + "post_out.u8");
  ASSERT_EQ(in.size(), 3u * 16 * 16 * 4);
  std::vector<float> v(in.size() / 4);
  std::memcpy(v.data(), in.data(), in.size());
  const Image got = tensor_to_image(Tensor::from_vector(v, {1, 3, 16, 16}));
  ASSERT_EQ(got.pixels.size(), want.size());
  int64_t differ = 0;
  for (size_t i = 0; i < want.size(); ++i) differ += got.pixels[i] != want[i];
  EXPECT_EQ(differ, 0);
}

TEST(Image, PngRoundTripWithParameters) {
  TempDir tmp;
  const Image img = load_image(dir() + "in/rgb.png");
  for (const std::string& params :
       {std::string("a cat on a mat\nSteps: 4, Seed: 42, Size: 37x23, Model: flux2-klein"),
        std::string("un chat \xc3\xa9l\xc3\xa9gant \xe7\x8c\xab"), std::string()}) {
    const std::string path = tmp.file("out.png");
    save_png(path, img, params);
    const Image back = load_image(path);
    EXPECT_EQ(back.width, img.width);
    EXPECT_EQ(back.pixels, img.pixels);
    EXPECT_EQ(read_png_parameters(path), params);
  }
  EXPECT_EQ(tmp.list(), std::vector<std::string>{"out.png"});  // no temporary left
}

TEST(Image, UnwritablePathIsAnErrorAndLeavesNothing) {
  TempDir tmp;
  const Image img = Image::blank(4, 3, "t");
  expect_error([&] { save_png(tmp.file("missing/dir/out.png"), img, "p"); }, {"out.png"});
  std::filesystem::create_directory(tmp.file("taken.png"));
  expect_error([&] { save_png(tmp.file("taken.png"), img, "p"); }, {"taken.png"});
  EXPECT_EQ(tmp.list(), std::vector<std::string>{"taken.png"});
  expect_error([&] { save_png(tmp.file("x.png"), img, std::string("a\0b", 3)); }, {"NUL"});
}

// ---- bad input ----

std::string png_chunk(const std::string& type, const std::string& data) {
  auto be32 = [](uint32_t v) {
    return std::string{static_cast<char>(v >> 24), static_cast<char>(v >> 16),
                       static_cast<char>(v >> 8), static_cast<char>(v)};
  };
  const std::string td = type + data;
  uint32_t crc = 0xffffffffu;
  for (const char ch : td) {
    crc ^= static_cast<uint8_t>(ch);
    for (int k = 0; k < 8; ++k) crc = (crc >> 1) ^ (0xedb88320u & (0u - (crc & 1)));
  }
  return be32(static_cast<uint32_t>(data.size())) + td + be32(~crc);
}

std::string png_header(uint32_t w, uint32_t h) {
  std::string ihdr;
  for (const uint32_t v : {w, h}) {
    for (int s = 24; s >= 0; s -= 8) ihdr += static_cast<char>(v >> s);
  }
  ihdr += std::string("\x08\x02\x00\x00\x00", 5);
  return std::string("\x89PNG\r\n\x1a\n", 8) + png_chunk("IHDR", ihdr);
}

TEST(Image, HugeHeadersAreRefusedBeforeAllocating) {
  TempDir tmp;
  // 30000 x 30000 (900M pixels, 2.7 GB of RGB): refused from the header.
  write_file(tmp.file("huge.png"), png_header(30000, 30000) + png_chunk("IEND", ""));
  expect_error([&] { load_image(tmp.file("huge.png")); }, {"huge.png", "30000x30000", "limit"});
  // Past the largest side: spng refuses while reading the header.
  write_file(tmp.file("wide.png"), png_header(100000, 1) + png_chunk("IEND", ""));
  expect_error([&] { load_image(tmp.file("wide.png")); }, {"wide.png", "limit"});
  // A JPEG whose frame header says 30000 x 30000 (SOF0 height and width patched).
  std::string jpg = read_file(dir() + "in/baseline.jpg");
  const size_t sof = jpg.find("\xff\xc0");
  ASSERT_NE(sof, std::string::npos);
  jpg[sof + 5] = jpg[sof + 7] = static_cast<char>(30000 >> 8);
  jpg[sof + 6] = jpg[sof + 8] = static_cast<char>(30000 & 0xff);
  write_file(tmp.file("huge.jpg"), jpg);
  expect_error([&] { load_image(tmp.file("huge.jpg")); }, {"huge.jpg", "30000x30000", "limit"});
  // A caller's own, lower limit.
  const std::string png = read_file(dir() + "in/rgb.png");
  expect_error(
      [&] { decode_image(reinterpret_cast<const uint8_t*>(png.data()), png.size(), "small", 100); },
      {"small", "37x23", "caller's limit of 100"});
}

TEST(Image, BadFilesAreClearErrors) {
  TempDir tmp;
  const std::string png = read_file(dir() + "in/rgb.png");
  const std::string jpg = read_file(dir() + "in/baseline.jpg");
  write_file(tmp.file("empty.png"), "");
  expect_error([&] { load_image(tmp.file("empty.png")); }, {"empty.png", "empty"});
  write_file(tmp.file("notes.txt"), "just some text, not a picture\n");
  expect_error([&] { load_image(tmp.file("notes.txt")); }, {"notes.txt", "not a PNG or JPEG"});
  write_file(tmp.file("half.png"), png.substr(0, png.size() / 2));
  expect_error([&] { load_image(tmp.file("half.png")); }, {"half.png", "PNG"});
  write_file(tmp.file("sig.png"), png.substr(0, 8));
  expect_error([&] { load_image(tmp.file("sig.png")); }, {"sig.png", "PNG"});
  std::string bad_crc = png;
  bad_crc[png.find("IDAT") + 10] ^= 0x55;
  write_file(tmp.file("crc.png"), bad_crc);
  expect_error([&] { load_image(tmp.file("crc.png")); }, {"crc.png", "PNG"});
  write_file(tmp.file("half.jpg"), jpg.substr(0, jpg.size() / 2));
  expect_error([&] { load_image(tmp.file("half.jpg")); }, {"half.jpg", "JPEG"});
  write_file(tmp.file("cut.jpg"), jpg.substr(0, jpg.size() - 60));  // inside the scan
  expect_error([&] { load_image(tmp.file("cut.jpg")); }, {"cut.jpg", "truncated JPEG"});
  write_file(tmp.file("head.jpg"), jpg.substr(0, 3));
  expect_error([&] { load_image(tmp.file("head.jpg")); }, {"head.jpg", "JPEG"});
  expect_error([&] { load_image(tmp.file("missing.png")); }, {"missing.png", "No such file"});
  expect_error([&] { load_image(tmp.path().string()); }, {"not a regular file"});
}

// libjpeg's non-fatal warnings are not errors, as in PIL: extraneous bytes before EOI decode to
// the same pixels.
TEST(Image, JpegWarningsAreNotErrors) {
  TempDir tmp;
  const std::string jpg = read_file(dir() + "in/baseline.jpg");
  write_file(tmp.file("extra.jpg"),
             jpg.substr(0, jpg.size() - 2) + std::string("\x00\x11\x22", 3) + "\xff\xd9");
  EXPECT_EQ(load_image(tmp.file("extra.jpg")).pixels, load_image(dir() + "in/baseline.jpg").pixels);
}

TEST(Image, ResizeAndCropRefuseBadSizes) {
  const Image img = Image::blank(8, 8, "t");
  expect_error([&] { resize_lanczos(img, 0, 4); }, {"resize", "empty"});
  expect_error([&] { resize_lanczos(img, 30000, 30000); }, {"resize", "limit"});
  expect_error([&] { crop(img, 4, 4, 5, 1); }, {"crop", "outside"});
  EXPECT_EQ(resize_lanczos(img, 8, 8).pixels, img.pixels);
}

}  // namespace
}  // namespace flowkv
