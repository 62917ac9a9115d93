// Approximate step caches (FirstBlockCache, DBCache, TeaCache, MagCache, TaylorSeer, FORA, PAB,
// FasterCache, SeaCache, MeanCache): named by a spec "name[:key=value,...]" (list values separated
// by '/'), several composed per request, state per request and per CFG branch. See docs/caches.md.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace flowkv {

struct StepCachePolicy {
  std::string name;
  std::string summary;  // what it skips, exact or approximate, knobs and defaults
};

// The registered policies.
std::vector<StepCachePolicy> step_cache_policies();

// Checks names, option names and values (throws flowkv::Error naming the problem); what depends
// on the model (DBCache's block counts, the tables TeaCache and MagCache read) is checked when a
// request starts, or up front by check_step_caches(specs, model) (flowkv/model.h).
void check_step_caches(const std::vector<std::string>& specs);

// What each step cache will skip over a run of `steps` steps with `branches` model calls each
// (2 with CFG), where its knobs alone say it (a fixed schedule, or a bound for a policy that
// decides from the data): flowkv predict prints it beside the exact cache's figures.
struct StepCacheExpectation {
  std::string spec;
  bool known = false;           // false: decided from the model's activations at run time
  bool upper_bound = false;     // true: at most this much (or fewer FLOPs than the fraction)
  double skipped_fraction = 0;  // of the transformer's model calls (or of its sublayers)
  std::string text;             // the schedule in words
  std::string unit;             // what the fraction counts ("model calls", "attention ...")
};
std::vector<StepCacheExpectation> expected_step_cache_work(const std::vector<std::string>& specs,
                                                           int steps, int branches);

// Numbers a policy was asked to measure (calibrate=1), by name: TeaCache's pairs
// "teacache.x" (the relative L1 change of block 0's modulated input since the branch's previous
// call) and "teacache.y" (that of the model output), element i of both from the same call;
// MagCache's "magcache.ratios" (one value per step, the first 1.0). One series per CFG branch
// (and per completed run of num_steps calls, for MagCache). MeanCache's "meancache.costs"
// (branch 0: it measures the guided velocity): [steps, max_gap, max_span] and then, for every
// step i, gap g = 1..max_gap and span K = 1..max_span, the relative L1 distance at step i + g
// between the latents reached by skipping i+1..i+g-1 with span K and the run's (0 for g = 1, -1
// past the last step); flowkv/calibrate.h searches schedules from them.
struct StepCacheSeries {
  std::string name;
  int branch = 0;  // 0: conditional (or the only branch), 1: unconditional
  std::vector<double> values;
};

// What one policy did over a request.
struct StepCacheStats {
  std::string name;
  std::string settings;   // the knobs in effect
  std::string decisions;  // one character per model call (C computed, s skipped,
                          // p predicted, r reused, a approximated)
  std::string report;     // what it was asked to measure (MagCache, TeaCache calibration)
  std::vector<StepCacheSeries> measured;  // the same, as numbers
  int64_t blocks_run = 0, blocks_skipped = 0;
  int64_t sublayers_computed = 0, sublayers_reused = 0;
  int64_t calls_full = 0, calls_skipped = 0;
  int64_t branches_skipped = 0;  // unconditional model calls not run (FasterCache)
};

}  // namespace flowkv
