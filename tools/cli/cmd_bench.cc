// bench: the exact reference KV cache against the uncached baseline (the same network and
// rules, references recomputed every step), side by side in one run, with the cost model's
// prediction, output hashes, KV bytes and peak memory.
#include <cmath>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>

#include "bench_models.h"
#include "commands.h"
#include "flowkv/error.h"
#include "flowkv/generate.h"
#include "flowkv/io.h"
#include "flowkv/limits.h"
#include "flowkv/model.h"
#include "flowkv/predict.h"
#include "flowkv/runtime.h"
#include "inputs.h"
#include "measure.h"

namespace flowkv::cli {

namespace {

struct Opts : BenchInputs {
  std::string steps, refs, cfg = "0,1", json, kv_budget;
  std::vector<std::string> caches;
  int runs = 5;
  bool approx = false;
};

struct ModeStats {
  std::vector<double> transformer, loop;
  int64_t peak_rss = -1;
  uint64_t hash = 0;
  bool deterministic = true;  // the same hash in every run
  int64_t kv_bytes = 0;
  Tensor latents;  // the last run's output
};

struct Cell {
  int steps = 0, refs = 0;
  bool cfg = false;
  ModeStats cached, recompute, approx;  // approx: text-kv-approx on top of the reference cache
  KVPrediction pred;
  double speedup() const { return paired_speedup(recompute.transformer, cached.transformer); }
  double loop_speedup() const { return paired_speedup(recompute.loop, cached.loop); }
  static double points(double predicted, double measured) {
    return 100.0 * ((1 - 1 / predicted) - (1 - 1 / measured));
  }
};

void record(ModeStats& s, const DenoiseResult& r, int64_t rss) {
  s.transformer.push_back(r.transformer_seconds);
  s.loop.push_back(r.loop_seconds);
  s.peak_rss = std::max(s.peak_rss, rss);
  const uint64_t h = fnv1a(r.latents.raw(), static_cast<size_t>(r.latents.nbytes()));
  if (s.transformer.size() > 1 && h != s.hash) s.deterministic = false;
  s.hash = h;
  s.kv_bytes = r.kv_bytes;
  s.latents = r.latents;
}

Cell run_cell(const BenchModel& runner, const Opts& o, Cell c, int64_t budget, Workspace& ws,
              const std::string& tag) {
  c.pred = runner.predict(c.steps, c.refs, c.cfg);
  ModeStats* stats[3] = {&c.cached, &c.recompute, &c.approx};
  const char* names[3] = {"cached", "uncached", "text-kv-approx"};
  const int n = o.approx ? 3 : 2;
  const int total = n * (o.runs + 1);
  int done = 0;
  auto one = [&](int mode, bool timed) {
    progress(tag + " run " + std::to_string(++done) + "/" + std::to_string(total) + " (" +
             names[mode] + (timed ? ")" : ", warm-up)"));
    RunSpec spec;
    spec.steps = c.steps, spec.refs = c.refs, spec.cfg = c.cfg, spec.budget = budget;
    spec.exact = mode != 1;
    spec.text_kv_approx = mode == 2;
    reset_peak_rss();
    DenoiseResult r;
    try {
      r = runner.run(spec, ws);
    } catch (const KVBudgetError& e) {  // the library names options; say it in flags
      fail("the KV cache needs ", e.need_bytes, " bytes (",
           static_cast<double>(e.need_bytes) / (1 << 30), " GiB) but --kv-budget is ",
           e.budget_bytes, " bytes; raise --kv-budget or use smaller or fewer --refs");
    }
    if (timed) record(*stats[mode], r, peak_rss());
  };
  for (int mode = 0; mode < n; ++mode) one(mode, false);
  for (int run = 0; run < o.runs; ++run) {  // alternate the order so no mode always goes first
    for (int i = 0; i < n; ++i) one(run % 2 == 0 ? i : n - 1 - i, true);
  }
  return c;
}

std::string mib(int64_t b) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f", static_cast<double>(b) / (1 << 20));
  return buf;
}

void print_tables(const std::vector<Cell>& cells) {
  std::printf("\n%5s %4s %3s | %11s %11s %8s %9s %6s | %11s %11s %8s %6s\n", "steps", "refs", "cfg",
              "cached s", "uncached s", "speedup", "predicted", "diff", "loop cach s",
              "loop unca s", "speedup", "diff");
  for (const Cell& c : cells) {
    std::printf(
        "%5d %4d %3s | %11.3f %11.3f %7.3fx %8.3fx %+5.1fp | %11.3f %11.3f %7.3fx %+5.1fp\n",
        c.steps, c.refs, c.cfg ? "on" : "off", median(c.cached.transformer),
        median(c.recompute.transformer), c.speedup(), c.pred.speedup,
        Cell::points(c.pred.speedup, c.speedup()), median(c.cached.loop), median(c.recompute.loop),
        c.loop_speedup(), Cell::points(c.pred.speedup, c.loop_speedup()));
  }
  std::printf("\n%5s %4s %3s | %10s %10s | %13s %13s %9s %8s | %16s %16s %5s\n", "steps", "refs",
              "cfg", "KV MiB", "formula", "peak RSS cach", "peak RSS unca", "diff MiB", "/payload",
              "hash cached", "hash uncached", "same");
  for (const Cell& c : cells) {
    const int64_t d = c.cached.peak_rss - c.recompute.peak_rss;
    std::printf("%5d %4d %3s | %10s %10s | %13s %13s %9s %7.2fx | %016lx %016lx %5s\n", c.steps,
                c.refs, c.cfg ? "on" : "off", mib(c.cached.kv_bytes).c_str(),
                mib(c.pred.kv_bytes).c_str(), mib(c.cached.peak_rss).c_str(),
                mib(c.recompute.peak_rss).c_str(), mib(d).c_str(),
                c.cached.kv_bytes > 0 ? static_cast<double>(d) / c.cached.kv_bytes : 0.0,
                c.cached.hash, c.recompute.hash,
                c.cached.hash == c.recompute.hash && c.cached.deterministic ? "yes" : "NO");
  }
}

void print_approx(const std::vector<Cell>& cells) {
  std::printf(
      "\ntext-kv-approx (step-0 text K/V reused on top of the reference cache; NOT exact):\n");
  std::printf("%5s %4s | %11s %11s %8s | %12s %10s\n", "steps", "refs", "approx s", "recompute s",
              "speedup", "max |error|", "PSNR dB");
  for (const Cell& c : cells) {
    const OutputError e = output_error(c.approx.latents, c.recompute.latents);
    std::printf("%5d %4d | %11.3f %11.3f %7.3fx | %12.4g %10.1f\n", c.steps, c.refs,
                median(c.approx.transformer), median(c.recompute.transformer),
                paired_speedup(c.recompute.transformer, c.approx.transformer), e.max_abs,
                e.psnr_db);
  }
}

void print_verdicts(const std::vector<Cell>& cells) {
  int tf_ok = 0, loop_ok = 0, hash_ok = 0, kv_ok = 0, rss_ok = 0;
  for (const Cell& c : cells) {
    tf_ok += std::abs(Cell::points(c.pred.speedup, c.speedup())) <= 2.0;
    loop_ok += std::abs(Cell::points(c.pred.speedup, c.loop_speedup())) <= 4.0;
    hash_ok += c.cached.hash == c.recompute.hash;
    kv_ok += c.cached.kv_bytes == c.pred.kv_bytes;
    rss_ok += c.cached.peak_rss - c.recompute.peak_rss <= c.cached.kv_bytes * 11 / 10;
  }
  const int n = static_cast<int>(cells.size());
  std::printf("\ntargets (cells meeting them / cells):\n");
  std::printf("  transformer speedup within 2 points of the prediction: %d/%d\n", tf_ok, n);
  std::printf("  whole-loop speedup within 4 points of the prediction:  %d/%d\n", loop_ok, n);
  std::printf("  cached and uncached outputs bit-identical:             %d/%d\n", hash_ok, n);
  std::printf("  KV bytes equal to the payload formula:                 %d/%d\n", kv_ok, n);
  std::printf("  peak RSS above uncached by at most payload + 10%%:      %d/%d\n", rss_ok, n);
}

void write_json(const std::string& path, const BenchModel& m, const Opts& o,
                const std::vector<Cell>& cells) {
  nlohmann::json j;
  j["model"] = {{"family", m.family.name},
                {"variant", m.variant},
                {"compute_dtype", m.dtype},
                {"config", nlohmann::json::parse(m.config_json)}};
  j["machine"] = {{"threads", threads()}, {"simd", simd_target()}};
  j["inputs"] = {{"text_tokens", o.text}, {"grid", o.grid}, {"ref_grid", o.ref_grid},
                 {"runs", o.runs},        {"warmup", 1},    {"order", "alternating"}};
  for (const Cell& c : cells) {
    auto mode = [](const ModeStats& s) {
      return nlohmann::json{{"transformer_seconds_median", median(s.transformer)},
                            {"loop_seconds_median", median(s.loop)},
                            {"transformer_seconds", s.transformer},
                            {"loop_seconds", s.loop},
                            {"peak_rss_bytes", s.peak_rss},
                            {"kv_bytes", s.kv_bytes},
                            {"output_hash", s.hash},
                            {"deterministic", s.deterministic}};
    };
    j["cells"].push_back({{"steps", c.steps},
                          {"refs", c.refs},
                          {"cfg", c.cfg},
                          {"cached", mode(c.cached)},
                          {"recompute", mode(c.recompute)},
                          {"speedup_transformer", c.speedup()},
                          {"speedup_loop", c.loop_speedup()},
                          {"predicted_speedup", c.pred.speedup},
                          {"diff_points_transformer", Cell::points(c.pred.speedup, c.speedup())},
                          {"diff_points_loop", Cell::points(c.pred.speedup, c.loop_speedup())},
                          {"kv_payload_formula_bytes", c.pred.kv_bytes},
                          {"outputs_identical", c.cached.hash == c.recompute.hash}});
    if (o.approx) {
      const OutputError e = output_error(c.approx.latents, c.recompute.latents);
      j["cells"].back()["text_kv_approx"] = {
          {"mode", mode(c.approx)},
          {"speedup_vs_recompute", paired_speedup(c.recompute.transformer, c.approx.transformer)},
          {"max_abs_error", e.max_abs},
          {"psnr_db", e.psnr_db}};
    }
  }
  write_file_atomic(path, j.dump(2) + "\n");  // checked, fsynced, renamed into place
}

// "a,b,c" of a list of integers.
std::string joined(const std::vector<int>& v) {
  std::string s;
  for (int x : v) s += (s.empty() ? "" : ",") + std::to_string(x);
  return s;
}

// One line per family that has an exact cache and built-in models: what bench measures on it.
std::string family_lines() {
  std::string s;
  for (const FamilyInfo& f : registered_families()) {
    if (f.exact_cache.empty() || f.builtins.empty()) continue;
    std::string names = f.name;
    for (const std::string& a : f.aliases) names += " (or " + a + ")";
    // Families without conditioning images (NucleusMoE-Image) have no image axis.
    const std::string axis = f.takes_images ? " x " + f.images + "s" : "";
    const std::string counts =
        f.takes_images ? ", " + f.images + "s " + joined(f.bench_images) : std::string();
    s += "  --family " + names + ": " + f.title + ", its exact " + f.exact_cache + " cache;\n" +
         "    cells = steps" + axis + (f.true_cfg ? " x CFG off/on" : "") +
         "; defaults: built-in " + f.default_builtin + ", steps " + joined(f.bench_steps) + counts +
         "\n";
  }
  return s;
}

// The family named by --family, or the one of --model / --builtin (which must agree).
const FamilyInfo& choose_family(const Opts& o) {
  const std::string& named = !o.model.empty() ? o.model : o.builtin;
  if (named.empty())
    return family_info(o.family.empty() ? registered_families().front().name : o.family);
  const FamilyInfo& found = detect_family(named);
  FLOWKV_CHECK(o.family.empty() || &family_info(o.family) == &found, "--family ", o.family, ": ",
               named, " is a ", found.title, " model (--family ", found.name, ")");
  return found;
}

}  // namespace

void add_bench(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "bench",
      "An exact conditioning KV cache against the uncached baseline (the same network and rules,\n"
      "conditioning recomputed every step), side by side. The family comes from --model's\n"
      "config (or --builtin); without either, the first below:\n" +
          family_lines() +
          "With CFG each branch keeps its own cache. Per cell: one warm-up and --runs timed runs\n"
          "of each mode in alternating order; median transformer and whole-loop times, measured\n"
          "and predicted speedup, their difference in points of saving, output hashes, KV bytes\n"
          "and peak RSS. Without --model it runs a built-in model with random weights.");
  auto* o = new Opts;
  cmd->add_option("--family", o->family,
                  "model family (default: from --model's config or --builtin, else " +
                      registered_families().front().name + ")");
  cmd->add_option("--model", o->model, "checkpoint folder or file (default: a built-in model)");
  cmd->add_option("--builtin", o->builtin,
                  "built-in model when no --model (default: the family's, listed above)");
  cmd->add_option("--dtype", o->dtype,
                  "compute: auto, f32, bf16 or int8 (built-in: auto means f32)")
      ->capture_default_str();
  cmd->add_option("--steps", o->steps, "step counts, comma-separated (default: the family's)");
  cmd->add_option("--refs", o->refs,
                  "reference / condition-image counts, comma-separated (default: the family's)");
  cmd->add_option("--cfg", o->cfg, "families with true CFG: CFG settings, comma-separated 0/1")
      ->capture_default_str();
  cmd->add_option("--runs", o->runs, "timed runs per mode and cell (at least 1)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--grid", o->grid, "target latent grid HxW (tokens)")->capture_default_str();
  cmd->add_option("--ref-grid", o->ref_grid, "each reference's latent grid HxW")
      ->capture_default_str();
  cmd->add_option("--text-tokens", o->text, "text tokens")
      ->check(CLI::Range(int64_t{1}, limits::kMaxTokens))
      ->capture_default_str();
  cmd->add_option("--pipeline", o->pipeline,
                  "with -p: take the token counts from this pipeline folder's tokenizer (and "
                  "processor) for the prompt and --image files: text tokens, target grid, "
                  "image grid and count");
  cmd->add_option("-p,--prompt", o->prompt, "with --pipeline: the prompt");
  cmd->add_option("--image", o->images,
                  "with --pipeline: a conditioning image file (repeat); all must give one grid");
  cmd->add_option("--kv-budget", o->kv_budget, "refuse cells whose cache needs more (e.g. 512M)");
  cmd->add_option("--json", o->json, "also write the results to this JSON file");
  cmd->add_option("--seed", o->seed, "seed of the weights and inputs");
  cmd->add_option(
      "--cache", o->caches,
      "measure approximate step caches instead (repeat to compose; 'kv' adds the "
      "exact cache, e.g. --cache kv --cache taylorseer:interval=2): each against no "
      "step cache, with and without kv, errors against uncached. Policies: " +
          [] {
            std::string s;
            for (const auto& p : step_cache_policies()) s += (s.empty() ? "" : ", ") + p.name;
            return s;
          }() +
          " (docs/caches.md)");
  cmd->add_flag("--text-kv-approx", o->approx,
                "families that offer it (FLUX.2): also run the named approximation text-kv-approx "
                "(step-0 text K/V "
                "reused) and report its speed and its error against the uncached run");
  cmd->callback([o] {
    std::exit(guarded([&] {
      const FamilyInfo& f = choose_family(*o);
      FLOWKV_CHECK(f.text_kv_approx || !o->approx, "--text-kv-approx: ", f.title,
                   " offers no text-KV approximation");
      if (!o->pipeline.empty()) {  // a real request's token layout
        GenerateRequest g;
        g.prompt = o->prompt;
        g.references = o->images;
        const GenerateLayout l = generate_layout(o->pipeline, g);
        o->text = l.text_tokens;
        o->grid = std::to_string(l.height / 16) + "x" + std::to_string(l.width / 16);
        for (size_t i = 0; i < l.image_sizes.size(); ++i) {
          const std::string grid = std::to_string(l.image_sizes[i].second / 16) + "x" +
                                   std::to_string(l.image_sizes[i].first / 16);
          FLOWKV_CHECK(i == 0 || grid == o->ref_grid, "--image ", o->images[i], ": grid ", grid,
                       " differs from the first image's ", o->ref_grid,
                       " (bench runs images of one grid)");
          o->ref_grid = grid;
        }
        if (o->refs.empty()) o->refs = std::to_string(l.image_sizes.size());
        std::printf("layout:  %s: %ld text tokens, target %s, %zu image(s) of %s tokens\n",
                    o->pipeline.c_str(), l.text_tokens, o->grid.c_str(), l.image_sizes.size(),
                    o->ref_grid.c_str());
      }
      if (o->builtin.empty()) o->builtin = f.default_builtin;
      if (o->steps.empty()) o->steps = joined(f.bench_steps);
      if (o->refs.empty()) o->refs = joined(f.bench_images);
      const std::vector<int> steps = parse_int_list(o->steps, "--steps", 1, limits::kMaxSteps);
      const std::vector<int> refs = parse_int_list(o->refs, "--refs", 0, limits::kMaxReferences);
      const std::vector<int> cfgs =
          f.true_cfg ? parse_int_list(o->cfg, "--cfg", 0, 1) : std::vector<int>{0};
      for (int s : steps) FLOWKV_CHECK(s >= 1, "--steps: every count must be at least 1");
      const int64_t budget = o->kv_budget.empty() ? -1 : parse_bytes(o->kv_budget, "--kv-budget");
      const BenchModel runner = bench_model(*o);
      if (!o->caches.empty()) {
        FLOWKV_CHECK(!o->approx, "--text-kv-approx and --cache are separate benchmarks");
        CacheBenchPlan p;
        p.steps = steps, p.refs = refs, p.cfgs = cfgs, p.runs = o->runs, p.json = o->json;
        p.inputs = *o;
        for (const std::string& c : o->caches) {
          if (c == "kv")
            p.exact = true;
          else
            p.policies.push_back(c);
        }
        return run_cache_bench(runner, p);
      }
      std::printf("flowkv bench: exact %s KV cache vs uncached (same network, same rules)\n",
                  f.exact_cache.c_str());
      std::printf("model:   %s, %s compute\n", runner.variant.c_str(), runner.dtype.c_str());
      std::printf("machine: %d threads, %s kernels\n", threads(), simd_target().c_str());
      std::printf(
          "inputs:  batch 1, %ld text tokens, target %s tokens, references %s tokens each\n",
          o->text, o->grid.c_str(), o->ref_grid.c_str());
      std::printf("runs:    per mode and cell, 1 warm-up + %d timed, alternating; medians\n",
                  o->runs);
      std::printf(
          "speedup: median over back-to-back run pairs of uncached time / cached time\n"
          "diff:    predicted minus measured saving (saving = 1 - 1/speedup), in points\n");
      std::fflush(stdout);
      Workspace ws;  // shared by both modes: it grows to the prefill step's size once
      std::vector<Cell> cells;
      int index = 0;
      const int total = static_cast<int>(steps.size() * refs.size() * cfgs.size());
      for (int s : steps) {
        for (int r : refs) {
          for (int g : cfgs) {
            Cell c;
            c.steps = s, c.refs = r, c.cfg = g != 0;
            const std::string tag = "[" + std::to_string(++index) + "/" + std::to_string(total) +
                                    "] steps " + std::to_string(s) + ", refs " + std::to_string(r) +
                                    (f.true_cfg ? (c.cfg ? ", cfg" : ", no cfg") : "") + ":";
            cells.push_back(run_cell(runner, *o, c, budget, ws, tag));
          }
        }
      }
      progress_done();
      print_tables(cells);
      if (o->approx) print_approx(cells);
      print_verdicts(cells);
      if (!o->json.empty()) {
        write_json(o->json, runner, *o, cells);
        std::printf("\nwrote %s\n", o->json.c_str());
      }
      return 0;
    }));
  });
}

}  // namespace flowkv::cli
