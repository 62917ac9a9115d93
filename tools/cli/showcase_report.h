// flowkv showcase's results and their reports: the compact table (stdout and GitHub markdown)
// and report.html (pictures side by side, the speed table, a speed-versus-quality plot as
// inline SVG; no script, no network).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "flowkv/image.h"
#include "flowkv/showcase.h"
#include "flowkv/step_cache.h"

namespace flowkv::cli {

// One configuration of the sweep as run: its resolved step count, the uncached run it is
// measured against, and the run without the exact cache that it must equal (if any).
struct ShowcaseRunConfig {
  ShowcaseConfig config;
  int steps = 0;        // resolved: the config's, else the manifest's, else the family's default
  int baseline = -1;    // index of the uncached configuration at the same step count
  int exact_of = -1;    // kv + caches: index of the same caches without kv (its output must equal)
  std::string refused;  // why the model refuses it (then it is not run)
};

// One configuration on one case.
struct ShowcaseRun {
  bool ran = false;
  Image image;
  std::string file;            // images/<case>-<slug>.png, relative to the output folder
  double denoise_seconds = 0;  // the "denoise" stage (model load and the step loop), min of rounds
  double steps_seconds = 0;    // the denoising steps alone (StepEvent seconds), min of rounds
  std::vector<StepCacheStats> stats;
  double psnr_truth = 0, ssim_truth = 0;  // when the case has a truth
  double psnr_base = 0, ssim_base = 0;    // against the uncached run at the same step count
  int64_t exact_diff = -1;                // values differing from exact_of's output (-1: n/a)
};

struct ShowcaseCaseResult {
  ShowcaseCase c;
  std::vector<std::string> reference_files;  // images/<case>-ref<i>.png
  std::string truth_file;                    // images/<case>-truth.png, "" without truth
  std::vector<ShowcaseRun> runs;             // per configuration
};

struct ShowcaseResults {
  std::string model, cases_path, sweep;
  std::vector<ShowcaseRunConfig> configs;
  std::vector<ShowcaseCaseResult> cases;
  int runs = 3;  // timed rounds per case, every configuration once in each (the fastest is kept)
};

// A configuration over all cases.
struct ShowcaseSummary {
  double denoise_seconds = 0, steps_seconds = 0;  // sums over cases
  double speedup = 0;                             // uncached's denoise seconds / these
  double psnr_truth = 0, ssim_truth = 0;          // means over cases with a truth
  int truth_cases = 0;
  double psnr_base = 0, ssim_base = 0;  // means over cases (+inf when all are identical)
  std::string skipped;                  // "blocks 14/64", summed over cases
  std::string exact;                    // "identical", "12 values differ" or "-"
};
ShowcaseSummary summarize(const ShowcaseResults& r, size_t config);

// "inf" for +infinity, "-" for NaN, else printf's %.*f.
std::string fixed(double v, int digits);

// The compact table: plain text (aligned columns) or GitHub markdown.
std::string showcase_table(const ShowcaseResults& r, bool markdown);
// report.html's text.
std::string showcase_html(const ShowcaseResults& r);

}  // namespace flowkv::cli
