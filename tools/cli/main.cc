// flowkv command line. Uses the public API (include/flowkv) only.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <iostream>

#include "commands.h"
#include "flowkv/error.h"
#include "flowkv/limits.h"
#include "flowkv/runtime.h"
#include "measure.h"

int main(int argc, char** argv) {
  CLI::App app{
      "flowkv: runs flow-matching diffusion transformers (FLUX.2 Klein, Qwen-Image) on the CPU\n"
      "and makes them fast with exact conditioning KV caches and approximate step caches.\n"};
  app.require_subcommand(1);
  app.fallthrough();  // global options may also follow the subcommand
  app.add_option_function<int>(
         "--threads", [](int n) { flowkv::set_threads(n); },
         "threads for all kernels (default: every core); results do not depend on it")
      ->check(CLI::Range(0, flowkv::limits::kMaxThreads));
  app.add_option_function<std::string>(
      "--mem-budget",
      [](const std::string& s) {
        flowkv::set_memory_budget(s == "none" ? -1 : flowkv::cli::parse_bytes(s, "--mem-budget"));
      },
      "memory flowkv may use, e.g. 20G (default: what the system has available; 'none': no "
      "check). Weights, KV caches and activations are predicted before anything is allocated; "
      "over the budget, the command stops with an error naming the figures");
  flowkv::cli::add_generate(app);
  flowkv::cli::add_serve(app);
  flowkv::cli::add_inspect(app);
  flowkv::cli::add_forward(app);
  flowkv::cli::add_export(app);
  flowkv::cli::add_quantize(app);
  flowkv::cli::add_bench_forward(app);
  flowkv::cli::add_bench_gemm(app);
  flowkv::cli::add_bench_moe(app);
  flowkv::cli::add_bench_tokenizer(app);
  flowkv::cli::add_predict(app);
  flowkv::cli::add_bench(app);
  flowkv::cli::add_bench_store(app);
  flowkv::cli::add_caches(app);
  flowkv::cli::add_showcase(app);
  flowkv::cli::add_calibrate(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // app.exit prints CLI11's message (or the help) and gives CLI11's own code (105 for a
    // value out of range, 114 for a wrong argument count, ...); a usage error is 2 for every
    // subcommand, as for a flowkv::Error, and --help is 0.
    return app.exit(e) == 0 ? 0 : 2;
  } catch (const flowkv::Error& e) {  // from an option's callback
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  }
  return 0;
}
