// bench-gemm: one linear layer at real model shapes with each weight type and compute, in
// GFLOP/s, as a fraction of the f32 FMA peak and against f32 weights, all measured in one run.
#include <cstdio>
#include <sstream>
#include <vector>

#include "commands.h"
#include "flowkv/error.h"
#include "flowkv/runtime.h"
#include "measure.h"

namespace flowkv::cli {

namespace {

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  for (std::string item; std::getline(in, item, ',');) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

struct Shape3 {
  int64_t m, k, n;
};

Shape3 parse_shape(const std::string& s) {
  Shape3 d{};
  char x1 = 0, x2 = 0, rest = 0;
  std::istringstream in(s);
  in >> d.m >> x1 >> d.k >> x2 >> d.n;
  FLOWKV_CHECK(in && x1 == 'x' && x2 == 'x' && !(in >> rest) && d.m > 0 && d.k > 0 && d.n > 0,
               "--shapes: cannot read '", s, "' as MxKxN (e.g. 1024x3072x3072)");
  return d;
}

}  // namespace

void add_bench_gemm(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "bench-gemm",
      "Benchmark one linear layer (y = x·Wᵀ, M rows, K inputs, N outputs) with random weights\n"
      "stored as each --weights type and computed as each --compute, as the models run it.\n"
      "Prints GFLOP/s, the fraction of the f32 FMA peak measured in the same run, the speed\n"
      "against f32 weights at the same shape, and the output's NMSE against f32. The variants\n"
      "of a shape run alternating, one call each per round; medians are printed.");
  struct Opts {
    std::string shapes = "1024x3072x3072,1024x3072x12288,1024x12288x3072,4096x3072x3072";
    std::string weights = "f32,bf16,q8_0,q4_k";
    std::string compute = "f32";
    int runs = 3;
  };
  auto* o = new Opts;
  cmd->add_option("--shapes", o->shapes, "comma-separated MxKxN")->capture_default_str();
  cmd->add_option("--weights", o->weights, "comma-separated weight types")->capture_default_str();
  cmd->add_option("--compute", o->compute, "comma-separated: f32, int8")->capture_default_str();
  cmd->add_option("--runs", o->runs, "timed runs per cell (median)")
      ->capture_default_str()
      ->check(CLI::Range(1, 100));
  cmd->callback([o] {
    std::exit(guarded([&] {
      std::vector<Shape3> shapes;
      for (const auto& s : split_list(o->shapes)) shapes.push_back(parse_shape(s));
      std::vector<DType> types;
      for (const auto& s : split_list(o->weights))
        types.push_back(parse_weight_type(s, "--weights"));
      const std::vector<std::string> computes = split_list(o->compute);
      const double peak = measure_peak_gflops(threads());
      std::printf("machine: %d threads, %s kernels, f32 FMA peak %.1f GFLOP/s (measured now)\n",
                  threads(), simd_target().c_str(), peak);
      std::printf("%-18s %-6s %-7s %10s %9s %8s %9s %10s\n", "M x K x N", "weights", "compute",
                  "weights MB", "GFLOP/s", "of peak", "vs f32", "NMSE");
      std::vector<GemmVariant> variants = {{DType::kF32, "f32"}};  // the baseline, first
      for (const std::string& c : computes) {
        for (DType t : types) {
          if (!(t == DType::kF32 && c == "f32")) variants.push_back({t, c});
        }
      }
      for (const Shape3& s : shapes) {
        const std::vector<GemmTiming> g = time_gemm(s.m, s.k, s.n, variants, o->runs);
        const std::string shape =
            std::to_string(s.m) + "x" + std::to_string(s.k) + "x" + std::to_string(s.n);
        for (size_t i = 0; i < variants.size(); ++i) {
          std::printf("%-18s %-7s %-7s %10.1f %9.1f %7.0f%% %8.2fx %10.2e\n", shape.c_str(),
                      std::string(dtype_name(variants[i].weights)).c_str(),
                      variants[i].compute.c_str(), static_cast<double>(g[i].weight_bytes) / 1e6,
                      g[i].gflops, 100.0 * g[i].gflops / peak, g[i].gflops / g[0].gflops,
                      g[i].nmse);
        }
      }
      return 0;
    }));
  });
}

}  // namespace flowkv::cli

namespace flowkv::cli {

void add_bench_moe(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "bench-moe",
      "Benchmark NucleusMoE-Image's mixture-of-experts MLP (router on [temb | x], expert-choice\n"
      "routing, a shared expert, the routed experts' rows gathered and multiplied per expert)\n"
      "at the released shape (D 2048, I 1344, 64 experts) on --tokens rows, against a dense\n"
      "SwiGLU doing the same multiply-adds per token, side by side in one run, for each\n"
      "--weights type (bf16 computes in bf16, the others in f32). Prints each one's GFLOP/s of\n"
      "useful work, the MoE's speed as a fraction of the dense layer's, and the f32 FMA peak.");
  struct Opts {
    std::string tokens = "1024,4096";  // 512^2 and 1024^2 images
    std::string capacity = "2,4";      // the released layers' capacity factors
    // Q4_K and the other 256-blocks do not fit the 1344-wide expert rows (quantize falls back
    // to Q8_0 for them too).
    std::string weights = "bf16,q8_0";
    int runs = 3;
  };
  auto* o = new Opts;
  cmd->add_option("--tokens", o->tokens, "comma-separated image token counts")
      ->capture_default_str();
  cmd->add_option("--capacity", o->capacity, "comma-separated capacity factors")
      ->capture_default_str();
  cmd->add_option("--weights", o->weights, "comma-separated weight types")->capture_default_str();
  cmd->add_option("--runs", o->runs, "timed runs per cell (median)")
      ->capture_default_str()
      ->check(CLI::Range(1, 100));
  cmd->callback([o] {
    std::exit(guarded([&] {
      const double peak = measure_peak_gflops(threads());
      std::printf("machine: %d threads, %s kernels, f32 FMA peak %.1f GFLOP/s (measured now)\n",
                  threads(), simd_target().c_str(), peak);
      std::printf("%-6s %-4s %-7s %5s %7s %10s %10s %9s %10s %10s %8s\n", "tokens", "cf", "weights",
                  "C", "dense F", "MoE GB", "dense GB", "MoE ms", "MoE GF/s", "dense GF/s",
                  "MoE/dense");
      for (const std::string& ts : split_list(o->tokens)) {
        for (const std::string& cs : split_list(o->capacity)) {
          for (const std::string& ws : split_list(o->weights)) {
            MoeShape s;
            s.tokens = std::stoll(ts);
            s.capacity_factor = std::stod(cs);
            const MoeTiming t = time_moe(s, parse_weight_type(ws, "--weights"), o->runs);
            const double mg = t.moe_flops / t.moe_seconds / 1e9;
            const double dg = t.dense_flops / t.dense_seconds / 1e9;
            std::printf("%-6lld %-4s %-7s %5lld %7lld %10.2f %10.2f %9.1f %10.1f %10.1f %7.0f%%\n",
                        static_cast<long long>(s.tokens), cs.c_str(), ws.c_str(),
                        static_cast<long long>(t.capacity), static_cast<long long>(t.dense_inner),
                        t.moe_bytes / 1e9, t.dense_bytes / 1e9, t.moe_seconds * 1e3, mg, dg,
                        100.0 * mg / dg);
          }
        }
      }
      return 0;
    }));
  });
}

}  // namespace flowkv::cli
