// NucleusMoE-Image's MoE layer against diffusers' NucleusMoELayer (golden dumps of
// python/ref/dump_nucleus_moe.py): routing indices exactly (torch.topk's tie order included),
// gating weights and output in f32 and bf16, the GGUF (output-major) expert layout against
// diffusers' (input-major), Q8_0 experts, thread-count independence and malformed shapes.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "core/parallel.h"
#include "flowkv/error.h"
#include "golden_util.h"
#include "models/nucleus/moe.h"
#include "test_util.h"

namespace flowkv {
namespace {

using nucleus::ExpertLayout;
using nucleus::MoEConfig;
using nucleus::MoELayer;
namespace wmoe = nucleus::wmoe;
using test::compare;

const ExecContext kFast{};

struct Case {
  std::string name;
  int64_t S = 0, C = 0;
  MoEConfig cfg;
  std::map<std::string, Tensor> t;  // inputs and the dumped results, as f32
};

struct Golden {
  int64_t B = 0;
  std::map<std::string, Tensor> weights;  // diffusers' names and layout, f32 (bf16 values)
  std::vector<Case> cases;
};

const Golden& golden() {
  static const Golden g = [] {
    Golden g;
    const std::string dir = test::golden("nucleus_moe");
    const Json meta = read_json_file(dir + "/meta.json");
    const Json& c = meta.at("config");
    g.B = c.at("batch").get<int64_t>();
    g.weights = test::load_tensors(dir + "/weights.safetensors");
    for (const Json& j : meta.at("cases")) {
      Case k;
      k.name = j.at("name").get<std::string>();
      k.S = j.at("S").get<int64_t>();
      k.C = j.at("capacity").get<int64_t>();
      k.cfg = {.dim = c.at("dim").get<int64_t>(),
               .inner = c.at("inner").get<int64_t>(),
               .experts = c.at("experts").get<int64_t>(),
               .capacity_factor = j.at("cf").get<double>(),
               .use_sigmoid = j.at("sigmoid").get<bool>(),
               .route_scale = c.at("route_scale").get<double>()};
      k.t = test::load_tensors(dir + "/" + k.name + ".safetensors");
      g.cases.push_back(std::move(k));
    }
    return g;
  }();
  return g;
}

// [E, A, B] -> [E, B, A]
Tensor transpose_experts(const Tensor& w) {
  const int64_t E = w.dim(0), a = w.dim(1), b = w.dim(2);
  Tensor t = Tensor::empty({E, b, a});
  for (int64_t e = 0; e < E; ++e)
    for (int64_t i = 0; i < a; ++i)
      for (int64_t j = 0; j < b; ++j) t.f32()[(e * b + j) * a + i] = w.f32()[(e * a + i) * b + j];
  return t;
}

struct Build {
  DType compute = DType::kF32;
  DType stored = DType::kF32;   // every weight's stored type
  DType experts = DType::kF32;  // the routed experts' stored type (output-major only)
  ExpertLayout layout = ExpertLayout::kInputMajor;
  bool int8 = false;
};

MoELayer make_layer(const MoEConfig& cfg, const Build& b) {
  const auto& w = golden().weights;
  auto get = [&](const std::string& leaf) {
    Tensor t = w.at(leaf);
    const bool expert = leaf == wmoe::kGateUp || leaf == wmoe::kDown;
    if (expert && b.layout == ExpertLayout::kOutputMajor) t = transpose_experts(t);
    const DType to = expert ? b.experts : b.stored;
    return to == DType::kF32 ? t : t.to(to);
  };
  return MoELayer::from_tensors(get, cfg, b.layout, ops::Compute(b.compute, b.int8));
}

std::vector<float> run(const MoELayer& layer, const Case& k, int64_t B) {
  std::vector<float> out(static_cast<size_t>(B * k.S * k.cfg.dim));
  layer.forward(kFast, B, k.S, k.t.at("temb").f32(), k.t.at("xn").f32(), k.t.at("xm").f32(),
                out.data());
  return out;
}

void expect_routing(const MoELayer& layer, const Case& k, int64_t B, const std::string& tag,
                    double weight_tol) {
  const MoELayer::Routing r = layer.route(kFast, B, k.S, k.t.at("temb").f32(), k.t.at("xn").f32());
  ASSERT_EQ(r.capacity, k.C) << k.name;
  const Tensor& idx = k.t.at(tag + ".top_indices");
  const Tensor& wts = k.t.at(tag + ".weights");
  ASSERT_EQ(int64_t(r.tokens.size()), idx.numel()) << k.name;
  int64_t differ = 0;
  for (int64_t i = 0; i < idx.numel(); ++i) differ += r.tokens[size_t(i)] != int64_t(idx.f32()[i]);
  EXPECT_EQ(differ, 0) << k.name << " " << tag << ": token indices differ from torch.topk's";
  const double e = compare(r.weights.data(), wts.f32(), wts.numel()).rel();
  EXPECT_LE(e, weight_tol) << k.name << " " << tag << " routing weights";
}

// Largest distance in bf16 ulps of the reference (both hold bf16 values), and how many differ.
std::pair<double, int64_t> bf16_ulps(const float* got, const float* ref, int64_t n) {
  double worst = 0;
  int64_t differ = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (got[i] == ref[i]) continue;
    ++differ;
    const double ulp = std::ldexp(1.0, std::ilogb(std::max(std::fabs(ref[i]), 1e-30f)) - 7);
    worst = std::max(worst, std::fabs(double(got[i]) - ref[i]) / ulp);
  }
  return {worst, differ};
}

TEST(NucleusMoE, F32MatchesDiffusers) {
  const Golden& g = golden();
  double worst = 0;
  for (const Case& k : g.cases) {
    const MoELayer layer = make_layer(k.cfg, {});
    expect_routing(layer, k, g.B, "f32", 1e-6);
    const std::vector<float> out = run(layer, k, g.B);
    const Tensor& ref = k.t.at("f32.out");
    const double e = compare(out.data(), ref.f32(), ref.numel()).rel();
    EXPECT_LE(e, 1e-5) << k.name;
    std::printf("  %-13s C=%-3lld f32 output: relative error %.3g\n", k.name.c_str(),
                (long long)k.C, e);
    worst = std::max(worst, e);
  }
  std::printf("  worst f32 relative error %.3g\n", worst);
}

TEST(NucleusMoE, Bf16MatchesDiffusers) {
  const Golden& g = golden();
  for (const Case& k : g.cases) {
    const MoELayer layer = make_layer(
        k.cfg, {.compute = DType::kBF16, .stored = DType::kBF16, .experts = DType::kBF16});
    expect_routing(layer, k, g.B, "bf16", 0.0);
    const std::vector<float> out = run(layer, k, g.B);
    const Tensor& ref = k.t.at("bf16.out");
    const auto [ulps, differ] = bf16_ulps(out.data(), ref.f32(), ref.numel());
    std::printf("  %-13s bf16 output: %lld of %lld values differ, at most %.0f bf16 ulp\n",
                k.name.c_str(), (long long)differ, (long long)ref.numel(), ulps);
    // Bit-exact here (AVX512-BF16 oneDNN); another CPU's GEMM summation order may move a value
    // across a bf16 rounding boundary now and then.
    EXPECT_LE(ulps, 1.0) << k.name;
    EXPECT_LE(differ, ref.numel() / 100) << k.name;
  }
}

TEST(NucleusMoE, ReferenceKernelsAgreeWithFast) {
  const Golden& g = golden();
  const ExecContext ref{.kernels = KernelPath::kReference};
  for (const Case& k : g.cases) {
    auto get = [&](const std::string& leaf) { return g.weights.at(leaf); };
    const MoELayer layer = MoELayer::from_tensors(get, k.cfg, ExpertLayout::kInputMajor,
                                                  DType::kF32, /*keep_plain=*/true);
    std::vector<float> out(static_cast<size_t>(g.B * k.S * k.cfg.dim));
    layer.forward(ref, g.B, k.S, k.t.at("temb").f32(), k.t.at("xn").f32(), k.t.at("xm").f32(),
                  out.data());
    const Tensor& want = k.t.at("f32.out");
    EXPECT_LE(compare(out.data(), want.f32(), want.numel()).rel(), 1e-5) << k.name;
  }
}

TEST(NucleusMoE, OutputMajorExpertsEqualInputMajor) {
  const Golden& g = golden();
  for (DType dt : {DType::kF32, DType::kBF16}) {
    for (const Case& k : g.cases) {
      const Build in{.compute = dt, .stored = dt, .experts = dt};
      Build out = in;
      out.layout = ExpertLayout::kOutputMajor;
      const std::vector<float> a = run(make_layer(k.cfg, in), k, g.B);
      const std::vector<float> b = run(make_layer(k.cfg, out), k, g.B);
      EXPECT_TRUE(test::bit_equal(a.data(), b.data(), int64_t(a.size())))
          << k.name << " " << dtype_name(dt);
    }
  }
}

TEST(NucleusMoE, Q8_0ExpertsCloseToF32) {
  const Golden& g = golden();
  for (const Case& k : g.cases) {
    const MoELayer q8 =
        make_layer(k.cfg, {.experts = DType::kQ8_0, .layout = ExpertLayout::kOutputMajor});
    expect_routing(q8, k, g.B, "f32", 1e-6);  // the router is not quantized
    const std::vector<float> out = run(q8, k, g.B);
    const Tensor& ref = k.t.at("f32.out");
    const double e = compare(out.data(), ref.f32(), ref.numel()).rel();
    std::printf("  %-13s Q8_0 experts: relative error %.3g\n", k.name.c_str(), e);
    EXPECT_LE(e, 2e-2) << k.name;
  }
}

TEST(NucleusMoE, Int8ComputePassesThroughToLinear) {
  const Golden& g = golden();
  const Case& k = g.cases.front();
  const std::vector<float> out = run(make_layer(k.cfg, {.int8 = true}), k, g.B);
  const Tensor& ref = k.t.at("f32.out");
  const double e = compare(out.data(), ref.f32(), ref.numel()).rel();
  std::printf("  int8 compute: relative error %.3g\n", e);
  EXPECT_LE(e, 5e-2);
}

TEST(NucleusMoE, BytesAreTheWeightsAsHeld) {
  const Golden& g = golden();
  const Case& k = g.cases.front();
  if (!ops::keeps_as_stored(DType::kBF16, DType::kF32)) GTEST_SKIP() << "compact weights off";
  // bf16 weights at f32 compute stay as stored: 2 bytes per weight.
  int64_t n = 0;
  for (const auto& [name, t] : g.weights) n += t.numel();
  EXPECT_EQ(make_layer(k.cfg, {.stored = DType::kBF16, .experts = DType::kBF16}).bytes(), 2 * n);
  // Q8_0 experts (output-major, as a GGUF holds them) stay as stored: no dequantized copy.
  const int64_t experts = g.weights.at(wmoe::kGateUp).numel() + g.weights.at(wmoe::kDown).numel();
  const MoELayer q8 = make_layer(
      k.cfg,
      {.stored = DType::kBF16, .experts = DType::kQ8_0, .layout = ExpertLayout::kOutputMajor});
  EXPECT_EQ(q8.bytes(), 2 * (n - experts) + dtype_bytes(DType::kQ8_0, experts));
}

TEST(NucleusMoE, ThreadCountDoesNotChangeResult) {
  const Golden& g = golden();
  const std::vector<Build> builds = {
      {},
      {.compute = DType::kBF16, .stored = DType::kBF16, .experts = DType::kBF16},
      {.experts = DType::kQ8_0, .layout = ExpertLayout::kOutputMajor}};
  for (const Build& b : builds) {
    for (const Case& k : g.cases) {
      const MoELayer layer = make_layer(k.cfg, b);
      set_num_threads(1);
      const std::vector<float> one = run(layer, k, g.B);
      set_num_threads(2);
      const std::vector<float> two = run(layer, k, g.B);
      set_num_threads(3);
      const std::vector<float> three = run(layer, k, g.B);
      set_num_threads(0);
      EXPECT_TRUE(test::bit_equal(one.data(), two.data(), int64_t(one.size()))) << k.name;
      EXPECT_TRUE(test::bit_equal(one.data(), three.data(), int64_t(one.size()))) << k.name;
    }
  }
}

// The message of the Error that building (or running) throws.
template <class Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(NucleusMoE, MalformedInputThrowsNamingIt) {
  const Golden& g = golden();
  const MoEConfig cfg = g.cases.front().cfg;
  auto with = [&](const std::string& bad, Tensor t) {
    return [&g, bad, t](const std::string& leaf) { return leaf == bad ? t : g.weights.at(leaf); };
  };
  const Tensor& gu = g.weights.at(wmoe::kGateUp);
  // Output-major expected, input-major given (here D = 2I: only down_proj's shape tells).
  std::string m = error_of(
      [&] { MoELayer::from_tensors(with("", {}), cfg, ExpertLayout::kOutputMajor, DType::kF32); });
  EXPECT_NE(m.find("experts.down_proj has shape [8, 32, 64], expected [8, 64, 32]"),
            std::string::npos)
      << m;
  m = error_of([&] {
    MoELayer::from_tensors(with(wmoe::kDown, gu), cfg, ExpertLayout::kInputMajor, DType::kF32,
                           false, "transformer_blocks.3.img_mlp.");
  });
  EXPECT_NE(m.find("transformer_blocks.3.img_mlp.experts.down_proj has shape"), std::string::npos)
      << m;
  m = error_of([&] {
    MoELayer::from_tensors(with(wmoe::kRouter, g.weights.at(wmoe::kSharedIn)), cfg,
                           ExpertLayout::kInputMajor, DType::kF32);
  });
  EXPECT_NE(m.find("gate.weight has shape"), std::string::npos) << m;
  m = error_of([&] {
    MoELayer::from_tensors(with(wmoe::kSharedOut, Tensor{}), cfg, ExpertLayout::kInputMajor,
                           DType::kF32);
  });
  EXPECT_NE(m.find("shared_expert.net.2.weight is missing"), std::string::npos) << m;
  m = error_of([&] {
    MoELayer::from_tensors(with(wmoe::kGateUp, gu.to(DType::kQ8_0)), cfg, ExpertLayout::kInputMajor,
                           DType::kF32);
  });
  EXPECT_NE(m.find("experts.gate_up_proj is Q8_0"), std::string::npos) << m;
  // A capacity beyond the sequence (torch.topk would refuse it).
  MoEConfig big = cfg;
  big.capacity_factor = 100;
  const MoELayer layer =
      MoELayer::from_tensors(with("", {}), big, ExpertLayout::kInputMajor, DType::kF32);
  const Case& k = g.cases.front();
  m = error_of([&] { run(layer, k, g.B); });
  EXPECT_NE(m.find("exceeds the"), std::string::npos) << m;
}

}  // namespace
}  // namespace flowkv
