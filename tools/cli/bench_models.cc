#include "bench_models.h"

#include <cmath>
#include <cstdio>
#include <map>
#include <memory>

#include "flowkv/error.h"
#include "measure.h"

namespace flowkv::cli {

double paired_speedup(const std::vector<double>& slow, const std::vector<double>& fast) {
  std::vector<double> r;
  for (size_t i = 0; i < slow.size() && i < fast.size(); ++i) r.push_back(slow[i] / fast[i]);
  return median(r);
}

OutputError output_error(const Tensor& got, const Tensor& ref) {
  double peak = 0, sq = 0, mx = 0;
  for (int64_t i = 0; i < ref.numel(); ++i) {
    const double d = double(got.f32()[i]) - ref.f32()[i];
    mx = std::max(mx, std::abs(d));
    sq += d * d;
    peak = std::max(peak, std::abs(double(ref.f32()[i])));
  }
  const double mse = sq / static_cast<double>(ref.numel());
  return {mx, mse > 0 ? 10 * std::log10(peak * peak / mse) : INFINITY};
}

BenchModel bench_model(const BenchInputs& o) {
  auto m = std::make_shared<const Model>(
      o.model.empty() ? Model::builtin(o.builtin, o.seed, o.dtype == "auto" ? "f32" : o.dtype)
                      : Model::load(o.model, o.dtype));
  const auto [h, w] = parse_grid(o.grid, "--grid");
  const auto [rh, rw] = parse_grid(o.ref_grid, "--ref-grid");
  // Built once per (references, CFG) and kept: every run of a cell sees the same inputs.
  auto inputs = std::make_shared<std::map<std::pair<int, bool>, DenoiseInputs>>();
  const ExampleShape base{.text_tokens = o.text, .height = h, .width = w, .seed = o.seed};
  auto input = [=](int refs, bool cfg) -> const DenoiseInputs& {
    auto it = inputs->find({refs, cfg});
    if (it != inputs->end()) return it->second;
    ExampleShape s = base;
    s.references.assign(static_cast<size_t>(refs), {rh, rw});
    s.cfg = cfg;
    return (*inputs)[{refs, cfg}] = example_inputs(*m, s);
  };
  BenchModel r{m, m->family(), m->variant(), m->compute_dtype(), m->config_json()};
  const int64_t text = o.text;
  r.predict = [=](int steps, int refs, bool cfg) {
    return predict(*m, text, std::vector<int64_t>(static_cast<size_t>(refs), rh * rw), h * w, steps,
                   cfg);
  };
  r.run = [=](const RunSpec& c, Workspace& ws) {
    DenoiseOptions d;
    d.steps = c.steps;
    d.mode = c.exact ? KVMode::kCached : KVMode::kRecompute;
    d.text_kv_approx = c.text_kv_approx;
    d.kv_budget_bytes = c.budget;
    d.batch_cfg = c.batch_cfg;
    d.step_caches = c.step_caches;
    return denoise(*m, input(c.refs, c.cfg), d, &ws);
  };
  return r;
}

}  // namespace flowkv::cli
