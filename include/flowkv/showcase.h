// What `flowkv showcase` runs: a case manifest (prompts, reference pictures, ground truths) and a
// sweep of cache configurations. Both are JSON files a user writes, parsed here with errors
// that name the file and the field (hostile input: tests/fuzz/fuzz_showcase.cc).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace flowkv {

// One picture to make. Paths are resolved against the manifest's folder (absolute ones kept).
struct ShowcaseCase {
  std::string name;    // 1-64 of [A-Za-z0-9._-], not starting with '.'; unique; names its files
  std::string task;    // a word that groups cases ("text", "recolour", "compose")
  std::string prompt;  // may be empty
  int64_t width = 0, height = 0;        // the case's "size", else the manifest's (0: default)
  std::vector<std::string> references;  // in order, at most limits::kMaxReferences
  std::string truth;                    // the expected picture; "" when the case has none
};

// {"size": [width, height], "steps": 8, "seed": 0, "cases": [{"name", "task", "prompt",
//  "size": [width, height], "references": [...], "truth": "path" | null}, ...]}: size, steps
// and seed may be left out (0: the pipeline's default size, the family's default steps,
// seed 0), as may a case's size (the manifest's), references (none) and truth (none). Unknown
// fields are refused (a misspelt "refs" would otherwise silently run a text-to-image case).
struct ShowcaseManifest {
  int64_t width = 0, height = 0;
  int steps = 0;
  uint64_t seed = 0;
  std::vector<ShowcaseCase> cases;  // 1 to kMaxShowcaseCases
};
inline constexpr int64_t kMaxShowcaseCases = 1024;
inline constexpr int64_t kMaxShowcaseConfigs = 1024;

// `text` is the manifest's JSON, `base_dir` the folder its paths are relative to, `what` its
// name in errors. Checks fields only, not the files.
ShowcaseManifest parse_showcase_manifest(const std::string& text, const std::string& base_dir,
                                         const std::string& what);
// Reads and parses the file, then checks that every reference and truth is a readable file.
ShowcaseManifest read_showcase_manifest(const std::string& path);

// One configuration of the caches: a request's kv_cache and step_caches, at a step count.
struct ShowcaseConfig {
  std::string label;  // unique, 1-128 printable ASCII characters; its slug names image files
  bool kv = false;    // the exact conditioning cache
  std::vector<std::string> step_caches;  // specs, e.g. "taylorseer:interval=2"
  int steps = 0;                         // 0: the manifest's
};

// A sweep file: [{"label": "kv+teacache", "caches": ["kv", "teacache:threshold=0.3"],
// "steps": 8}, ...]; "kv" in caches turns on the exact cache, every other entry is a step
// cache spec checked against the registry (check_step_caches); steps may be left out.
std::vector<ShowcaseConfig> parse_showcase_sweep(const std::string& text, const std::string& what);
std::vector<ShowcaseConfig> read_showcase_sweep(const std::string& path);

// The built-in sweeps. "quick": uncached, kv, and kv + each registered step cache at its
// defaults. "full": every registered step cache at its defaults and at two other settings,
// alone and with kv, and TaylorSeer alone and with kv at 4, 8 and 28 steps (with the uncached
// and kv runs at those step counts). A policy that cannot run without options gets them
// (MagCache: ratios=flux1).
std::vector<ShowcaseConfig> showcase_sweep(const std::string& name);

// A sweep as a sweep file's text (parse_showcase_sweep reads it back): a built-in sweep to
// start a tuned one from.
std::string showcase_sweep_json(const std::vector<ShowcaseConfig>& sweep);

// A label as a file name: [A-Za-z0-9._-] kept, every other run of characters one '_'
// ("kv+taylorseer:interval=2" -> "kv_taylorseer_interval_2").
std::string showcase_slug(const std::string& label);

}  // namespace flowkv
