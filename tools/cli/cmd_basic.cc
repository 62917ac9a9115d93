// inspect, forward, export-builtin.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <iostream>

#include "commands.h"
#include "flowkv/error.h"
#include "flowkv/flux2.h"
#include "flowkv/inspect.h"
#include "flowkv/limits.h"
#include "flowkv/runtime.h"
#include "flowkv/step_cache.h"
#include "inputs.h"
#include "measure.h"

namespace flowkv::cli {

int guarded(const std::function<int()>& body) {
  try {
    return body();
  } catch (const Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "internal error: %s\n", e.what());
    return 3;
  }
}

uint64_t fnv1a(const void* p, size_t n) {
  uint64_t h = 1469598103934665603ull;
  const auto* b = static_cast<const unsigned char*>(p);
  for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 1099511628211ull;
  return h;
}

Flux2Call demo_call(const Flux2Transformer& m, int64_t h, int64_t w, int64_t text, uint64_t seed) {
  Flux2Call c;
  const int64_t n = h * w;
  c.img = Tensor::empty({1, n, m.in_channels()});
  c.txt = Tensor::empty({1, text, m.text_channels()});
  c.img_ids = Tensor::zeros({n, 4});
  c.txt_ids = Tensor::zeros({text, 4});
  c.timestep = Tensor::from_vector({0.75f}, {1});
  uint64_t s = seed * 0x9e3779b97f4a7c15ull + 1;
  auto next = [&] {  // xorshift uniforms in [-1, 1): inputs only need to be varied and fixed
    s ^= s << 13, s ^= s >> 7, s ^= s << 17;
    return static_cast<float>(static_cast<double>(s >> 11) * 0x1.0p-52 - 1.0);
  };
  for (int64_t i = 0; i < c.img.numel(); ++i) c.img.f32()[i] = next();
  for (int64_t i = 0; i < c.txt.numel(); ++i) c.txt.f32()[i] = next();
  for (int64_t y = 0; y < h; ++y) {
    for (int64_t x = 0; x < w; ++x) {
      c.img_ids.f32()[(y * w + x) * 4 + 1] = static_cast<float>(y);
      c.img_ids.f32()[(y * w + x) * 4 + 2] = static_cast<float>(x);
    }
  }
  for (int64_t l = 0; l < text; ++l) c.txt_ids.f32()[l * 4 + 3] = static_cast<float>(l);
  return c;
}

void add_inspect(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "inspect",
      "Describe a checkpoint (family, variant, parameters, bytes by dtype) and list every\n"
      "problem in its files. Reads headers only. Exit status 1 if problems were found.");
  auto* path = new std::string;
  auto* opts = new InspectOptions;
  cmd->add_option("path", *path,
                  "diffusers transformer folder, pipeline folder, or single .safetensors file")
      ->required();
  cmd->add_flag("--values", opts->check_values,
                "also read every weight and report NaN or infinity (reads the whole checkpoint)");
  cmd->callback([path, opts] {
    std::exit(guarded([&] {
      const InspectReport r = inspect(*path, *opts);
      std::cout << format_report(r);
      return r.ok() ? 0 : 1;
    }));
  });
}

void add_forward(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "forward",
      "Run one transformer forward on deterministic inputs and print the output's statistics\n"
      "and hash. Without --model, runs a built-in model with random weights.");
  struct Opts {
    std::string model, builtin = "tiny", dtype = "auto", grid = "16x16";
    int64_t text = 64;
    uint64_t seed = 0;
    bool check_finite = false;
  };
  auto* o = new Opts;
  cmd->add_option("--model", o->model, "checkpoint to load (folder or .safetensors file)");
  cmd->add_option("--builtin", o->builtin, "built-in model when no --model is given")
      ->capture_default_str();
  cmd->add_option("--dtype", o->dtype, "auto, f32 or bf16")->capture_default_str();
  cmd->add_option("--grid", o->grid, "target latent grid HxW (tokens)")->capture_default_str();
  cmd->add_option("--text-tokens", o->text, "text tokens")
      ->check(CLI::Range(int64_t{1}, limits::kMaxTokens))
      ->capture_default_str();
  cmd->add_option("--seed", o->seed, "seed of the built-in weights and of the inputs");
  cmd->add_flag("--check-finite", o->check_finite,
                "fail naming the first intermediate that holds NaN or infinity (slower)");
  cmd->callback([o] {
    std::exit(guarded([&] {
      const auto [h, w] = parse_grid(o->grid, "--grid");
      const auto t0 = std::chrono::steady_clock::now();
      const Flux2Transformer m =
          o->model.empty() ? Flux2Transformer::builtin(o->builtin, o->seed,
                                                       o->dtype == "auto" ? "f32" : o->dtype)
                           : Flux2Transformer::load(o->model, {o->dtype});
      const auto t1 = std::chrono::steady_clock::now();
      Flux2Call call = demo_call(m, h, w, o->text, o->seed);
      call.check_finite = o->check_finite;
      const Tensor out = m.forward(call);
      const auto t2 = std::chrono::steady_clock::now();
      double sum = 0, sq = 0;
      for (int64_t i = 0; i < out.numel(); ++i) {
        sum += out.f32()[i];
        sq += double(out.f32()[i]) * out.f32()[i];
      }
      std::printf("model:    %s\n", m.variant().c_str());
      std::printf("compute:  %s weights, %d threads, %s kernels\n", m.compute_dtype().c_str(),
                  threads(), simd_target().c_str());
      std::printf("input:    %ldx%ld latent tokens, %ld text tokens\n", h, w, o->text);
      std::printf("output:   %s mean %.6f rms %.6f hash %016lx\n", shape_str(out.shape()).c_str(),
                  sum / out.numel(), std::sqrt(sq / out.numel()),
                  fnv1a(out.raw(), static_cast<size_t>(out.nbytes())));
      std::printf("time:     load %.3f s, forward %.3f s\n",
                  std::chrono::duration<double>(t1 - t0).count(),
                  std::chrono::duration<double>(t2 - t1).count());
      return 0;
    }));
  });
}

void add_export(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "export-builtin",
      "Write a built-in model as a diffusers-format folder (config.json + safetensors).");
  struct Opts {
    std::string name, dir, dtype = "f32";
    uint64_t seed = 0;
  };
  auto* o = new Opts;
  cmd->add_option("name", o->name, "built-in model (tiny, small)")->required();
  cmd->add_option("dir", o->dir, "output folder")->required();
  cmd->add_option("--dtype", o->dtype, "f32 or bf16")->capture_default_str();
  cmd->add_option("--seed", o->seed, "seed of the weights");
  cmd->callback([o] {
    std::exit(guarded([&] {
      Flux2Transformer::write_builtin(o->name, o->seed, o->dtype, o->dir);
      std::printf("wrote %s\n", o->dir.c_str());
      return 0;
    }));
  });
}

void add_caches(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "caches",
      "List the approximate step-cache policies: what each skips, its knobs and defaults.\n"
      "Use them as --cache NAME[:key=value,...] with bench (list values separated by '/').");
  cmd->callback([] {
    std::printf(
        "kv\n  The exact conditioning cache (Klein references, Qwen-Image-2.1 prefix): "
        "bit-identical to recomputing them.\n");
    for (const StepCachePolicy& p : step_cache_policies())
      std::printf("%s\n  %s\n", p.name.c_str(), p.summary.c_str());
    std::printf("\nAll step caches are approximate and off unless named; see docs/caches.md.\n");
    std::exit(0);
  });
}

}  // namespace flowkv::cli
