// The torch-compatible normal generator (core/random.h) against torch.randn dumps
// (python/ref/dump_random.py, torch 2.15.0, AVX2 capability): bit-identical values for every
// seed and shape, including the scalar path (numel < 16), the re-drawn tail of the vector path
// (numel not a multiple of 16) and the cached second normal carried between calls.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "core/random.h"
#include "io/json.h"

namespace {

std::string dir() {
  return std::string(FLOWKV_GOLDEN_DIR) + "/random/";
}

std::vector<float> read_f32(const std::string& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  EXPECT_TRUE(in) << path;
  std::vector<float> v(static_cast<size_t>(in.tellg()) / sizeof(float));
  in.seekg(0);
  in.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(v.size() * 4));
  return v;
}

int64_t numel(const flowkv::Json& shape) {
  int64_t n = 1;
  for (const auto& d : shape) n *= d.get<int64_t>();
  return n;
}

// Every case of one dump folder; returns how many were compared.
int check_dump(const std::string& sub, flowkv::TorchCpuCapability capability) {
  const flowkv::Json m = flowkv::read_json_file(dir() + sub + "manifest.json");
  EXPECT_EQ(m["cpu_capability"],
            capability == flowkv::TorchCpuCapability::kAvx2 ? "AVX2" : "DEFAULT");
  int cases = 0;
  for (const auto& c : m["cases"]) {
    if (c.contains("dtype")) continue;  // bfloat16: its own test
    const std::string name = c["name"];
    const std::vector<float> want = read_f32(dir() + sub + name + ".f32");
    flowkv::TorchGenerator g(c["seed"].get<uint64_t>(), capability);
    std::vector<float> got = g.randn(numel(c["shape"]));
    if (c.contains("then")) {
      const std::vector<float> more = g.randn(numel(c["then"]));
      got.insert(got.end(), more.begin(), more.end());
    }
    EXPECT_EQ(got.size(), want.size()) << name;
    if (got.size() != want.size()) continue;
    int64_t differ = 0, first = -1;
    for (size_t i = 0; i < got.size(); ++i) {
      if (std::memcmp(&got[i], &want[i], sizeof(float)) != 0) {
        if (first < 0) first = static_cast<int64_t>(i);
        ++differ;
      }
    }
    EXPECT_EQ(differ, 0) << name << ": " << differ << " of " << got.size()
                         << " values differ; first at " << first << ": " << got[first] << " vs "
                         << want[first];
    ++cases;
  }
  return cases;
}

TEST(TorchGenerator, MatchesTorchRandnBitForBit) {
  EXPECT_GE(check_dump("", flowkv::TorchCpuCapability::kAvx2), 40);
}

// ATEN_CPU_CAPABILITY=default: torch's libm transform (float logf, cosf, sinf).
TEST(TorchGenerator, MatchesTorchDefaultCapability) {
  EXPECT_GE(check_dump("default/", flowkv::TorchCpuCapability::kDefault), 5);
}

TEST(TorchGenerator, MatchesTorchRandnBfloat16BitForBit) {
  const flowkv::Json m = flowkv::read_json_file(dir() + "manifest.json");
  int cases = 0;
  for (const auto& c : m["cases"]) {
    if (!c.contains("dtype")) continue;
    const std::string name = c["name"];
    std::ifstream in(dir() + name + ".bf16", std::ios::binary);
    const int64_t n = numel(c["shape"]);
    std::vector<uint16_t> want(static_cast<size_t>(n));
    in.read(reinterpret_cast<char*>(want.data()), static_cast<std::streamsize>(n * 2));
    ASSERT_TRUE(in) << name;
    flowkv::TorchGenerator g(c["seed"].get<uint64_t>());
    std::vector<float> got(static_cast<size_t>(n));
    g.randn_bf16(got.data(), n);
    int64_t differ = 0, first = -1;
    for (int64_t i = 0; i < n; ++i) {
      uint32_t bits = 0;
      std::memcpy(&bits, &got[i], 4);
      if ((bits & 0xffffu) != 0 || (bits >> 16) != want[i]) {
        if (first < 0) first = i;
        ++differ;
      }
    }
    EXPECT_EQ(differ, 0) << name << ": " << differ << " of " << n << " differ, first at " << first;
    ++cases;
  }
  EXPECT_GE(cases, 14);
}

// The Klein latents' shape in one call, as diffusers' randn_tensor: same values as randn(n).
TEST(TorchGenerator, RandnTensorIsOneDraw) {
  flowkv::TorchGenerator a(42), b(42), c(42), d(42);
  const flowkv::Tensor t = flowkv::randn_tensor(a, {1, 128, 8, 8});
  ASSERT_EQ(t.shape(), (flowkv::Shape{1, 128, 8, 8}));
  EXPECT_EQ(std::vector<float>(t.f32(), t.f32() + t.numel()), b.randn(8192));
  const flowkv::Tensor h = flowkv::randn_tensor(c, {1, 128, 1, 3}, flowkv::DType::kBF16);
  ASSERT_EQ(h.dtype(), flowkv::DType::kBF16);
  std::vector<float> want(384);
  d.randn_bf16(want.data(), 384);
  const flowkv::Tensor back = h.to_f32();
  EXPECT_EQ(std::vector<float>(back.f32(), back.f32() + 384), want);
}

TEST(TorchGenerator, SeedUsesLow32Bits) {
  flowkv::TorchGenerator a(7), b((uint64_t{1} << 32) + 7);
  EXPECT_EQ(a.randn(20), b.randn(20));
}

}  // namespace
