// bench --cache: approximate step caches side by side with no step cache, on the same inputs in
// one run. Per cell (steps x references x CFG) up to four configurations: uncached (the
// reference output), the exact cache alone (kv), the step caches alone, and both. Reported: what
// each policy computed and skipped, transformer speedup against the same configuration without
// step caches and against uncached, and the error of the final latent against uncached.
#include <cstdio>
#include <nlohmann/json.hpp>

#include "bench_models.h"
#include "flowkv/error.h"
#include "flowkv/io.h"
#include "flowkv/runtime.h"
#include "inputs.h"
#include "measure.h"

namespace flowkv::cli {

namespace {

struct Config {
  std::string name;
  bool exact = false, steps = false;  // exact cache, step caches
  std::vector<double> transformer, loop;
  Tensor latents;
  uint64_t hash = 0;
  std::vector<StepCacheStats> stats;
};

struct CacheCell {
  int steps = 0, refs = 0;
  bool cfg = false;
  std::vector<Config> configs;                    // [uncached, kv?, S, kv+S?]
  const Config& base_of(const Config& c) const {  // the same exact setting, no step cache
    for (const Config& b : configs) {
      if (!b.steps && b.exact == c.exact) return b;
    }
    return configs[0];
  }
};

std::string joined(const std::vector<std::string>& v, const char* sep) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : sep) + x;
  return s;
}

CacheCell run_cell(const BenchModel& m, const CacheBenchPlan& p, CacheCell c, Workspace& ws,
                   const std::string& tag) {
  const std::string steps_name = joined(p.policies, "+");
  c.configs.push_back({"uncached", false, false});
  if (p.exact) c.configs.push_back({"kv", true, false});
  c.configs.push_back({steps_name, false, true});
  if (p.exact) c.configs.push_back({"kv+" + steps_name, true, true});
  const int n = static_cast<int>(c.configs.size()), total = n * (p.runs + 1);
  int done = 0;
  auto one = [&](Config& cfg, bool timed) {
    progress(tag + " run " + std::to_string(++done) + "/" + std::to_string(total) + " (" +
             cfg.name + (timed ? ")" : ", warm-up)"));
    RunSpec spec;
    spec.steps = c.steps, spec.refs = c.refs, spec.cfg = c.cfg;
    spec.exact = cfg.exact;
    spec.batch_cfg = false;  // branches as separate calls everywhere: step caches need them
    if (cfg.steps) spec.step_caches = p.policies;
    const DenoiseResult r = m.run(spec, ws);
    if (!timed) return;
    cfg.transformer.push_back(r.transformer_seconds);
    cfg.loop.push_back(r.loop_seconds);
    cfg.latents = r.latents;
    cfg.hash = fnv1a(r.latents.raw(), static_cast<size_t>(r.latents.nbytes()));
    cfg.stats = r.step_caches;
  };
  for (Config& cfg : c.configs) one(cfg, false);
  for (int run = 0; run < p.runs; ++run) {
    for (int i = 0; i < n; ++i)
      one(c.configs[static_cast<size_t>(run % 2 == 0 ? i : n - 1 - i)], true);
  }
  return c;
}

// "skipped/total" over the policies' counters of one kind.
std::string ratio(const Config& c, int64_t StepCacheStats::*skipped, int64_t StepCacheStats::*run) {
  int64_t s = 0, t = 0;
  for (const StepCacheStats& st : c.stats) s += st.*skipped, t += st.*skipped + st.*run;
  return t == 0 ? "-" : std::to_string(s) + "/" + std::to_string(t);
}

void print_table(const std::vector<CacheCell>& cells) {
  std::printf("\n%5s %4s %3s | %-34s | %9s %11s %11s %6s | %10s %8s %8s | %11s %8s\n", "steps",
              "refs", "cfg", "configuration", "calls skp", "blocks skp", "sublay reu", "uncond",
              "transf s", "vs no sc", "vs unca", "max |err|", "PSNR dB");
  for (const CacheCell& c : cells) {
    const Config& ref = c.configs[0];
    for (const Config& k : c.configs) {
      int64_t uncond = 0;
      for (const StepCacheStats& st : k.stats) uncond += st.branches_skipped;
      const OutputError e = output_error(k.latents, ref.latents);
      std::printf(
          "%5d %4d %3s | %-34.34s | %9s %11s %11s %6s | %10.3f %7.3fx %7.3fx | %11.4g %8.1f\n",
          c.steps, c.refs, c.cfg ? "on" : "off", k.name.c_str(),
          ratio(k, &StepCacheStats::calls_skipped, &StepCacheStats::calls_full).c_str(),
          ratio(k, &StepCacheStats::blocks_skipped, &StepCacheStats::blocks_run).c_str(),
          ratio(k, &StepCacheStats::sublayers_reused, &StepCacheStats::sublayers_computed).c_str(),
          k.steps ? std::to_string(uncond).c_str() : "-", median(k.transformer),
          paired_speedup(c.base_of(k).transformer, k.transformer),
          paired_speedup(ref.transformer, k.transformer), e.max_abs, e.psnr_db);
    }
  }
  std::printf(
      "\ndecisions (one letter per model call; C computed, s skipped, p predicted, r "
      "reused, a approximated):\n");
  for (const CacheCell& c : cells) {
    for (const Config& k : c.configs) {
      for (const StepCacheStats& st : k.stats) {
        std::printf("  steps %d refs %d cfg %s, %s: %s %s\n", c.steps, c.refs, c.cfg ? "on" : "off",
                    k.name.c_str(), st.name.c_str(), st.decisions.c_str());
      }
    }
  }
}

void print_verdicts(const std::vector<CacheCell>& cells, bool exact) {
  int fired = 0, same = 0, pairs = 0;
  for (const CacheCell& c : cells) {
    const Config* alone = nullptr;
    for (const Config& k : c.configs) {
      if (k.steps && !k.exact) alone = &k;
      if (!k.steps) continue;
      for (const StepCacheStats& st : k.stats)
        fired +=
            (st.calls_skipped + st.blocks_skipped + st.sublayers_reused + st.branches_skipped) > 0;
    }
    for (const Config& k : c.configs) {
      if (k.steps && k.exact && alone) ++pairs, same += k.hash == alone->hash;
    }
  }
  std::printf("\n");
  if (exact) {
    std::printf(
        "exact cache + step caches gives the step caches' own output (bit-identical): %d/%d\n",
        same, pairs);
  }
  std::printf("policy runs that skipped or reused anything: %d\n", fired);
  for (const CacheCell& c : cells) {  // what policies were asked to measure (calibration)
    for (const Config& k : c.configs) {
      for (const StepCacheStats& st : k.stats) {
        if (!st.report.empty())
          std::printf("steps %d refs %d, %s:%s", c.steps, c.refs, k.name.c_str(),
                      st.report.c_str());
      }
    }
  }
}

void write_json(const std::string& path, const BenchModel& m, const CacheBenchPlan& p,
                const std::vector<CacheCell>& cells) {
  nlohmann::json j;
  j["model"] = {{"family", m.family.name}, {"variant", m.variant}, {"compute_dtype", m.dtype}};
  j["machine"] = {{"threads", threads()}, {"simd", simd_target()}};
  j["inputs"] = {{"text_tokens", p.inputs.text},
                 {"grid", p.inputs.grid},
                 {"ref_grid", p.inputs.ref_grid},
                 {"runs", p.runs},
                 {"policies", p.policies}};
  for (const CacheCell& c : cells) {
    nlohmann::json cell = {{"steps", c.steps}, {"refs", c.refs}, {"cfg", c.cfg}};
    for (const Config& k : c.configs) {
      const OutputError e = output_error(k.latents, c.configs[0].latents);
      nlohmann::json policies = nlohmann::json::array();
      for (const StepCacheStats& st : k.stats) {
        policies.push_back({{"name", st.name},
                            {"settings", st.settings},
                            {"decisions", st.decisions},
                            {"blocks_run", st.blocks_run},
                            {"blocks_skipped", st.blocks_skipped},
                            {"sublayers_computed", st.sublayers_computed},
                            {"sublayers_reused", st.sublayers_reused},
                            {"branches_skipped", st.branches_skipped}});
      }
      cell["configs"].push_back(
          {{"name", k.name},
           {"exact_cache", k.exact},
           {"transformer_seconds", k.transformer},
           {"loop_seconds", k.loop},
           {"speedup_vs_no_step_cache", paired_speedup(c.base_of(k).transformer, k.transformer)},
           {"speedup_vs_uncached", paired_speedup(c.configs[0].transformer, k.transformer)},
           {"max_abs_error", e.max_abs},
           {"psnr_db", e.psnr_db},
           {"output_hash", k.hash},
           {"policies", policies}});
    }
    j["cells"].push_back(cell);
  }
  write_file_atomic(path, j.dump(2) + "\n");  // checked, fsynced, renamed into place
}

}  // namespace

int run_cache_bench(const BenchModel& m, const CacheBenchPlan& p) {
  FLOWKV_CHECK(!p.policies.empty(),
               "--cache: name at least one step cache (the exact cache alone is what bench "
               "without --cache measures); policies: ",
               [] {
                 std::string s;
                 for (const auto& x : step_cache_policies()) s += (s.empty() ? "" : ", ") + x.name;
                 return s;
               }());
  check_step_caches(p.policies, *m.model);
  std::printf("flowkv bench --cache: step caches (%s) against no step cache%s\n",
              joined(p.policies, " + ").c_str(),
              p.exact ? ", with and without the exact cache" : "");
  std::printf("model:   %s, %s compute\n", m.variant.c_str(), m.dtype.c_str());
  std::printf("machine: %d threads, %s kernels\n", threads(), simd_target().c_str());
  std::printf("inputs:  batch 1, %ld text tokens, target %s tokens, references %s tokens each\n",
              p.inputs.text, p.inputs.grid.c_str(), p.inputs.ref_grid.c_str());
  std::printf(
      "runs:    per configuration and cell, 1 warm-up + %d timed, alternating; medians\n"
      "speedup: median over back-to-back run pairs; 'vs no sc': against the same exact-cache\n"
      "         setting without step caches; 'vs unca': against uncached\n"
      "error:   final latent against the uncached run's\n",
      p.runs);
  std::fflush(stdout);
  Workspace ws;
  std::vector<CacheCell> cells;
  int index = 0;
  const int total = static_cast<int>(p.steps.size() * p.refs.size() * p.cfgs.size());
  for (int s : p.steps) {
    for (int r : p.refs) {
      for (int g : p.cfgs) {
        CacheCell c;
        c.steps = s, c.refs = r, c.cfg = g != 0;
        const std::string tag = "[" + std::to_string(++index) + "/" + std::to_string(total) +
                                "] steps " + std::to_string(s) + ", refs " + std::to_string(r) +
                                (m.family.true_cfg ? (c.cfg ? ", cfg" : ", no cfg") : "") + ":";
        cells.push_back(run_cell(m, p, c, ws, tag));
      }
    }
  }
  progress_done();
  print_table(cells);
  print_verdicts(cells, p.exact);
  if (!p.json.empty()) {
    write_json(p.json, m, p, cells);
    std::printf("\nwrote %s\n", p.json.c_str());
  }
  return 0;
}

}  // namespace flowkv::cli
