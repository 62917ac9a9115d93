// bench-store: the reference store on an editing workload. M edit requests over K distinct
// reference images (a seeded random sequence, a new prompt each time) under a RAM budget for B
// reference sets, each request run side by side without the store and with it: hit rate, time
// per request on a hit and on a miss, the saving against no store, and what the cost model
// predicts for the denoise stage of a hit. Every stored run's picture is checked against the
// run without the store (a hit must be exact).
#include <algorithm>
#include <cstdio>
#include <map>
#include <random>

#include "commands.h"
#include "flowkv/error.h"
#include "flowkv/generate.h"
#include "flowkv/limits.h"
#include "flowkv/predict.h"
#include "flowkv/store.h"
#include "measure.h"

namespace flowkv::cli {

namespace {

struct Opts {
  std::string pipeline, size;
  std::vector<std::string> images;
  int requests = 20, steps = 0, budget_sets = 2;
  uint64_t seed = 1;
};

double stage_seconds(const GenerateResult& r, const std::string& name) {
  double s = 0;
  for (const StageReport& st : r.stages) s += st.name == name || name.empty() ? st.seconds : 0;
  return s;
}

double mean(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return v.empty() ? 0 : s / static_cast<double>(v.size());
}

std::string mib(int64_t b) {
  char s[32];
  std::snprintf(s, sizeof s, "%.2f MiB", static_cast<double>(b) / (1 << 20));
  return s;
}

int run(const Opts& o) {
  FLOWKV_CHECK(!o.images.empty(), "give the reference images (--image, repeated)");
  const int K = static_cast<int>(o.images.size());
  std::mt19937 rng(static_cast<uint32_t>(o.seed));
  std::vector<int> order;  // the reference of each request
  for (int i = 0; i < o.requests; ++i) order.push_back(static_cast<int>(rng() % K));
  auto request = [&](int i) {
    GenerateRequest r;
    r.prompt = "edit " + std::to_string(i + 1) + ": the same subject, another light";
    r.references = {o.images[static_cast<size_t>(order[static_cast<size_t>(i)])]};
    r.steps = o.steps;
    r.seed = o.seed + static_cast<uint64_t>(i);
    if (!o.size.empty()) {
      std::tie(r.width, r.height) = parse_dims(o.size, "--size", "WxH pixels", 65536, 1 << 26);
    }
    return r;
  };

  // One reference set's entries (its latents and K/V) and one prompt's, measured once.
  StoreOptions unbounded;
  unbounded.ram_bytes = int64_t{1} << 40;
  auto probe = std::make_shared<ReferenceStore>(unbounded);
  GenerateControl pc;
  pc.store = probe;
  int steps = 0;  // the request's step count, as the loop ran it (the family's default or --steps)
  pc.on_step = [&](const StepEvent& e) { steps = e.steps; };
  progress("measuring one reference set's entries");
  (void)generate(o.pipeline, request(0), {}, pc);
  const StoreStats ps = probe->stats();
  const auto kind_bytes = [&](const char* k) {
    return ps.kinds.count(k) ? ps.kinds.at(k).bytes : int64_t{0};
  };
  const int64_t set_bytes = kind_bytes("kv") + kind_bytes("latents");
  const int64_t prompt_bytes = kind_bytes("prompt");
  const int64_t budget = o.budget_sets * set_bytes + 2 * prompt_bytes;
  StoreOptions bounded;
  bounded.ram_bytes = budget;
  auto store = std::make_shared<ReferenceStore>(bounded);
  GenerateControl sc;
  sc.store = store;

  std::vector<double> plain_total, plain_denoise, hit_total, hit_denoise, miss_total, miss_denoise;
  double sum_plain = 0, sum_store = 0;
  int hits = 0, mismatches = 0;
  for (int i = 0; i < o.requests; ++i) {
    progress("request " + std::to_string(i + 1) + "/" + std::to_string(o.requests) +
             " (reference " + std::to_string(order[static_cast<size_t>(i)] + 1) + ")");
    const GenerateRequest r = request(i);
    const GenerateResult a = generate(o.pipeline, r);
    const GenerateResult b = generate(o.pipeline, r, {}, sc);
    mismatches += a.pixels != b.pixels;
    plain_total.push_back(stage_seconds(a, "")),
        plain_denoise.push_back(stage_seconds(a, "denoise"));
    sum_plain += plain_total.back(), sum_store += stage_seconds(b, "");
    // A hit: the reference set's K/V came from the store (its latents then did too).
    const bool hit = b.store_misses == 1 && b.store_hits >= 2;  // only the new prompt computed
    hits += hit;
    (hit ? hit_total : miss_total).push_back(stage_seconds(b, ""));
    (hit ? hit_denoise : miss_denoise).push_back(stage_seconds(b, "denoise"));
  }
  progress_done();

  // The cost model: a miss computes the references at step 1 and splices them after; a hit
  // splices them from step 1.
  const GenerateLayout l = generate_layout(o.pipeline, request(0));
  const KVPrediction q = predict({.model = l.transformer,
                                  .text_tokens = l.text_tokens,
                                  .target_tokens = l.target_tokens,
                                  .ref_tokens = l.image_tokens,
                                  .steps = steps,
                                  .cfg = l.cfg});
  const double miss_flops = q.uncached_step_flops + (q.steps - 1) * q.cached_step_flops;
  const double hit_flops = q.steps * q.cached_step_flops;
  const double predicted_ratio = hit_flops / miss_flops;
  const double measured_ratio =
      hit_denoise.empty() || miss_denoise.empty() ? 0 : mean(hit_denoise) / mean(miss_denoise);
  const double hit_rate = static_cast<double>(hits) / o.requests;
  const double denoise_share = mean(plain_denoise) / std::max(mean(plain_total), 1e-9);
  const double predicted_saving = hit_rate * (1 - predicted_ratio) * denoise_share;

  const StoreStats s = store->stats();
  std::printf("workload: %d edit requests over %d references (seed %llu), %d steps, %s\n",
              o.requests, K, static_cast<unsigned long long>(o.seed), q.steps, o.pipeline.c_str());
  std::printf("tokens: text %lld, reference %lld, target %lld\n",
              static_cast<long long>(l.text_tokens),
              static_cast<long long>(l.image_tokens.empty() ? 0 : l.image_tokens[0]),
              static_cast<long long>(l.target_tokens));
  std::printf(
      "store: budget %s for %d reference sets (one set: %s of latents and K/V; one "
      "prompt: %s)\n",
      mib(budget).c_str(), o.budget_sets, mib(set_bytes).c_str(), mib(prompt_bytes).c_str());
  std::printf("store: %lld hits, %lld misses, %lld evictions, %lld rejected, %s held at the end\n",
              static_cast<long long>(s.hits), static_cast<long long>(s.misses),
              static_cast<long long>(s.evictions), static_cast<long long>(s.rejected),
              mib(s.bytes).c_str());
  std::printf("\n%-28s %10s %10s\n", "", "request s", "denoise s");
  std::printf("%-28s %10.3f %10.3f\n", "no store (all requests)", mean(plain_total),
              mean(plain_denoise));
  std::printf("%-28s %10.3f %10.3f\n",
              ("store, hit (" + std::to_string(hit_total.size()) + ")").c_str(), mean(hit_total),
              mean(hit_denoise));
  std::printf("%-28s %10.3f %10.3f\n",
              ("store, miss (" + std::to_string(miss_total.size()) + ")").c_str(), mean(miss_total),
              mean(miss_denoise));
  std::printf("\nhit rate %.0f%% (%d of %d)\n", 100 * hit_rate, hits, o.requests);
  std::printf("denoise on a hit / on a miss: measured %.3f, cost model %.3f\n", measured_ratio,
              predicted_ratio);
  std::printf(
      "whole workload: %.2f s without the store, %.2f s with it: saving %.1f%% "
      "(cost model, denoise only: %.1f%%)\n",
      sum_plain, sum_store, 100 * (1 - sum_store / sum_plain), 100 * predicted_saving);
  std::printf("pictures identical with and without the store: %s\n",
              mismatches == 0 ? "yes, every request" : "NO");
  return mismatches == 0 ? 0 : 1;
}

}  // namespace

void add_bench_store(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "bench-store",
      "The reference store on an editing workload: M edit requests over the given reference\n"
      "images (picked at random, seeded; a new prompt each) under a RAM budget for B reference\n"
      "sets. Each request runs without the store and with it, side by side; prints the hit\n"
      "rate, time per request on a hit and a miss, the saving, and the cost model's figure.\n"
      "Fails if any picture differs between the two runs.");
  auto* o = new Opts;
  cmd->add_option("--pipeline", o->pipeline, "pipeline folder (Klein KV or Qwen-Image-2.1)")
      ->required();
  cmd->add_option("--image", o->images, "a reference image; repeat for K of them")->required();
  cmd->add_option("--requests", o->requests, "M, the edit requests")
      ->capture_default_str()
      ->check(CLI::Range(1, 10000));
  cmd->add_option("--budget-sets", o->budget_sets, "B: the store's RAM in reference sets")
      ->capture_default_str()
      ->check(CLI::Range(0, 1000));
  cmd->add_option("--steps", o->steps, "denoising steps (default: the model's)")
      ->check(CLI::Range(1, static_cast<int>(limits::kMaxSteps)));
  cmd->add_option("--size", o->size, "output WIDTHxHEIGHT (default: the reference's)");
  cmd->add_option("--seed", o->seed, "workload and noise seed")->capture_default_str();
  cmd->callback([o] { std::exit(guarded([&] { return run(*o); })); });
}

}  // namespace flowkv::cli
