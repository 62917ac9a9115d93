// time_moe: NucleusMoE-Image's mixture-of-experts MLP at a real shape against a dense SwiGLU
// of the same active size, timed side by side (the MoE benchmark's measurement).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <vector>

#include "core/arena.h"
#include "core/exec_context.h"
#include "flowkv/error.h"
#include "flowkv/limits.h"
#include "flowkv/runtime.h"
#include "models/nucleus/moe.h"
#include "ops/linear.h"

namespace flowkv {

namespace {

// Deterministic values of about +-scale (the timing does not depend on them).
Tensor random_tensor(Shape shape, uint64_t seed, float scale) {
  Tensor t = Tensor::empty(std::move(shape));
  uint64_t s = seed * 0x9e3779b97f4a7c15ull + 1;
  for (int64_t i = 0; i < t.numel(); ++i) {
    s ^= s << 13, s ^= s >> 7, s ^= s << 17;
    t.f32()[i] = scale * static_cast<float>(static_cast<double>(s >> 11) * 0x1.0p-52 * 2 - 1);
  }
  return t;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

MoeTiming time_moe(const MoeShape& s, DType weights, int runs) {
  FLOWKV_CHECK(s.tokens >= 1 && s.tokens <= limits::kMaxTokens && s.dim >= 1 && s.dim <= 16384 &&
                   s.inner >= 1 && s.inner <= 65536 && s.experts >= 1 && s.experts <= 1024 &&
                   s.capacity_factor > 0 && s.capacity_factor <= s.experts,
               "time_moe: shape out of range");
  FLOWKV_CHECK(runs >= 1 && runs <= 1000, "time_moe: runs must be in [1, 1000]");
  FLOWKV_CHECK(s.dim % dtype_block(weights) == 0 && s.inner % dtype_block(weights) == 0,
               "time_moe: the widths must be whole ", dtype_name(weights), " blocks (",
               dtype_block(weights), ")");
  // Computed as a model of these weights computes: bf16 activations with bf16 weights, f32
  // otherwise.
  const ops::Compute compute(weights == DType::kBF16 ? DType::kBF16 : DType::kF32);
  const int64_t D = s.dim, I = s.inner, E = s.experts, S = s.tokens;
  const int64_t cap = std::max<int64_t>(
      1, static_cast<int64_t>(std::ceil(s.capacity_factor * double(S) / double(E))));
  MoeTiming out;
  out.capacity = cap;
  out.routed_rows_per_token = double(E * cap) / double(S);
  // The routed experts output-major (as a GGUF holds them), the rest as diffusers names them.
  std::map<std::string, Tensor> t;
  t[nucleus::wmoe::kRouter] = random_tensor({E, 2 * D}, 1, 0.02f).to(weights);
  t[nucleus::wmoe::kGateUp] = random_tensor({E, 2 * I, D}, 2, 0.02f).to(weights);
  t[nucleus::wmoe::kDown] = random_tensor({E, D, I}, 3, 0.02f).to(weights);
  t[nucleus::wmoe::kSharedIn] = random_tensor({2 * I, D}, 4, 0.02f).to(weights);
  t[nucleus::wmoe::kSharedOut] = random_tensor({D, I}, 5, 0.02f).to(weights);
  const nucleus::MoEConfig c{.dim = D,
                             .inner = I,
                             .experts = E,
                             .capacity_factor = s.capacity_factor,
                             .use_sigmoid = false,
                             .route_scale = 2.5};
  const nucleus::MoELayer moe =
      nucleus::MoELayer::from_tensors([&](const std::string& n) { return t.at(n); }, c,
                                      nucleus::ExpertLayout::kOutputMajor, compute);
  out.moe_bytes = moe.bytes();
  t.clear();
  // The dense SwiGLU doing the same multiply-adds per token: inner (1 + rows per token) x I.
  const int64_t F = static_cast<int64_t>(std::ceil((1.0 + out.routed_rows_per_token) * double(I) /
                                                   dtype_block(weights))) *
                    dtype_block(weights);
  out.dense_inner = F;
  const ops::Linear dense_in(random_tensor({2 * F, D}, 6, 0.02f).to(weights), compute);
  const ops::Linear dense_out(random_tensor({D, F}, 7, 0.02f).to(weights), compute);
  out.dense_bytes = dense_in.packed_bytes() + dense_out.packed_bytes();
  const Tensor temb = random_tensor({1, D}, 8, 1.0f), xn = random_tensor({S, D}, 9, 1.0f),
               xm = random_tensor({S, D}, 10, 1.0f);
  std::vector<float> y(static_cast<size_t>(S * D)), h(static_cast<size_t>(S * 2 * F));
  Arena arena;
  const ExecContext ctx{&arena, KernelPath::kFast, nullptr};
  const auto run_moe = [&] { moe.forward(ctx, 1, S, temb.f32(), xn.f32(), xm.f32(), y.data()); };
  const auto run_dense = [&] {
    dense_in.forward(ctx, make_mat(const_cast<float*>(xm.f32()), S, D),
                     make_mat(h.data(), S, 2 * F));
    for (int64_t r = 0; r < S; ++r) {  // value first, then the gate (diffusers' SwiGLU)
      float* row = h.data() + r * 2 * F;
      for (int64_t j = 0; j < F; ++j) {
        const float g = row[F + j];
        row[j] *= g / (1.0f + std::exp(-g));
      }
    }
    dense_out.forward(ctx, Mat{h.data(), S, F, 2 * F}, make_mat(y.data(), S, D));
  };
  run_moe();  // warm-up
  run_dense();
  std::vector<double> tm, td;
  for (int r = 0; r < runs; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    run_moe();
    tm.push_back(seconds_since(t0));
    t0 = std::chrono::steady_clock::now();
    run_dense();
    td.push_back(seconds_since(t0));
  }
  out.moe_seconds = median(tm);
  out.dense_seconds = median(td);
  // Useful multiply-adds: the router, the shared expert and the routed rows; the dense layer's.
  out.moe_flops = 2.0 * double(S) * 2.0 * double(D) * double(E) +
                  6.0 * double(I) * double(D) * (double(S) + double(E * cap));
  out.dense_flops = 6.0 * double(F) * double(D) * double(S);
  return out;
}

}  // namespace flowkv
