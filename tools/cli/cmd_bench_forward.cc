// bench-forward: one forward of a mid-size model, its linear layers and the whole forward in
// GFLOP/s and as a fraction of the f32 FMA peak measured in the same run.
#include <algorithm>
#include <cstdio>
#include <vector>

#include "commands.h"
#include "flowkv/error.h"
#include "flowkv/limits.h"
#include "flowkv/model.h"
#include "flowkv/runtime.h"
#include "measure.h"

namespace flowkv::cli {

namespace {

struct Row {
  std::vector<double> total, linear_s, attn_s;
  double linear_flops = 0, attn_flops = 0;
};

}  // namespace

void add_bench_forward(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "bench-forward",
      "Benchmark one forward of the built-in 'medium' model (width 1024, 2 double + 6 single\n"
      "blocks; 1,024 image + 256 text tokens by default) with f32 and bf16 weights: linear\n"
      "layers and whole forward in GFLOP/s and as a fraction of the f32 FMA peak measured in\n"
      "the same run. One warm-up, then runs alternating f32 / bf16; medians are printed.");
  struct Opts {
    std::string builtin = "medium", grid = "32x32";
    int64_t text = 256;
    int runs = 5;
  };
  auto* o = new Opts;
  cmd->add_option("--builtin", o->builtin, "built-in model")->capture_default_str();
  cmd->add_option("--grid", o->grid, "image latent grid HxW")->capture_default_str();
  cmd->add_option("--text-tokens", o->text, "text tokens")
      ->check(CLI::Range(int64_t{1}, limits::kMaxTokens))
      ->capture_default_str();
  cmd->add_option("--runs", o->runs, "timed runs per dtype")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->callback([o] {
    std::exit(guarded([&] {
      const auto [h, w] = parse_grid(o->grid, "--grid");
      const std::vector<std::string> dtypes = {"f32", "bf16"};
      std::vector<Model> models;
      for (const auto& dt : dtypes) models.push_back(Model::builtin(o->builtin, 0, dt));
      const DenoiseInputs in =
          example_inputs(models[0], {.text_tokens = o->text, .height = h, .width = w, .seed = 1});
      std::printf("model:   %s\n", models[0].variant().c_str());
      std::printf("input:   %ldx%ld image tokens, %ld text tokens, batch 1\n", h, w, o->text);
      const double peak = measure_peak_gflops(threads());
      std::printf(
          "machine: %d threads, %s kernels, f32 FMA peak %.1f GFLOP/s (measured now); "
          "bf16 GEMM %s\n",
          threads(), simd_target().c_str(), peak,
          native_bf16_gemm() ? "native" : "through f32 FMA (no bf16 instructions)");
      std::vector<Row> rows(dtypes.size());
      std::vector<Workspace> ws(dtypes.size());
      for (int run = -1; run < o->runs; ++run) {  // run -1 is the warm-up
        for (size_t d = 0; d < dtypes.size(); ++d) {
          ForwardProfile p;
          (void)forward(models[d], in, {}, &p, &ws[d]);
          if (run < 0) continue;
          rows[d].total.push_back(p.seconds);
          rows[d].linear_s.push_back(p.linear_seconds);
          rows[d].attn_s.push_back(p.attention_seconds);
          rows[d].linear_flops = p.linear_flops;
          rows[d].attn_flops = p.attention_flops;
        }
      }
      std::printf("\n%-5s %11s %16s %7s %19s %15s %7s\n", "dtype", "forward ms", "linear GFLOP/s",
                  "% peak", "attention GFLOP/s", "whole GFLOP/s", "% peak");
      for (size_t d = 0; d < dtypes.size(); ++d) {
        const Row& r = rows[d];
        const double t = median(r.total), tl = median(r.linear_s), ta = median(r.attn_s);
        const double lin = r.linear_flops / tl / 1e9,
                     whole = (r.linear_flops + r.attn_flops) / t / 1e9;
        std::printf("%-5s %11.1f %16.1f %6.1f%% %19.1f %15.1f %6.1f%%\n", dtypes[d].c_str(),
                    t * 1e3, lin, 100 * lin / peak, r.attn_flops / ta / 1e9, whole,
                    100 * whole / peak);
      }
      std::printf("\nFLOPs per forward: linear %.2f G, attention %.2f G\n",
                  rows[0].linear_flops / 1e9, rows[0].attn_flops / 1e9);
      return 0;
    }));
  });
}

}  // namespace flowkv::cli
