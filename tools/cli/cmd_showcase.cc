// showcase: a case manifest through a pipeline, uncached, with the exact cache and with each
// step-cache configuration of a sweep, side by side in one run: the pictures, the denoise
// stage's time, PSNR / SSIM against the ground truth and against uncached, and whether the
// exact cache kept the output bit-identical. Writes report.html (showcase_report.h).
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "commands.h"
#include "flowkv/error.h"
#include "flowkv/generate.h"
#include "flowkv/image.h"
#include "flowkv/io.h"
#include "flowkv/limits.h"
#include "flowkv/metrics.h"
#include "flowkv/model.h"
#include "flowkv/showcase.h"
#include "flowkv/step_cache.h"
#include "measure.h"
#include "showcase_report.h"

namespace flowkv::cli {

namespace {

struct Opts {
  std::string model, cases, out, sweep = "quick", markdown, write_sweep;
  int runs = 3;  // rounds: a tiny model's run is milliseconds, one round on a busy machine noise
};

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// The sweep as run: its own configurations (duplicates of an earlier one dropped), the
// uncached and kv runs at the manifest's step count first, an uncached run at every other step
// count it uses, and each configuration's baseline and exact counterpart.
std::vector<ShowcaseRunConfig> resolve(const std::vector<ShowcaseConfig>& sweep, int steps) {
  std::vector<ShowcaseConfig> all = {{"uncached", false, {}, 0}, {"kv", true, {}, 0}};
  all.insert(all.end(), sweep.begin(), sweep.end());
  std::vector<ShowcaseRunConfig> out;
  auto find = [&](bool kv, const std::vector<std::string>& caches, int s) {
    for (size_t i = 0; i < out.size(); ++i) {
      if (out[i].config.kv == kv && out[i].config.step_caches == caches && out[i].steps == s) {
        return static_cast<int>(i);
      }
    }
    return -1;
  };
  auto label_used = [&](const std::string& label) {
    for (const ShowcaseRunConfig& c : out) {
      if (c.config.label == label || showcase_slug(c.config.label) == showcase_slug(label))
        return true;
    }
    return false;
  };
  for (const ShowcaseConfig& c : all) {
    const int s = c.steps > 0 ? c.steps : steps;
    if (find(c.kv, c.step_caches, s) >= 0) continue;  // the same run under another label
    const bool uncached = !c.kv && c.step_caches.empty();
    if (!uncached && find(false, {}, s) < 0) {  // its baseline first
      std::string label = "uncached@" + std::to_string(s);
      while (label_used(label)) label += "'";
      ShowcaseRunConfig base;
      base.config = {label, false, {}, s}, base.steps = s;
      out.push_back(base);
    }
    ShowcaseConfig copy = c;
    while (label_used(copy.label)) copy.label += "'";
    ShowcaseRunConfig rc;
    rc.config = copy, rc.steps = s;
    out.push_back(rc);
  }
  for (ShowcaseRunConfig& c : out) {
    c.baseline = find(false, {}, c.steps);
    if (c.config.kv) c.exact_of = find(false, c.config.step_caches, c.steps);
  }
  return out;
}

int64_t differing(const Image& a, const Image& b) {
  if (a.pixels.size() != b.pixels.size()) return static_cast<int64_t>(a.pixels.size());
  int64_t n = 0;
  for (size_t i = 0; i < a.pixels.size(); ++i) n += a.pixels[i] != b.pixels[i];
  return n;
}

// The output folder and its images/ subfolder, created; refused when `out` is a file.
void make_out(const std::string& out) {
  std::error_code ec;
  FLOWKV_CHECK(!std::filesystem::exists(out) || std::filesystem::is_directory(out), "--out ", out,
               ": exists and is not a folder");
  std::filesystem::create_directories(std::filesystem::path(out) / "images", ec);
  FLOWKV_CHECK(!ec, "--out ", out, ": cannot create ", out, "/images: ", ec.message());
}

// One showcase run: the manifest, the configurations and what they gave, the files written.
struct Showcase {
  Showcase(const Opts& opts, ShowcaseManifest manifest) : o(opts), m(std::move(manifest)) {}
  const Opts& o;
  ShowcaseManifest m;
  ShowcaseResults r;
  int steps = 0;  // the manifest's step count, resolved
  int files = 0;
  bool exact_ok = true;

  std::string path(const std::string& rel) const {
    return (std::filesystem::path(o.out) / rel).string();
  }

  // The transformer, loaded once and released before the runs: its family's default step
  // count, and which configurations it refuses (DBCache's block counts, the tables TeaCache and
  // MagCache read).
  void configure(const std::vector<ShowcaseConfig>& sweep) {
    GenerateRequest probe;
    probe.prompt = m.cases[0].prompt;
    probe.references = m.cases[0].references;
    probe.width = m.cases[0].width, probe.height = m.cases[0].height;
    const Model model = Model::load(generate_layout(o.model, probe).transformer);
    // Each case's output size, from its references (no weights read), against its truth: a
    // mismatch is refused before minutes of work, not after.
    for (const ShowcaseCase& c : m.cases) {
      probe.prompt = c.prompt, probe.references = c.references;
      probe.width = c.width, probe.height = c.height;
      const GenerateLayout l = generate_layout(o.model, probe);
      if (c.truth.empty()) continue;
      const Image truth = load_image(c.truth);
      FLOWKV_CHECK(truth.width == l.width && truth.height == l.height, o.cases, ": case \"", c.name,
                   "\": the truth ", c.truth, " is ", truth.width, "x", truth.height,
                   " but the pipeline makes ", l.width, "x", l.height);
    }
    steps = m.steps > 0 ? m.steps : model.family().default_steps;
    r.configs = resolve(sweep, steps);
    for (ShowcaseRunConfig& c : r.configs) {
      try {
        check_step_caches(c.config.step_caches, model);
      } catch (const Error& e) {
        c.refused = e.what();
        std::fprintf(stderr, "%s: refused by this model: %s\n", c.config.label.c_str(), e.what());
      }
    }
  }

  // Configuration k on the case; `timed` false: a warm-up, nothing kept. Returns the run's
  // seconds over all stages.
  double generate_one(ShowcaseCaseResult& cr, size_t k, bool timed) {
    const ShowcaseRunConfig& c = r.configs[k];
    GenerateRequest req;
    req.prompt = cr.c.prompt;
    req.references = cr.c.references;
    req.width = cr.c.width, req.height = cr.c.height;
    req.steps = c.steps;
    req.seed = m.seed;
    req.kv_cache = c.config.kv;
    req.step_caches = c.config.step_caches;
    double steps_seconds = 0, denoise = kNaN, total = 0;
    GenerateControl control;
    control.on_step = [&](const StepEvent& e) { steps_seconds += e.seconds; };
    const GenerateResult res = generate(o.model, req, {}, control);
    for (const StageReport& s : res.stages) {
      if (s.name == "denoise") denoise = s.seconds;
      total += s.seconds;
    }
    FLOWKV_CHECK(!std::isnan(denoise), "generate reported no denoise stage");
    if (!timed) return total;
    ShowcaseRun& run = cr.runs[k];
    Image image = to_image(res);
    if (run.ran) {  // a repeat: the same picture (runs are deterministic), the fastest time
      FLOWKV_CHECK(differing(image, run.image) == 0, cr.c.name, " / ", c.config.label,
                   ": a repeated run gave another picture");
      run.denoise_seconds = std::min(run.denoise_seconds, denoise);
      run.steps_seconds = std::min(run.steps_seconds, steps_seconds);
      return total;
    }
    run.ran = true;
    run.image = std::move(image);
    run.denoise_seconds = denoise, run.steps_seconds = steps_seconds;
    run.stats = res.step_caches;
    run.file = "images/" + cr.c.name + "-" + showcase_slug(c.config.label) + ".png";
    save_png(path(run.file), res);
    ++files;
    return total;
  }

  // PSNR / SSIM against the truth and the baseline, and the exact cache's check; returns the
  // case's line about the latter ("kv identical").
  std::string measure(ShowcaseCaseResult& cr, Image truth) {
    std::string note;
    for (size_t k = 0; k < r.configs.size(); ++k) {
      ShowcaseRun& run = cr.runs[k];
      if (!run.ran) continue;
      const ShowcaseRunConfig& c = r.configs[k];
      if (!cr.c.truth.empty()) {
        FLOWKV_CHECK(truth.width == run.image.width && truth.height == run.image.height, o.cases,
                     ": case \"", cr.c.name, "\": the truth ", cr.c.truth, " is ", truth.width, "x",
                     truth.height, " but the pipeline made ", run.image.width, "x",
                     run.image.height);
        // An RGBA result (Qwen-Image-2.1) is compared with the truth's alpha (opaque if none).
        if (run.image.channels == 4 && truth.channels != 4) {
          truth = load_image(cr.c.truth, PixelFormat::kRGBA);
        }
        run.psnr_truth = psnr(run.image, truth);
        run.ssim_truth = ssim(run.image, truth);
      }
      const ShowcaseRun& base = cr.runs[static_cast<size_t>(c.baseline)];
      if (base.ran) {
        run.psnr_base = psnr(run.image, base.image);
        run.ssim_base = ssim(run.image, base.image);
      }
      if (c.exact_of < 0 || !cr.runs[static_cast<size_t>(c.exact_of)].ran) continue;
      run.exact_diff = differing(run.image, cr.runs[static_cast<size_t>(c.exact_of)].image);
      if (!c.config.step_caches.empty()) continue;
      note +=
          std::string(note.empty() ? "" : ", ") + "kv" +
          (c.steps == steps ? "" : "@" + std::to_string(c.steps)) + " " +
          (run.exact_diff == 0 ? "identical" : std::to_string(run.exact_diff) + " values differ");
      if (run.exact_diff != 0) exact_ok = false;
    }
    return note;
  }

  void run_case(size_t ci) {
    ShowcaseCaseResult cr;
    cr.c = m.cases[ci];
    for (size_t i = 0; i < cr.c.references.size(); ++i) {
      cr.reference_files.push_back("images/" + cr.c.name + "-ref" + std::to_string(i + 1) + ".png");
      save_png(path(cr.reference_files.back()), load_image(cr.c.references[i]));
      ++files;
    }
    Image truth;
    if (!cr.c.truth.empty()) {
      truth = load_image(cr.c.truth);
      cr.truth_file = "images/" + cr.c.name + "-truth.png";
      save_png(path(cr.truth_file), truth);
      ++files;
    }
    cr.runs.resize(r.configs.size());
    double seconds = 0;
    // One untimed warm-up run of the case (its files into the page cache, the kernels' first
    // use), then o.runs rounds, each running every configuration once, the fastest kept per
    // configuration: load on a shared machine drifts, and each configuration sees the same.
    // Every other round runs them in reverse, so that none is always first after the warm-up
    // or always right after the same neighbour.
    seconds += generate_one(cr, 0, false);
    const size_t n = r.configs.size();
    for (int round = 0; round < o.runs; ++round) {
      for (size_t i = 0; i < n; ++i) {
        const size_t k = round % 2 == 0 ? i : n - 1 - i;
        if (r.configs[k].refused.empty()) seconds += generate_one(cr, k, true);
      }
    }
    const std::string note = measure(cr, std::move(truth));
    std::printf("case %zu/%zu %s (%s): %zu configurations in %.2f s; %s\n", ci + 1, m.cases.size(),
                cr.c.name.c_str(), cr.c.task.c_str(), r.configs.size(), seconds, note.c_str());
    std::fflush(stdout);
    r.cases.push_back(std::move(cr));
  }
};

int run(const Opts& o) {
  const std::vector<ShowcaseConfig> sweep = (o.sweep == "quick" || o.sweep == "full")
                                                ? showcase_sweep(o.sweep)
                                                : read_showcase_sweep(o.sweep);
  if (!o.write_sweep.empty()) {
    write_file_atomic(o.write_sweep, showcase_sweep_json(sweep));
    std::printf("wrote %s (%zu configurations)\n", o.write_sweep.c_str(), sweep.size());
    return 0;
  }
  FLOWKV_CHECK(!o.model.empty() && !o.cases.empty() && !o.out.empty(),
               "showcase needs --model, --cases and --out (or --write-sweep)");
  Showcase sc(o, read_showcase_manifest(o.cases));
  sc.r.model = o.model, sc.r.cases_path = o.cases, sc.r.sweep = o.sweep, sc.r.runs = o.runs;
  sc.configure(sweep);
  make_out(o.out);
  for (size_t ci = 0; ci < sc.m.cases.size(); ++ci) sc.run_case(ci);

  std::printf("\n%s\n", showcase_table(sc.r, false).c_str());
  const std::string report = sc.path("report.html");
  write_file_atomic(report, showcase_html(sc.r));
  if (!o.markdown.empty()) write_file_atomic(o.markdown, showcase_table(sc.r, true));
  std::printf("wrote %s (%d images)\n", report.c_str(), sc.files);
  if (!o.markdown.empty()) std::printf("wrote %s\n", o.markdown.c_str());
  if (!sc.exact_ok) {
    std::fprintf(stderr,
                 "error: the exact cache changed the output (kv against uncached): see the "
                 "report's \"= without kv\" column\n");
    return 1;
  }
  return 0;
}

}  // namespace

void add_showcase(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "showcase",
      "Run a case manifest through a pipeline folder uncached, with the exact cache (kv) and with\n"
      "each configuration of a step-cache sweep, side by side in one run, and write an HTML\n"
      "report: every picture next to its references and ground truth, the denoise stage's time\n"
      "and speed-up against uncached, PSNR and SSIM against the ground truth and against the\n"
      "uncached picture, what each step cache skipped, and a speed-versus-quality plot.\n"
      "\n"
      "CASES.json (paths relative to it):\n"
      "  {\"size\": [64, 64], \"steps\": 8, \"seed\": 0, \"cases\": [\n"
      "    {\"name\": \"red-3\", \"task\": \"text\", \"prompt\": \"a red 3 on white\",\n"
      "     \"references\": [], \"truth\": null},\n"
      "    {\"name\": \"compose-7\", \"task\": \"compose\",\n"
      "     \"prompt\": \"put the first left of the second\", \"size\": [128, 64],\n"
      "     \"references\": [\"refs/a.png\", \"refs/b.png\"], \"truth\": "
      "\"truth/compose-7.png\"}]}\n"
      "size is [width, height], a case's own overriding the manifest's; size, steps and seed may\n"
      "be left out (the pipeline's size, the family's steps, seed 0), as may a case's size,\n"
      "references and truth. Names are A-Z a-z 0-9 . _ -.\n"
      "\n"
      "--sweep quick (default): uncached, kv, and kv + each registered step cache at its\n"
      "defaults (MagCache: ratios=flux1). --sweep full: every step cache at its defaults and two\n"
      "other settings, alone and with kv, and TaylorSeer alone and with kv at 4, 8 and 28 steps.\n"
      "--sweep FILE.json: your own list (--sweep full --write-sweep F.json writes one to edit):\n"
      "  [{\"label\": \"kv+fbcache 0.2\", \"caches\": [\"kv\", \"fbcache:threshold=0.2\"]},\n"
      "   {\"label\": \"kv+taylorseer@28\", \"caches\": [\"kv\", \"taylorseer\"], \"steps\": 28}]\n"
      "Uncached and kv at the manifest's steps always run first, and uncached at every other\n"
      "step count a configuration uses (its speed-up and PSNR are against that run).\n"
      "Configurations the model refuses (e.g. DBCache's fn + bn not below its block count) are\n"
      "listed as refused and skipped.\n"
      "\n"
      "Writes OUT/images/<case>-<config>.png (and <case>-ref<i>.png, <case>-truth.png) and\n"
      "OUT/report.html; prints a line per case, then the table. Every run with kv must equal the\n"
      "same run without it, bit for bit (\"= without kv\"); when kv alone does not, the command\n"
      "exits with status 1 after writing the report.\n"
      "\n"
      "The table, one row per configuration over all cases: denoise s (the denoise stage, which\n"
      "loads the transformer and runs the steps; summed), speed-up (uncached's denoise s over\n"
      "this), loop s (the steps alone), PSNR / SSIM truth (mean over cases with a truth), PSNR /\n"
      "SSIM vs uncached (inf and 1: identical), skipped (calls, blocks or sublayers the step\n"
      "caches skipped), = without kv.\n"
      "\n"
      "Timing: each case has one untimed warm-up run, then --runs rounds (default 3), each\n"
      "running every configuration once (every other round in reverse order); the times are\n"
      "each configuration's fastest. The pictures and their PSNR / SSIM are the first round's;\n"
      "a later round must give the same picture, bit for bit, or the command stops with an\n"
      "error. On a machine that is busy with other work use `flowkv --threads 1 showcase ...`:\n"
      "waiting threads spin.");
  auto* o = new Opts;
  cmd->add_option("--model", o->model, "pipeline folder (required)");
  cmd->add_option("--cases", o->cases, "the case manifest, CASES.json (required)");
  cmd->add_option("--out", o->out, "output folder, created; files in it are replaced (required)");
  cmd->add_option("--sweep", o->sweep, "quick, full, or a sweep file (JSON)")
      ->capture_default_str();
  cmd->add_option("--markdown", o->markdown,
                  "also write the table as GitHub markdown to this file (for docs/caches.md)");
  cmd->add_option("--write-sweep", o->write_sweep,
                  "write the --sweep (e.g. full) as a sweep file to edit, and run nothing");
  cmd->add_option("--runs", o->runs,
                  "timed rounds per case, each running every configuration once; the fastest "
                  "time per configuration is kept")
      ->check(CLI::Range(1, 100))
      ->capture_default_str();
  cmd->callback([o] { std::exit(guarded([&] { return run(*o); })); });
}

}  // namespace flowkv::cli
