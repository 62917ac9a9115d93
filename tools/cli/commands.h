// One function per subcommand: registers it on the app with its options and its callback.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>

namespace flowkv::cli {

void add_inspect(CLI::App& app);
void add_forward(CLI::App& app);
void add_export(CLI::App& app);
void add_bench_forward(CLI::App& app);
void add_bench_gemm(CLI::App& app);
void add_bench_moe(CLI::App& app);
void add_bench_tokenizer(CLI::App& app);
void add_quantize(CLI::App& app);
void add_predict(CLI::App& app);
void add_bench(CLI::App& app);
void add_caches(CLI::App& app);
void add_calibrate(CLI::App& app);
void add_generate(CLI::App& app);
void add_bench_store(CLI::App& app);
void add_serve(CLI::App& app);
void add_showcase(CLI::App& app);

// Runs a command body: prints "error: ..." for a flowkv::Error and exits with status 2.
int guarded(const std::function<int()>& body);

}  // namespace flowkv::cli
