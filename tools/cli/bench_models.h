// The models and inputs the benchmarks run: a family's denoising request built from
// deterministic random inputs, with the exact cache on or off and any step caches, and the
// measures the tables share (paired speedups, output error).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "flowkv/model.h"
#include "flowkv/predict.h"
#include "flowkv/workspace.h"

namespace flowkv::cli {

struct BenchInputs {
  std::string family, model, builtin, dtype = "auto";
  std::string grid = "16x16", ref_grid = "16x16";
  int64_t text = 64;
  // The shapes of a real request (--pipeline with -p, --image): its token layout.
  std::string pipeline, prompt;
  std::vector<std::string> images;
  uint64_t seed = 0;
};

// One denoising run of a benchmark cell.
struct RunSpec {
  int steps = 4, refs = 1;
  bool cfg = false;             // true CFG with a negative prompt (FamilyInfo::true_cfg)
  bool exact = true;            // the exact conditioning cache (false: recompute every step)
  bool text_kv_approx = false;  // the named text-KV approximation (FamilyInfo::text_kv_approx)
  std::vector<std::string> step_caches;
  int64_t budget = -1;
  bool batch_cfg = true;  // both CFG branches in one forward when no step cache runs
};

// A model of any family with its benchmark inputs: deterministic random inputs
// (example_inputs) per reference count and CFG setting, run through denoise.
struct BenchModel {
  std::shared_ptr<const Model> model;
  FamilyInfo family;
  std::string variant, dtype, config_json;
  std::function<KVPrediction(int steps, int refs, bool cfg)> predict;
  std::function<DenoiseResult(const RunSpec&, Workspace&)> run;
};

// --model, else --builtin (the family's default when empty); "auto" means f32 for built-ins.
BenchModel bench_model(const BenchInputs& o);

// Median over back-to-back run pairs of slow / fast: slow drift of a shared machine cancels.
double paired_speedup(const std::vector<double>& slow, const std::vector<double>& fast);

// Error of `got` against `ref`: max |difference| and PSNR over the reference's peak.
struct OutputError {
  double max_abs = 0, psnr_db = 0;
};
OutputError output_error(const Tensor& got, const Tensor& ref);

}  // namespace flowkv::cli

namespace flowkv::cli {

// bench --cache: step caches measured against no step cache, with and without the exact cache.
struct CacheBenchPlan {
  std::vector<int> steps, refs, cfgs;
  std::vector<std::string> policies;  // the step caches, composed
  bool exact = false;                 // "kv" was asked for too
  int runs = 3;
  std::string json;
  BenchInputs inputs;
};
int run_cache_bench(const BenchModel& m, const CacheBenchPlan& p);

}  // namespace flowkv::cli
