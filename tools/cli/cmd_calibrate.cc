// calibrate: fits TeaCache's rescaling polynomial and MagCache's per-step ratios to a pipeline
// by running its requests with teacache:calibrate=1 and magcache:calibrate=1 (both in one run:
// neither skips anything), or with --policy meancache searches MeanCache schedules for the
// given budgets from meancache:calibrate=1's interval costs, and prints them as --cache specs
// to pass back.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <tuple>

#include "commands.h"
#include "flowkv/calibrate.h"
#include "flowkv/error.h"
#include "flowkv/generate.h"
#include "flowkv/io.h"
#include "flowkv/limits.h"
#include "flowkv/showcase.h"
#include "measure.h"

namespace flowkv::cli {

namespace {

struct Opts {
  std::string model, cases, size, json, dtype = "auto";
  std::vector<std::string> prompts, refs;
  int steps = 0;
  uint64_t seed = 0;
  bool seed_given = false;
  std::vector<std::string> policies = {"teacache", "magcache"};
  std::vector<int> budgets;  // MeanCache: one schedule per budget
  double gamma = 2;
  int max_gap = 12;
  bool uses(const std::string& p) const {
    return std::find(policies.begin(), policies.end(), p) != policies.end();
  }
};

// The requests: the manifest's cases (their sizes, its steps and seed unless the flags say
// otherwise), or each -p with the -r pictures.
std::vector<std::pair<std::string, GenerateRequest>> requests_of(const Opts& o) {
  FLOWKV_CHECK(o.cases.empty() != o.prompts.empty(),
               "give either --cases FILE or one or more -p PROMPT (with -r pictures)");
  FLOWKV_CHECK(o.cases.empty() || o.refs.empty(),
               "-r goes with -p; a case's pictures are listed in --cases");
  for (const std::string& p : o.policies) {
    FLOWKV_CHECK(p == "teacache" || p == "magcache" || p == "meancache", "--policy ", p,
                 ": calibrate fits teacache, magcache or meancache");
  }
  FLOWKV_CHECK(!o.uses("meancache") || !o.budgets.empty(),
               "--policy meancache needs --budget N (the computed steps; repeat for more)");
  FLOWKV_CHECK(o.budgets.empty() || o.uses("meancache"), "--budget goes with --policy meancache");
  GenerateRequest base;
  for (const std::string& p : o.policies) {
    base.step_caches.push_back(p + ":calibrate=1" +
                               (p == "meancache" ? ",max_gap=" + std::to_string(o.max_gap) : ""));
  }
  base.dtype = o.dtype;
  base.seed = o.seed;
  base.steps = o.steps;
  if (!o.size.empty()) {
    std::tie(base.width, base.height) =
        parse_dims(o.size, "--size", "64x64 (pixels, width x height)", limits::kMaxImageSide,
                   limits::kMaxImagePixels);
  }
  std::vector<std::pair<std::string, GenerateRequest>> out;
  if (!o.cases.empty()) {
    // The showcase's manifest (flowkv/showcase.h); reading it checks every file it names.
    const ShowcaseManifest m = read_showcase_manifest(o.cases);
    if (o.steps == 0) base.steps = m.steps;
    if (!o.seed_given) base.seed = m.seed;
    for (const ShowcaseCase& c : m.cases) {
      GenerateRequest r = base;
      r.prompt = c.prompt;
      r.references = c.references;
      if (o.size.empty()) r.width = c.width, r.height = c.height;
      out.emplace_back(c.name, r);
    }
  } else {
    for (size_t i = 0; i < o.prompts.size(); ++i) {
      GenerateRequest r = base;
      r.prompt = o.prompts[i];
      r.references = o.refs;
      out.emplace_back("prompt " + std::to_string(i + 1), r);
    }
  }
  return out;
}

void write_json(const std::string& path, const Opts& o, const StepCacheCalibration& cal,
                const std::vector<MeanCacheSchedule>& schedules, int steps,
                const std::vector<std::string>& names) {
  nlohmann::json j;
  j["cases"] = names;
  j["steps"] = steps;
  const PolynomialFit& f = cal.teacache;
  if (o.uses("teacache")) {
    j["teacache"] = {{"coefficients", f.coefficients}, {"pairs", f.samples},
                     {"rms_residual", f.rms_residual}, {"max_residual", f.max_residual},
                     {"x_range", {f.x_min, f.x_max}},  {"spec", cal.teacache_spec()},
                     {"problem", cal.teacache_problem}};
  }
  if (o.uses("magcache")) {
    j["magcache"] = {{"ratios", cal.magcache_ratios},
                     {"series", cal.magcache_series},
                     {"spec", cal.magcache_spec()}};
  }
  if (o.uses("meancache")) {
    nlohmann::json list = nlohmann::json::array();
    for (const MeanCacheSchedule& s : schedules) {
      list.push_back({{"budget", s.budget},
                      {"schedule", s.compute},
                      {"spans", s.spans},
                      {"cost", s.cost},
                      {"peak", s.peak},
                      {"spec", s.spec()}});
    }
    j["meancache"] = {{"gamma", o.gamma},
                      {"max_gap", o.max_gap},
                      {"series", cal.meancache.series},
                      {"schedules", list}};
  }
  write_file_atomic(path, j.dump(2) + "\n");
}

int run(const Opts& o) {
  const auto requests = requests_of(o);
  std::vector<std::vector<StepCacheStats>> measured;
  std::vector<std::string> names;
  int steps = 0;
  for (size_t i = 0; i < requests.size(); ++i) {
    const auto& [name, req] = requests[i];
    GenerateControl control;
    control.on_step = [&, i](const StepEvent& e) {
      steps = e.steps;
      progress("case " + std::to_string(i + 1) + "/" + std::to_string(requests.size()) + " (" +
               name + "): step " + std::to_string(e.step) + "/" + std::to_string(e.steps));
    };
    const GenerateResult res = generate(o.model, req, {}, control);
    progress_done();
    measured.push_back(res.step_caches);
    names.push_back(name);
  }
  const StepCacheCalibration cal = fit_step_caches(measured);
  const PolynomialFit& f = cal.teacache;
  std::printf("calibrated on %zu case(s) at %d steps\n", requests.size(), steps);
  bool ok = true;
  if (o.uses("teacache")) {
    if (cal.teacache_spec().empty()) {
      std::printf("teacache: not fitted: %s\n", cal.teacache_problem.c_str());
      ok = false;
    } else {
      std::printf(
          "teacache: %lld pairs, x in [%.6g, %.6g], degree-4 fit residual rms %.3g, max %.3g\n",
          static_cast<long long>(f.samples), f.x_min, f.x_max, f.rms_residual, f.max_residual);
    }
  }
  if (o.uses("teacache") && !f.coefficients.empty()) {
    // TeaCache accumulates p(x): a negative value inside the fitted range would pay back change
    // already counted (noisy or too few pairs).
    double worst_x = f.x_min, worst = f.at(f.x_min);
    for (int i = 1; i <= 200; ++i) {
      const double x = f.x_min + (f.x_max - f.x_min) * i / 200;
      if (const double p = f.at(x); p < worst) worst = p, worst_x = x;
    }
    if (worst < 0) {
      std::printf(
          "warning: the polynomial is negative (%.3g) at x = %.4g inside the fitted range; "
          "calibrate on more cases\n",
          worst, worst_x);
    }
  }
  if (o.uses("magcache")) {
    std::printf("magcache: %lld series averaged\n", static_cast<long long>(cal.magcache_series));
    ok = ok && !cal.magcache_spec().empty();
  }
  std::vector<MeanCacheSchedule> schedules;
  if (o.uses("meancache")) {
    std::printf("meancache: %lld series averaged, gamma %g\n",
                static_cast<long long>(cal.meancache.series), o.gamma);
    for (int b : o.budgets) {
      schedules.push_back(search_meancache_schedule(cal.meancache, b, o.gamma));
      const MeanCacheSchedule& s = schedules.back();
      std::printf(
          "meancache: budget %d: %zu of %d steps compute, sum of cost^gamma %.4g, "
          "largest interval cost %.4g\n",
          b, s.compute.size(), cal.meancache.steps, s.cost, s.peak);
    }
  }
  if (o.uses("teacache") && !cal.teacache_spec().empty())
    std::printf("--cache %s\n", cal.teacache_spec().c_str());
  if (o.uses("magcache") && !cal.magcache_spec().empty())
    std::printf("--cache %s\n", cal.magcache_spec().c_str());
  for (const MeanCacheSchedule& s : schedules) std::printf("--cache %s\n", s.spec().c_str());
  if (!o.json.empty()) {
    write_json(o.json, o, cal, schedules, steps, names);
    std::printf("wrote %s\n", o.json.c_str());
  }
  return ok ? 0 : 1;
}

}  // namespace

void add_calibrate(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "calibrate",
      "Fit TeaCache's rescaling polynomial and MagCache's per-step ratios to a pipeline: runs\n"
      "each case with teacache:calibrate=1 and magcache:calibrate=1 (nothing is skipped),\n"
      "fits y ~ p(x) of degree 4 by least squares over every (x, y) pair, x the relative L1\n"
      "change of block 0's modulated input between consecutive steps and y that of the model\n"
      "output (as TeaCache's authors fit theirs), and averages MagCache's ratios over the\n"
      "cases. Prints both as --cache specs for generate, bench and serve. The step count\n"
      "matters: calibrate at the one you will run (MagCache resamples its ratios to other\n"
      "counts). Exit status 1 when either could not be fitted.\n"
      "With --policy meancache --budget B: runs each case with meancache:calibrate=1 (nothing\n"
      "is skipped), which measures the error of skipping each interval with each JVP span,\n"
      "averages it over the cases and finds the schedule of B computed steps with the least\n"
      "sum of cost^gamma (peak-suppressed shortest path); prints it as a --cache spec.");
  auto* o = new Opts;
  cmd->add_option("--model", o->model, "pipeline folder")->required();
  cmd->add_option("--cases", o->cases,
                  "a case manifest (cases.json: size, steps, seed and cases with a name, a prompt "
                  "and reference pictures: the showcase manifest, docs/showcase.md)");
  cmd->add_option("-p,--prompt", o->prompts, "a prompt (instead of --cases); repeat for more");
  cmd->add_option("-r,--ref", o->refs, "a reference picture for every -p; repeat for more");
  cmd->add_option("--steps", o->steps,
                  "denoising steps (default: the manifest's, else the model's)")
      ->check(CLI::Range(1, static_cast<int>(limits::kMaxSteps)));
  cmd->add_option("--size", o->size,
                  "WIDTHxHEIGHT in pixels (default: each case's, else the "
                  "pipeline's rule)");
  cmd->add_option("--seed", o->seed, "seed of the initial noise (default: the manifest's, else 0)")
      ->each([o](const std::string&) { o->seed_given = true; });
  cmd->add_option("--dtype", o->dtype, "transformer compute: auto, f32, bf16, int8")
      ->capture_default_str();
  cmd->add_option("--json", o->json, "also write the fit and the specs to this JSON file");
  cmd->add_option("--policy", o->policies,
                  "what to calibrate: teacache, magcache (the default: both), meancache; repeat "
                  "for more")
      ->capture_default_str();
  cmd->add_option("--budget", o->budgets,
                  "meancache: the steps that compute (first and last included); repeat for more "
                  "schedules")
      ->check(CLI::Range(1, static_cast<int>(limits::kMaxSteps)));
  cmd->add_option("--gamma", o->gamma,
                  "meancache: the exponent on each interval's cost (> 1 suppresses peaks)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--max-gap", o->max_gap,
                  "meancache: the most steps from one computed step to the next it measures")
      ->check(CLI::Range(2, 100))
      ->capture_default_str();
  cmd->callback([o] { std::exit(guarded([&] { return run(*o); })); });
}

}  // namespace flowkv::cli
