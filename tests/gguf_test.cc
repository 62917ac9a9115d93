// GGUF files and ggml's block formats: dequantization and quantization bit for bit against the
// gguf Python package (tests/golden/gguf, python/ref/dump_gguf.py), the vectorized path against
// the scalar one, the reader on the package's files, the writer round trip, and every bad header
// as a clear flowkv::Error.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "flowkv/error.h"
#include "flowkv/inspect.h"
#include "flowkv/io.h"
#include "flowkv/model.h"
#include "hwy/targets.h"
#include "io/checkpoint.h"
#include "io/gguf.h"
#include "models/qwen_image/config.h"
#include "models/qwen_image/weights.h"
#include "quant/quant.h"
#include "temp_files.h"
#include "test_util.h"

namespace flowkv {
namespace {

using test::expect_error;

const std::string kTypesFile = std::string(FLOWKV_GOLDEN_DIR) + "/gguf/types.gguf";
const std::string kAligned64File = std::string(FLOWKV_GOLDEN_DIR) + "/gguf/aligned64.gguf";

constexpr DType kAllTypes[] = {DType::kF32,  DType::kF16,  DType::kBF16, DType::kQ8_0,
                               DType::kQ4_0, DType::kQ4_1, DType::kQ5_0, DType::kQ5_1,
                               DType::kQ4_K, DType::kQ5_K, DType::kQ6_K};

std::vector<uint8_t> random_bytes(int64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<uint8_t> v(static_cast<size_t>(n));
  for (auto& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

// ---- dequantization and quantization against the gguf package ----

TEST(GgufQuant, DequantizeMatchesPackageBitForBit) {
  const GgufFile f = GgufFile::open(kTypesFile);
  for (DType t : kAllTypes) {
    SCOPED_TRACE(std::string(dtype_name(t)));
    const std::string name = "deq." + std::string(dtype_name(t));
    const Tensor q = f.view(name);
    const Tensor want = f.view(name + ".expected");
    ASSERT_EQ(q.dtype(), t);
    ASSERT_EQ(q.shape(), want.shape());
    const int64_t rows = q.shape()[0], cols = q.shape()[1];
    const int64_t row_bytes = dtype_bytes(t, cols);
    std::vector<float> ref(static_cast<size_t>(cols)), fast(ref.size());
    for (int64_t r = 0; r < rows; ++r) {
      const auto* src = static_cast<const uint8_t*>(q.raw()) + r * row_bytes;
      quant::dequantize_row_ref(t, src, ref.data(), cols);
      quant::dequantize_row(t, src, fast.data(), cols);
      EXPECT_TRUE(test::bit_equal(ref.data(), want.f32() + r * cols, cols)) << "row " << r;
      EXPECT_TRUE(test::bit_equal(fast.data(), want.f32() + r * cols, cols)) << "row " << r;
    }
    const Tensor wide = q.to_f32();
    EXPECT_TRUE(test::bit_equal(wide.f32(), want.f32(), want.numel()));
    EXPECT_EQ(first_non_finite(q), -1);
  }
}

TEST(GgufQuant, QuantizeMatchesPackageBitForBit) {
  const GgufFile f = GgufFile::open(kTypesFile);
  for (DType t : {DType::kF16, DType::kBF16, DType::kQ8_0, DType::kQ4_0, DType::kQ4_1, DType::kQ5_0,
                  DType::kQ5_1}) {
    SCOPED_TRACE(std::string(dtype_name(t)));
    const std::string name = "quant." + std::string(dtype_name(t));
    const Tensor x = f.view(name + ".input");
    const Tensor want = f.view(name);
    ASSERT_EQ(want.dtype(), t);
    std::vector<uint8_t> got(static_cast<size_t>(want.nbytes()));
    const int64_t rows = x.shape()[0], cols = x.shape()[1];
    for (int64_t r = 0; r < rows; ++r) {
      quant::quantize_row(t, x.f32() + r * cols, got.data() + r * dtype_bytes(t, cols), cols);
    }
    EXPECT_EQ(std::memcmp(got.data(), want.raw(), got.size()), 0);
  }
}

// Equal bits, or both NaN: which NaN payload `x * d + m` returns when both d and m are NaN
// depends on the operand order the compiler picks (ggml's own builds differ there too); it
// arises only from NaN scale fields, which no valid file has.
bool same_or_both_nan(const std::vector<float>& a, const std::vector<float>& b) {
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(a[i]) && std::isnan(b[i])) continue;
    if (!test::bit_equal(&a[i], &b[i], 1)) return false;
  }
  return true;
}

// The vectorized path equals the scalar one on random blocks (any bits, Inf/NaN scales too) and
// at lengths with a scalar tail; bit for bit wherever the result is not NaN.
TEST(GgufQuant, FastDequantizeIsBitIdenticalToScalar) {
  // Every instruction set compiled in and supported here (AVX2, SSE4, ... : 4 to 16 lanes).
  for (const int64_t target : hwy::SupportedAndGeneratedTargets()) {
    hwy::SetSupportedTargetsForTest(target);
    const std::string name = quant::dequantize_target_name();
    SCOPED_TRACE(name);
    for (DType t : kAllTypes) {
      SCOPED_TRACE(std::string(dtype_name(t)));
      for (int64_t blocks : {1, 3, 37, 48}) {
        const int64_t n = blocks * std::max<int64_t>(dtype_block(t), 1);
        const auto src = random_bytes(dtype_bytes(t, n), 7 + static_cast<uint64_t>(n));
        std::vector<float> ref(static_cast<size_t>(n)), fast(ref.size());
        quant::dequantize_row_ref(t, src.data(), ref.data(), n);
        quant::dequantize_row(t, src.data(), fast.data(), n);
        EXPECT_TRUE(same_or_both_nan(ref, fast)) << n << " elements";
      }
    }
  }
  hwy::SetSupportedTargetsForTest(0);  // back to the CPU's own
}

double rel_rms(const std::vector<float>& a, const std::vector<float>& b) {
  double e = 0, r = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    e += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    r += double(b[i]) * b[i];
  }
  return std::sqrt(e / r);
}

// No numpy quantizer exists for the k-quants: their round trip stays within the errors ggml's
// formats are known for (relative RMS on Gaussian data).
TEST(GgufQuant, QuantizeRoundTripErrorBounds) {
  const struct {
    DType t;
    double bound;
  } cases[] = {{DType::kF16, 1e-3},  {DType::kBF16, 5e-3}, {DType::kQ8_0, 0.01},
               {DType::kQ4_0, 0.15}, {DType::kQ4_1, 0.12}, {DType::kQ5_0, 0.07},
               {DType::kQ5_1, 0.06}, {DType::kQ4_K, 0.12}, {DType::kQ5_K, 0.06},
               {DType::kQ6_K, 0.03}};
  const int64_t n = 4096;
  const std::vector<float> x = test::randn(n, 11, 0.02f);
  for (const auto& c : cases) {
    SCOPED_TRACE(std::string(dtype_name(c.t)));
    std::vector<uint8_t> q(static_cast<size_t>(dtype_bytes(c.t, n)));
    std::vector<float> y(static_cast<size_t>(n));
    quant::quantize_row(c.t, x.data(), q.data(), n);
    quant::dequantize_row(c.t, q.data(), y.data(), n);
    const double e = rel_rms(y, x);
    EXPECT_LT(e, c.bound);
    EXPECT_GT(e, 0.0);
    // Zeros stay zeros.
    std::vector<float> zeros(static_cast<size_t>(n), 0.0f);
    quant::quantize_row(c.t, zeros.data(), q.data(), n);
    quant::dequantize_row(c.t, q.data(), y.data(), n);
    for (float v : y) ASSERT_EQ(v, 0.0f);
  }
}

TEST(GgufQuant, RowsMustBeWholeBlocksAndFinite) {
  std::vector<float> x(300, 1.0f);
  std::vector<uint8_t> q(1024);
  expect_error([&] { quant::quantize_row(DType::kQ4_K, x.data(), q.data(), 300); },
               {"Q4_K", "300", "256"});
  expect_error([&] { quant::dequantize_row(DType::kQ8_0, q.data(), x.data(), 31); },
               {"Q8_0", "31", "32"});
  x[5] = NAN;
  expect_error([&] { quant::quantize_row(DType::kQ8_0, x.data(), q.data(), 32); },
               {"element 5", "finite"});
}

TEST(GgufQuant, FirstNonFiniteOfQuantizedTensor) {
  Tensor t = Tensor::zeros({3, 64}, DType::kQ8_0);
  EXPECT_EQ(first_non_finite(t), -1);
  // Row 2, block 1: scale +Inf (f16 0x7c00); its first element is Inf x 0 = NaN.
  auto* b = static_cast<uint8_t*>(t.raw()) + 2 * 68 + 34;
  b[0] = 0x00;
  b[1] = 0x7c;
  EXPECT_EQ(first_non_finite(t), 2 * 64 + 32);
}

// ---- reader ----

TEST(GgufReader, ReadsThePackagesMetadata) {
  const GgufHeader h = read_gguf_header(kTypesFile);
  EXPECT_EQ(h.version, 3u);
  EXPECT_EQ(h.alignment, 32);
  auto get = [&](const char* k) {
    const GgufValue* v = h.find(k);
    EXPECT_NE(v, nullptr) << k;
    return v ? *v : GgufValue();
  };
  EXPECT_EQ(get("general.architecture").s, "flowkv-test");
  EXPECT_EQ(get("test.u8").u, 200u);
  EXPECT_EQ(get("test.i8").i, -100);
  EXPECT_EQ(get("test.u16").u, 60000u);
  EXPECT_EQ(get("test.i16").i, -30000);
  EXPECT_EQ(get("test.u32").u, 4000000000u);
  EXPECT_EQ(get("test.i32").i, -2000000000);
  EXPECT_EQ(get("test.f32").f, 1.5);
  EXPECT_EQ(get("test.u64").u, 18000000000000000000u);
  EXPECT_EQ(get("test.i64").i, -9000000000000000000);
  EXPECT_EQ(get("test.f64").f, -2.25);
  EXPECT_EQ(get("test.bool").i, 1);
  EXPECT_EQ(get("test.string").s, "h\xc3\xa9llo gguf");
  EXPECT_EQ(get("test.array_i32").ai, (std::vector<int64_t>{1, -2, 3}));
  EXPECT_EQ(get("test.array_f32").af, (std::vector<double>{0.5, -1.0}));
  EXPECT_EQ(get("test.array_str").as, (std::vector<std::string>{"a", "bc", ""}));
  EXPECT_EQ(get("test.array_bool").ai, (std::vector<int64_t>{1, 0}));
  EXPECT_EQ(get("test.array_i32").summary(), "[1, -2, 3]");
  // Tensor dims are reversed to PyTorch order.
  ASSERT_FALSE(h.tensors.empty());
  EXPECT_EQ(h.tensors[0].name, "deq.F32");
  EXPECT_EQ(h.tensors[0].shape, (Shape{2, 64}));
}

TEST(GgufReader, CustomAlignment) {
  const GgufFile f = GgufFile::open(kAligned64File);
  EXPECT_EQ(f.header().alignment, 64);
  EXPECT_EQ(f.header().data_start % 64, 0);
  const Tensor b = f.view("b.weight");
  EXPECT_EQ(b.shape(), (Shape{2, 5}));
  EXPECT_EQ(f.view("a").shape(), (Shape{3}));
  EXPECT_TRUE(std::isfinite(b.f32()[9]));
  expect_error([&] { f.view("missing"); }, {"no tensor", "missing"});
}

TEST(GgufReader, FoldedShapeFromThePackage) {
  // A 4-D tensor with flowkv.shape.<name> (gguf-py writes the sizes as INT32): read 5-D; a 4-D
  // tensor without the key stays as stored.
  const GgufFile f = GgufFile::open(std::string(FLOWKV_GOLDEN_DIR) + "/gguf/folded.gguf");
  const Tensor w = f.view("conv.weight");
  EXPECT_EQ(w.shape(), (Shape{2, 3, 2, 4, 5}));
  EXPECT_TRUE(std::isfinite(w.f32()[2 * 3 * 2 * 4 * 5 - 1]));
  EXPECT_EQ(f.view("plain").shape(), (Shape{1, 2, 1, 3}));
}

// ---- writer ----

TEST(GgufWriter, RoundTrip) {
  test::TempDir dir;
  const std::string path = dir.file("w.gguf");
  GgufMetadata md;
  md.emplace_back("general.architecture", GgufValue::string("flux2"));
  md.emplace_back("general.alignment", GgufValue::u32(64));
  md.emplace_back("a.u64", GgufValue::u64(1ull << 40));
  md.emplace_back("a.i32", GgufValue::i32(-5));
  md.emplace_back("a.f32", GgufValue::f32(0.25f));
  md.emplace_back("a.bool", GgufValue::boolean(true));
  md.emplace_back("a.strs", GgufValue::strings({"x", "yz"}));
  md.emplace_back("a.ints", GgufValue::i32s({7, -8}));
  const std::vector<float> x = test::randn(2 * 512, 3);
  std::vector<uint8_t> q4k(static_cast<size_t>(dtype_bytes(DType::kQ4_K, 1024)));
  for (int r = 0; r < 2; ++r) {
    quant::quantize_row(DType::kQ4_K, x.data() + r * 512, q4k.data() + r * 288, 512);
  }
  std::vector<uint16_t> bf(6);
  for (size_t i = 0; i < bf.size(); ++i) bf[i] = f32_to_bf16(x[i]);
  write_gguf(path, md,
             {{"w.q4k", DType::kQ4_K, {2, 512}, q4k.data()},
              {"w.f32", DType::kF32, {3}, x.data()},
              {"w.bf16", DType::kBF16, {2, 1, 3}, bf.data()}});
  const GgufFile f = GgufFile::open(path);
  const GgufHeader& h = f.header();
  EXPECT_EQ(h.alignment, 64);
  ASSERT_EQ(h.metadata.size(), md.size());
  for (size_t i = 0; i < md.size(); ++i) {
    EXPECT_EQ(h.metadata[i].first, md[i].first);
    EXPECT_EQ(h.metadata[i].second.summary(), md[i].second.summary());
  }
  const Tensor a = f.view("w.q4k");
  EXPECT_EQ(a.dtype(), DType::kQ4_K);
  EXPECT_EQ(a.shape(), (Shape{2, 512}));
  EXPECT_EQ(std::memcmp(a.raw(), q4k.data(), q4k.size()), 0);
  EXPECT_EQ(std::memcmp(f.view("w.f32").raw(), x.data(), 12), 0);
  EXPECT_EQ(f.view("w.bf16").shape(), (Shape{2, 1, 3}));
  EXPECT_EQ(std::memcmp(f.view("w.bf16").raw(), bf.data(), 12), 0);

  expect_error(
      [&] {
        write_gguf(dir.file("d.gguf"), {},
                   {{"t", DType::kF32, {1}, x.data()}, {"t", DType::kF32, {1}, x.data()}});
      },
      {"\"t\"", "twice"});
  EXPECT_FALSE(path_exists(dir.file("d.gguf")));
}

// ---- bad input: crafted headers ----

// A GGUF file under construction: fields appended in order, little-endian.
class Bytes {
 public:
  Bytes& u32(uint32_t v) { return raw(&v, 4); }
  Bytes& u64(uint64_t v) { return raw(&v, 8); }
  Bytes& u8(uint8_t v) { return raw(&v, 1); }
  Bytes& str(const std::string& s) {
    u64(s.size());
    b_ += s;
    return *this;
  }
  Bytes& header(uint64_t tensors, uint64_t kvs, uint32_t version = 3) {
    return u32(0x46554747).u32(version).u64(tensors).u64(kvs);
  }
  Bytes& tensor(const std::string& name, std::vector<uint64_t> ne, uint32_t type, uint64_t off) {
    str(name).u32(static_cast<uint32_t>(ne.size()));
    for (uint64_t d : ne) u64(d);
    return u32(type).u64(off);
  }
  // Pads to 32 and appends `data` zero bytes.
  Bytes& data(size_t n) {
    b_.append((32 - b_.size() % 32) % 32, '\0');
    b_.append(n, '\0');
    return *this;
  }
  const std::string& s() const { return b_; }

 private:
  Bytes& raw(const void* p, size_t n) {
    b_.append(static_cast<const char*>(p), n);
    return *this;
  }
  std::string b_;
};

GgufHeader parse(const std::string& b) {
  return parse_gguf_header("bad.gguf", b.data(), static_cast<int64_t>(b.size()),
                           static_cast<int64_t>(b.size()));
}

TEST(GgufBadInput, EveryTruncationIsAnError) {
  const std::string good = test::read_file(kTypesFile);
  const GgufHeader h = parse(good);
  // Every cut inside the header and the tensor data.
  for (size_t n = 0; n < good.size(); n += (n < static_cast<size_t>(h.data_start) ? 1 : 97)) {
    const std::string cut = good.substr(0, n);
    EXPECT_THROW(parse(cut), Error) << n << " bytes";
  }
  expect_error([&] { parse(good.substr(0, 20)); }, {"bad.gguf", "truncated"});
}

TEST(GgufBadInput, MagicVersionAndEndianness) {
  expect_error([&] { parse("GGML0000000000000000000000"); }, {"not a GGUF file"});
  expect_error([&] { parse(Bytes().header(0, 0, 1).s()); }, {"version 1", "2 and 3"});
  expect_error([&] { parse(Bytes().header(0, 0, 0x03000000).s()); }, {"big-endian"});
  EXPECT_NO_THROW(parse(Bytes().header(0, 0, 2).s()));
}

TEST(GgufBadInput, TensorInfos) {
  // Unknown type: named, with the supported ones listed.
  expect_error([&] { parse(Bytes().header(1, 0).tensor("w", {256}, 16, 0).data(256).s()); },
               {"\"w\"", "IQ2_XXS", "supported", "Q4_K", "Q6_K"});
  expect_error([&] { parse(Bytes().header(1, 0).tensor("w", {32}, 77, 0).data(256).s()); },
               {"type 77"});
  // A row that is not whole blocks.
  expect_error(
      [&] {
        parse(Bytes().header(1, 0).tensor("w", {100, 2}, 12, 0).data(4096).s());
      },
      {"\"w\"", "Q4_K", "100", "256"});
  // Dimensions whose product overflows.
  expect_error(
      [&] {
        parse(Bytes().header(1, 0).tensor("w", {1ull << 40, 1ull << 40}, 0, 0).data(64).s());
      },
      {"overflows"});
  expect_error([&] { parse(Bytes().header(1, 0).tensor("w", {1ull << 63}, 0, 0).data(64).s()); },
               {"dimension"});
  expect_error([&] { parse(Bytes().header(1, 0).tensor("w", {0}, 0, 0).data(64).s()); },
               {"dimension 0 of size 0"});
  expect_error(
      [&] {
        parse(Bytes().header(1, 0).tensor("w", {1, 1, 1, 1, 1}, 0, 0).data(64).s());
      },
      {"5 dimensions"});
  // Misaligned offset, past the end, overlapping, duplicate names.
  expect_error([&] { parse(Bytes().header(1, 0).tensor("w", {4}, 0, 8).data(64).s()); },
               {"offset 8", "alignment 32"});
  expect_error([&] { parse(Bytes().header(1, 0).tensor("w", {64}, 0, 0).data(100).s()); },
               {"\"w\"", "past the end"});
  expect_error(
      [&] {
        parse(Bytes().header(2, 0).tensor("a", {16}, 0, 0).tensor("b", {8}, 0, 32).data(128).s());
      },
      {"\"a\"", "\"b\"", "overlap"});
  expect_error(
      [&] {
        parse(Bytes().header(2, 0).tensor("a", {4}, 0, 0).tensor("a", {4}, 0, 32).data(128).s());
      },
      {"\"a\"", "twice"});
  expect_error([&] { parse(Bytes().header(1, 0).tensor("", {4}, 0, 0).data(64).s()); },
               {"empty name"});
  // An absurd tensor count is refused before anything is reserved.
  expect_error([&] { parse(Bytes().header(1ull << 40, 0).data(64).s()); }, {"tensors", "limit"});
  expect_error([&] { parse(Bytes().header(100000, 0).data(64).s()); }, {"truncated", "100000"});
  // A good one for contrast.
  const GgufHeader h =
      parse(Bytes().header(2, 0).tensor("a", {8, 3}, 0, 0).tensor("b", {32}, 8, 96).data(200).s());
  EXPECT_EQ(h.tensors[0].shape, (Shape{3, 8}));
  EXPECT_EQ(h.tensors[1].dtype, DType::kQ8_0);
  EXPECT_EQ(h.tensors[1].end, 96 + 34);
}

TEST(GgufBadInput, Metadata) {
  // Huge string and array lengths are refused by the limits, before allocating.
  expect_error([&] { parse(Bytes().header(0, 1).u64(1ull << 40).data(64).s()); },
               {"metadata key 0", "limit"});
  expect_error([&] { parse(Bytes().header(0, 1).str("k").u32(8).u64(1ull << 62).s()); },
               {"\"k\"", "string of", "limit"});
  expect_error([&] { parse(Bytes().header(0, 1).str("k").u32(9).u32(4).u64(1ull << 40).s()); },
               {"\"k\"", "array of", "limit"});
  expect_error([&] { parse(Bytes().header(0, 1).str("k").u32(9).u32(4).u64(1000).u32(1).s()); },
               {"\"k\"", "bytes left"});
  expect_error([&] { parse(Bytes().header(0, 1).str("k").u32(9).u32(9).u64(1).s()); },
               {"array of arrays"});
  expect_error([&] { parse(Bytes().header(0, 1).str("k").u32(13).s()); },
               {"\"k\"", "unknown GGUF value type 13"});
  expect_error([&] { parse(Bytes().header(0, 1).str("k").u32(7).u8(2).s()); }, {"bool", "2"});
  expect_error([&] { parse(Bytes().header(0, 2).str("k").u32(0).u8(1).str("k").u32(0).u8(1).s()); },
               {"\"k\"", "twice"});
  expect_error([&] { parse(Bytes().header(0, 1ull << 40).s()); }, {"metadata keys", "limit"});
  // general.alignment: a power-of-two UINT32.
  expect_error([&] { parse(Bytes().header(0, 1).str("general.alignment").u32(4).u32(48).s()); },
               {"general.alignment", "power of two"});
  expect_error([&] { parse(Bytes().header(0, 1).str("general.alignment").u32(5).u32(32).s()); },
               {"general.alignment", "UINT32"});
}

// ---- checkpoints ----

// The golden FLUX.2 diffusers folder rewritten as one GGUF file: 2-D weights whose rows are whole
// Q8_0 blocks quantized, the rest F32. It scans as a single file, its family is found from the
// tensor names, the reader hands out the quantized views, and inspect reports it.
TEST(GgufCheckpoint, ScanReadAndInspectAQuantizedFlux2File) {
  const std::string src = std::string(FLOWKV_GOLDEN_DIR) + "/flux2/multi_guidance/transformer";
  const CheckpointScan folder = scan_checkpoint(src);
  CheckpointReader reader(folder);
  std::vector<Tensor> keep;
  std::vector<std::vector<uint8_t>> quantized;
  std::vector<TensorToWrite> list;
  int n_quantized = 0;
  for (const auto& [name, info] : folder.tensors) {
    const Tensor t = reader.get(name).to_f32();
    keep.push_back(t);
    if (t.shape().size() == 2 && t.shape()[1] % 32 == 0) {
      const int64_t rows = t.shape()[0], cols = t.shape()[1];
      quantized.emplace_back(static_cast<size_t>(dtype_bytes(DType::kQ8_0, t.numel())));
      for (int64_t r = 0; r < rows; ++r) {
        quant::quantize_row(DType::kQ8_0, t.f32() + r * cols,
                            quantized.back().data() + r * dtype_bytes(DType::kQ8_0, cols), cols);
      }
      list.push_back({name, DType::kQ8_0, t.shape(), quantized.back().data()});
      ++n_quantized;
    } else {
      list.push_back({name, DType::kF32, t.shape(), t.raw()});
    }
  }
  ASSERT_GT(n_quantized, 0);
  test::TempDir dir;
  const std::string file = dir.file("flux2.gguf");
  write_gguf(file, {{"general.architecture", GgufValue::string("flux2")}}, list);

  const CheckpointScan scan = scan_checkpoint(file);
  EXPECT_TRUE(scan.single_file);
  ASSERT_TRUE(scan.gguf);
  EXPECT_FALSE(scan.config);
  EXPECT_EQ(scan.tensors.size(), folder.tensors.size());
  CheckpointReader gguf_reader(scan);
  for (const TensorToWrite& t : list) {
    const Tensor v = gguf_reader.get(t.name);
    EXPECT_EQ(v.dtype(), t.dtype) << t.name;
    EXPECT_EQ(v.shape(), t.shape) << t.name;
    EXPECT_EQ(std::memcmp(v.raw(), t.data, static_cast<size_t>(v.nbytes())), 0) << t.name;
  }

  InspectReport r = inspect(file, {.check_values = true});
  EXPECT_TRUE(r.ok()) << format_report(r);
  EXPECT_EQ(r.family, "FLUX.2");
  EXPECT_EQ(r.layout, "single .gguf file (GGUF v3)");
  EXPECT_EQ(r.tensors_by_dtype.at("Q8_0"), n_quantized);
  ASSERT_EQ(r.metadata.size(), 1u);
  EXPECT_EQ(r.metadata[0], "general.architecture = \"flux2\"");
  const std::string text = format_report(r);
  EXPECT_NE(text.find("Q8_0 " + std::to_string(n_quantized)), std::string::npos) << text;

  // A quantized type on a tensor that is not a 2-D weight is named by the table check.
  std::map<std::string, TensorInfo> infos = scan.tensors;
  TensorInfo& one = infos.begin()->second;
  one.dtype = DType::kQ4_K;
  one.dtype_name = "Q4_K";
  const std::vector<std::string> problems =
      check_against_table(infos, {{infos.begin()->first, {1, 2, 256}}});
  bool named = false;
  for (const std::string& p : problems) named |= p.find("Q4_K") != std::string::npos;
  EXPECT_TRUE(named);

  // A broken GGUF file is a problem line for inspect, an Error for a strict scan.
  const std::string bad = dir.file("bad.gguf");
  test::write_file(bad, "GGUF\x03\0\0\0");
  expect_error([&] { scan_checkpoint(bad); }, {"bad.gguf", "truncated"});
  EXPECT_FALSE(inspect(bad).ok());
}

// A quantized weight whose block scale is infinite is refused where weights enter (the reader)
// and found by inspect --check-values, with the element named.
TEST(GgufCheckpoint, NonFiniteQuantizedWeightIsRefused) {
  test::TempDir dir;
  const std::string file = dir.file("nan.gguf");
  std::vector<uint8_t> q(static_cast<size_t>(dtype_bytes(DType::kQ8_0, 2 * 64)), 0);
  q[3 * 34 + 1] = 0x7c;  // row 1, block 1: scale +Inf, so element 1 * 64 + 32 is Inf x 0 = NaN
  write_gguf(file, {}, {{"w", DType::kQ8_0, {2, 64}, q.data()}});
  const CheckpointScan scan = scan_checkpoint(file);
  CheckpointReader reader(scan);
  expect_error([&] { reader.get("w"); }, {"'w'", "NaN or infinity at element 96"});
  const InspectReport r = inspect(file, {.check_values = true});
  bool found = false;
  for (const std::string& p : r.problems) found |= p.find("w holds NaN") != std::string::npos;
  EXPECT_TRUE(found) << format_report(r);
}

// An unsupported ggml type is a problem line of inspect naming it, and an Error when loading.
TEST(GgufCheckpoint, UnsupportedTypeIsNamed) {
  test::TempDir dir;
  const std::string file = dir.file("iq.gguf");
  test::write_file(file, Bytes().header(1, 0).tensor("w", {256, 4}, 16, 0).data(1024).s());
  expect_error([&] { scan_checkpoint(file); }, {"iq.gguf", "\"w\"", "IQ2_XXS", "Q8_0"});
  const InspectReport r = inspect(file);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.problems[0].find("IQ2_XXS"), std::string::npos) << format_report(r);
}

}  // namespace
}  // namespace flowkv

namespace flowkv {
namespace {

double nmse_of(const Tensor& a, const Tensor& ref) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < ref.numel(); ++i) {
    const double d = double(a.f32()[i]) - ref.f32()[i];
    num += d * d;
    den += double(ref.f32()[i]) * ref.f32()[i];
  }
  return num / den;
}

// Every family's tiny built-in, exported, quantized by quantize_checkpoint, loaded back from the
// GGUF file (config from its metadata, weights kept as stored) and run: the output follows the
// f32 model's within what the type's rounding allows, and loading the same file twice gives the
// same bits.
TEST(GgufModels, QuantizedCheckpointsLoadAndRunEveryFamily) {
  for (const std::string name : {"tiny", "qwen21-tiny"}) {
    test::TempDir dir;
    const std::string src = dir.path().string() + "/model";
    export_builtin(name, 3, "f32", src);
    const Model ref_model = Model::load(src);
    const DenoiseInputs in =
        example_inputs(ref_model, {.text_tokens = 8, .height = 4, .width = 4, .seed = 5});
    const Tensor ref = forward(ref_model, in);
    struct Case {
      DType type;
      double max_nmse;  // the type's relative rounding error, squared, with margin
    };
    for (Case c : {Case{DType::kBF16, 1e-4}, Case{DType::kF16, 1e-5}, Case{DType::kQ8_0, 1e-3},
                   Case{DType::kQ4_0, 3e-2}, Case{DType::kQ5_1, 1e-2}}) {
      const std::string file =
          dir.path().string() + "/model_" + std::string(dtype_name(c.type)) + ".gguf";
      const QuantizeReport rep = quantize_checkpoint(src, file, c.type);
      EXPECT_GT(rep.quantized, 0) << name << " " << dtype_name(c.type);
      const Model m = Model::load(file);
      EXPECT_EQ(m.family().name, ref_model.family().name);
      EXPECT_EQ(m.config_json(), ref_model.config_json());
      const Tensor out = forward(m, in);
      const double e = nmse_of(out, ref);
      EXPECT_LT(e, c.max_nmse) << name << " " << dtype_name(c.type);
      EXPECT_GT(e, 0.0) << name << " " << dtype_name(c.type) << ": the weights were not narrowed";
      const Tensor again = forward(Model::load(file), in);
      EXPECT_TRUE(test::bit_equal(out.f32(), again.f32(), out.numel()));
    }
  }
}

// GGUF conversions in circulation carry no config: the Qwen families are recognised by their
// tensors and their config is inferred from the shapes. A Qwen-Image-2.1 file without a config
// loads as the model it was made from and runs like it; causal_condition (not in the shapes)
// takes the released value, and inspect says it assumed so.
TEST(GgufModels, Qwen21WithoutConfigIsInferredFromShapes) {
  test::TempDir dir;
  const std::string src = dir.path().string() + "/model";
  export_builtin("qwen21-small", 3, "f32", src);
  const std::string bare = dir.path().string() + "/bare.safetensors";
  std::filesystem::copy_file(src + "/diffusion_pytorch_model.safetensors", bare);
  const std::string file = dir.path().string() + "/qwen21-small-q8_0.gguf";
  quantize_checkpoint(bare, file, DType::kQ8_0);
  EXPECT_FALSE(read_gguf_header(file).find("flowkv.config")) << "the test needs a config-less file";

  const InspectReport r = inspect(file);
  EXPECT_TRUE(r.ok()) << format_report(r);
  EXPECT_EQ(r.family, "Qwen-Image-2.1");
  EXPECT_TRUE(r.config_inferred);
  EXPECT_NE(r.variant.find("causal_condition assumed true"), std::string::npos) << r.variant;

  const Model ref_model = Model::load(src);
  const Model m = Model::load(file);
  EXPECT_EQ(m.family().name, ref_model.family().name);
  EXPECT_EQ(m.config_json(), ref_model.config_json());
  const DenoiseInputs in = example_inputs(
      ref_model, {.text_tokens = 8, .height = 4, .width = 4, .references = {}, .seed = 5});
  const double e = nmse_of(forward(m, in), forward(ref_model, in));
  EXPECT_GT(e, 0.0);
  EXPECT_LT(e, 1e-3);
  EXPECT_NO_THROW(predict({.model = file, .text_tokens = 16, .target_tokens = 64}));
}

// A head dim without released RoPE axes cannot be inferred: the error says what to add.
TEST(GgufModels, QwenConfigThatShapesCannotTellIsAClearError) {
  test::TempDir dir;
  const std::string src = dir.path().string() + "/model";
  export_builtin("qwen21-tiny", 3, "f32", src);  // head dim 32
  const std::string bare = dir.path().string() + "/bare.safetensors";
  std::filesystem::copy_file(src + "/diffusion_pytorch_model.safetensors", bare);
  test::expect_error([&] { Model::load(bare); }, {"axes_dims_rope", "config.json"});
}

// A config-less Qwen-Image (dual-stream) file, as the GGUF conversions in circulation keep
// diffusers' names: recognised, its config inferred, its cost predicted, and it runs; its Q8_0
// quantization runs close to it.
TEST(GgufModels, QwenImageWithoutConfigIsInspectedPredictedAndRun) {
  qwen::ConfigQwenImage c;
  c.num_layers = 2;
  c.num_attention_heads = 1;
  c.joint_attention_dim = 32;
  std::vector<TensorToWrite> list;
  for (const ExpectedTensor& e : qwen::weight_table(c))
    list.push_back({e.name, DType::kF32, e.shape});
  std::vector<std::vector<float>> values;
  uint32_t state = 7;
  for (TensorToWrite& t : list) {
    values.emplace_back(static_cast<size_t>(shape_numel(t.shape)));
    for (float& v : values.back()) {  // small deterministic weights
      state = state * 1664525u + 1013904223u;
      v = (static_cast<float>(state >> 8) / 16777216.0f - 0.5f) * 0.1f;
    }
    t.data = values.back().data();
  }
  test::TempDir dir;
  const std::string file = dir.path().string() + "/qwen-image.gguf";
  write_gguf(file, {}, list);
  const InspectReport r = inspect(file);
  EXPECT_TRUE(r.ok()) << format_report(r);
  EXPECT_EQ(r.family, "Qwen-Image");
  EXPECT_TRUE(r.config_inferred);
  EXPECT_EQ(parse_json(r.config_json, "report"), parse_json(c.to_json().dump(), "table"));
  const KVPrediction p = predict({.model = file, .text_tokens = 16, .target_tokens = 64});
  EXPECT_GT(p.uncached_step_flops, 0);
  const std::string q8 = dir.path().string() + "/qwen-image-q8_0.gguf";
  quantize_checkpoint(file, q8, DType::kQ8_0);
  const Model m = Model::load(file), mq = Model::load(q8);
  const DenoiseInputs in = example_inputs(
      m, {.text_tokens = 8, .height = 4, .width = 4, .references = {{2, 4}}, .seed = 5});
  const double e = nmse_of(forward(mq, in), forward(m, in));
  EXPECT_GT(e, 0.0);
  EXPECT_LT(e, 1e-3);
}

}  // namespace
}  // namespace flowkv

namespace flowkv {
namespace {

// int8 compute on every family's tiny built-in (as a checkpoint): close to f32, and the exact
// conditioning cache stays exact (cached == recomputed bit for bit), because an activation
// row's quantization and products do not depend on the other rows of the call.
TEST(Int8Models, EveryFamilyRunsAndItsExactCacheStaysExact) {
  for (const std::string name : {"tiny", "qwen21-tiny"}) {
    test::TempDir dir;
    const std::string src = dir.path().string() + "/model";
    export_builtin(name, 4, "f32", src);
    const Model f32 = Model::load(src), int8 = Model::load(src, "int8");
    EXPECT_EQ(int8.compute_dtype(), "INT8");
    ExampleShape shape{.text_tokens = 8, .height = 4, .width = 4, .seed = 6};
    const DenoiseInputs plain = example_inputs(f32, shape);
    const double e = nmse_of(forward(int8, plain), forward(f32, plain));
    EXPECT_GT(e, 0.0) << name;
    EXPECT_LT(e, 1e-2) << name;
    shape.references = {{2, 2}};
    const DenoiseInputs in = example_inputs(f32, shape);
    DenoiseOptions o;
    o.steps = 3;
    o.mode = KVMode::kCached;
    const Tensor cached = denoise(int8, in, o).latents;
    o.mode = KVMode::kRecompute;
    const Tensor recomputed = denoise(int8, in, o).latents;
    EXPECT_TRUE(test::bit_equal(cached.f32(), recomputed.f32(), cached.numel())) << name;
  }
}

}  // namespace
}  // namespace flowkv
