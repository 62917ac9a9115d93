// inspect, forward, export-builtin.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <vector>

#include "commands.h"
#include "flowkv/error.h"
#include "flowkv/inspect.h"
#include "flowkv/limits.h"
#include "flowkv/model.h"
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

namespace {
// Runs the reference model on the same inputs (a forward, or an N-step denoise) and prints the
// error of `m` against it: NMSE, and PSNR over the reference's peak-to-peak range.
// The forward's inputs with `refs` reference images of the target's grid (for a denoise).
ExampleShape request_shape(int64_t h, int64_t w, int64_t text, uint64_t seed, int refs) {
  ExampleShape shape{.text_tokens = text, .height = h, .width = w, .seed = seed};
  for (int i = 0; i < refs; ++i) shape.references.push_back({h, w});
  return shape;
}

void compare_against(const Model& m, const std::string& ref_path, int64_t h, int64_t w,
                     int64_t text, uint64_t seed, int steps, int refs, const Tensor& out) {
  const Model ref = Model::load(ref_path, "f32");
  const DenoiseInputs in = example_inputs(ref, request_shape(h, w, text, seed, refs));
  Tensor a = out, b;
  if (steps > 0) {
    DenoiseOptions opts;
    opts.steps = steps;
    a = denoise(m, in, opts).latents;
    b = denoise(ref, in, opts).latents;
  } else {
    b = forward(ref, in, {.sigma = 0.75f});
  }
  double err = 0, energy = 0, lo = b.f32()[0], hi = b.f32()[0];
  for (int64_t i = 0; i < b.numel(); ++i) {
    const double d = double(a.f32()[i]) - b.f32()[i];
    err += d * d;
    energy += double(b.f32()[i]) * b.f32()[i];
    lo = std::min(lo, double(b.f32()[i]));
    hi = std::max(hi, double(b.f32()[i]));
  }
  const double mse = err / b.numel();
  std::printf("against:  %s (f32), %s: NMSE %.3e, PSNR %.1f dB\n", ref_path.c_str(),
              steps > 0 ? ("final latents of a " + std::to_string(steps) + "-step denoise, " +
                           std::to_string(refs) + " reference(s)")
                              .c_str()
                        : "one forward",
              err / energy, 10.0 * std::log10((hi - lo) * (hi - lo) / mse));
}

}  // namespace

void add_forward(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "forward",
      "Run one transformer forward on deterministic inputs and print the output's statistics\n"
      "and hash. Without --model, runs a built-in model with random weights. With --against,\n"
      "also runs a reference model (e.g. the f32 checkpoint a GGUF file was made from) on the\n"
      "same inputs and prints the NMSE and PSNR of the output against it; with --steps N, both\n"
      "run an N-step denoise (with --refs reference images) and their final latents compare.");
  struct Opts {
    std::string model, builtin = "tiny", dtype = "auto", grid = "16x16", against;
    int64_t text = 64;
    int steps = 0, refs = 0, runs = 1;
    uint64_t seed = 0;
    bool check_finite = false;
  };
  auto* o = new Opts;
  cmd->add_option("--model", o->model, "checkpoint to load (folder or .safetensors file)");
  cmd->add_option("--builtin", o->builtin, "built-in model when no --model is given")
      ->capture_default_str();
  cmd->add_option("--dtype", o->dtype,
                  "compute: auto (bf16 for an all-bf16 checkpoint, else f32), f32, bf16, or int8 "
                  "(8-bit integer arithmetic: weights quantized at load, activations per block)")
      ->capture_default_str();
  cmd->add_option("--grid", o->grid, "target latent grid HxW (tokens)")->capture_default_str();
  cmd->add_option("--text-tokens", o->text, "text tokens")
      ->check(CLI::Range(int64_t{1}, limits::kMaxTokens))
      ->capture_default_str();
  cmd->add_option("--seed", o->seed, "seed of the built-in weights and of the inputs");
  cmd->add_flag("--check-finite", o->check_finite,
                "fail naming the first intermediate that holds NaN or infinity (slower)");
  cmd->add_option("--runs", o->runs, "forwards to time after the first (median printed)")
      ->check(CLI::Range(1, 1000));
  cmd->add_option("--against", o->against, "reference checkpoint (f32 compute) to compare with");
  cmd->add_option("--steps", o->steps,
                  "also run an N-step denoise (with --against: compare its final latents)")
      ->check(CLI::Range(0, 1000));
  cmd->add_option("--refs", o->refs, "with --steps: reference images (the target's grid)")
      ->check(CLI::Range(0, 8));
  cmd->callback([o] {
    std::exit(guarded([&] {
      const auto [h, w] = parse_grid(o->grid, "--grid");
      const auto t0 = std::chrono::steady_clock::now();
      const Model m = o->model.empty() ? Model::builtin(o->builtin, o->seed,
                                                        o->dtype == "auto" ? "f32" : o->dtype)
                                       : Model::load(o->model, o->dtype);
      const auto t1 = std::chrono::steady_clock::now();
      const DenoiseInputs in =
          example_inputs(m, {.text_tokens = o->text, .height = h, .width = w, .seed = o->seed});
      const Tensor out = forward(m, in, {.sigma = 0.75f, .check_finite = o->check_finite});
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
      if (o->runs > 1) {
        std::vector<double> times;
        for (int r = 0; r < o->runs; ++r) {
          const auto a = std::chrono::steady_clock::now();
          (void)forward(m, in, {.sigma = 0.75f});
          times.push_back(
              std::chrono::duration<double>(std::chrono::steady_clock::now() - a).count());
        }
        std::printf("runs:     %d more forwards, median %.3f s\n", o->runs, median(times));
      }
      if (!o->against.empty()) {
        compare_against(m, o->against, h, w, o->text, o->seed, o->steps, o->refs, out);
      } else if (o->steps > 0) {
        DenoiseOptions opts;
        opts.steps = o->steps;
        const DenoiseResult r =
            denoise(m, example_inputs(m, request_shape(h, w, o->text, o->seed, o->refs)), opts);
        std::printf(
            "denoise:  %d steps, %d reference(s): %.3f s, KV %.3f GiB, latents hash %016lx\n",
            o->steps, o->refs, r.loop_seconds,
            static_cast<double>(r.kv_bytes) / double(int64_t{1} << 30),
            fnv1a(r.latents.raw(), static_cast<size_t>(r.latents.nbytes())));
      }
      return 0;
    }));
  });
}

void add_export(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "export-builtin",
      "Write a built-in model as a diffusers-format folder (config.json + safetensors).\n"
      "With --zeros, NAME may also be a released shape (klein-9b-kv, qwen-image-2.1, ...): all\n"
      "weights zero, written as holes of sparse files, for real-size memory checks;\n"
      "klein-9b-kv-pipeline (klein-9b-, klein-4b-) writes the whole pipeline folder but its\n"
      "tokenizer/ (copy a real one in).");
  struct Opts {
    bool zeros = false;
    std::string name, dir, dtype = "f32";
    uint64_t seed = 0;
  };
  auto* o = new Opts;
  cmd->add_option(
         "name", o->name,
         "built-in model (" +
             [] {
               std::string s;
               for (const FamilyInfo& f : registered_families()) {
                 for (const std::string& b : f.builtins) s += (s.empty() ? "" : ", ") + b;
               }
               return s;
             }() +
             ")")
      ->required();
  cmd->add_option("dir", o->dir, "output folder")->required();
  cmd->add_option("--dtype", o->dtype, "f32 or bf16")->capture_default_str();
  cmd->add_option("--seed", o->seed, "seed of the weights");
  cmd->add_flag("--zeros", o->zeros, "all-zero weights as sparse files (released shapes too)");
  cmd->callback([o] {
    std::exit(guarded([&] {
      if (o->zeros) {
        export_zero_weights(o->name, o->dtype, o->dir);
      } else {
        export_builtin(o->name, o->seed, o->dtype, o->dir);
      }
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
    std::string exact;
    for (const FamilyInfo& f : registered_families()) {
      if (!f.exact_cache.empty())
        exact += (exact.empty() ? "" : ", ") + f.name + ": " + f.exact_cache;
    }
    std::printf("kv\n  The exact conditioning cache (%s): bit-identical to recomputing it.\n",
                exact.c_str());
    for (const StepCachePolicy& p : step_cache_policies())
      std::printf("%s\n  %s\n", p.name.c_str(), p.summary.c_str());
    std::printf("\nAll step caches are approximate and off unless named; see docs/caches.md.\n");
    std::exit(0);
  });
}

}  // namespace flowkv::cli
