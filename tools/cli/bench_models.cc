#include "bench_models.h"

#include <cmath>
#include <cstdio>
#include <map>
#include <memory>

#include "flowkv/error.h"
#include "flowkv/qwen_image.h"
#include "measure.h"

namespace flowkv::cli {

namespace {

Tensor random_tensor(Shape shape, uint64_t seed) {  // uniform [-1, 1), deterministic
  Tensor t = Tensor::empty(std::move(shape));
  uint64_t s = seed * 0x9e3779b97f4a7c15ull + 0x632be59bd9b4e019ull;
  for (int64_t i = 0; i < t.numel(); ++i) {
    s ^= s << 13, s ^= s >> 7, s ^= s << 17;
    t.f32()[i] = static_cast<float>(static_cast<double>(s >> 11) * 0x1.0p-52 - 1.0);
  }
  return t;
}

}  // namespace

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

BenchModel klein_model(const BenchInputs& o) {
  auto m = std::make_shared<Flux2Transformer>(
      o.model.empty()
          ? Flux2Transformer::builtin(o.builtin, o.seed, o.dtype == "auto" ? "f32" : o.dtype)
          : Flux2Transformer::load(o.model, {o.dtype}));
  const auto [h, w] = parse_grid(o.grid, "--grid");
  const auto [rh, rw] = parse_grid(o.ref_grid, "--ref-grid");
  auto inputs = std::make_shared<std::map<int, DenoiseInputs>>();
  auto input = [=, &o](int refs) -> const DenoiseInputs& {
    auto it = inputs->find(refs);
    if (it != inputs->end()) return it->second;
    DenoiseInputs in;
    in.text = random_tensor({1, o.text, m->text_channels()}, o.seed + 1);
    in.noise = random_tensor({1, h * w, m->in_channels()}, o.seed + 2);
    in.height = h, in.width = w;
    for (int i = 0; i < refs; ++i) {
      in.references.push_back(
          {random_tensor({1, rh * rw, m->in_channels()}, o.seed + 10 + i), rh, rw});
    }
    return (*inputs)[refs] = std::move(in);
  };
  BenchModel r{"klein", m->variant(), m->compute_dtype(), m->config_json()};
  const int64_t text = o.text;
  r.predict = [=](int steps, int refs, bool) {
    return predict_klein_kv(*m, text, h * w,
                            std::vector<int64_t>(static_cast<size_t>(refs), rh * rw), steps);
  };
  r.run = [=](const RunSpec& c, Workspace& ws) {
    DenoiseOptions d;
    d.steps = c.steps;
    d.mode = c.exact ? KVMode::kCached : KVMode::kRecompute;
    d.text_kv_approx = c.text_kv_approx;
    d.kv_budget_bytes = c.budget;
    d.step_caches = c.step_caches;
    return denoise_klein_kv(*m, input(c.refs), d, &ws);
  };
  return r;
}

// Qwen-Image-2.1: the prompt rows hold the condition images' slots (a ref_grid image is
// h*w/4 slots) before `text` text rows; the negative prompt has the same layout, so CFG runs
// both branches in one batched forward.
BenchModel qwen_model(const BenchInputs& o) {
  auto m = std::make_shared<QwenImage21Transformer>(
      o.model.empty()
          ? QwenImage21Transformer::builtin(o.builtin, o.seed, o.dtype == "auto" ? "f32" : o.dtype)
          : QwenImage21Transformer::load(o.model, o.dtype));
  const auto [h, w] = parse_grid(o.grid, "--grid");
  const auto [rh, rw] = parse_grid(o.ref_grid, "--ref-grid");
  FLOWKV_CHECK((h * w) % 4 == 0 && (rh * rw) % 4 == 0,
               "Qwen-Image-2.1 grids need a multiple of 4 tokens (2x2 per slot)");
  auto inputs = std::make_shared<std::map<int, Qwen21Inputs>>();
  auto input = [=, &o](int refs) -> const Qwen21Inputs& {
    auto it = inputs->find(refs);
    if (it != inputs->end()) return it->second;
    Qwen21Inputs in;
    std::vector<uint8_t> slots(static_cast<size_t>(refs * rh * rw / 4), 1);
    slots.insert(slots.end(), static_cast<size_t>(o.text), 0);
    const int64_t rows = static_cast<int64_t>(slots.size());
    in.prompt = {random_tensor({1, rows, m->text_channels()}, o.seed + 1), slots, {}};
    in.negative = {random_tensor({1, rows, m->text_channels()}, o.seed + 3), slots, {}};
    in.noise = random_tensor({1, h * w, m->in_channels()}, o.seed + 2);
    in.height = h, in.width = w;
    for (int i = 0; i < refs; ++i) {
      in.conditions.push_back(
          {random_tensor({1, rh * rw, m->in_channels()}, o.seed + 10 + i), rh, rw});
    }
    return (*inputs)[refs] = std::move(in);
  };
  BenchModel r{"qwen21", m->variant(), m->compute_dtype(), m->config_json()};
  const int64_t text = o.text;
  r.predict = [=](int steps, int refs, bool cfg) {
    return predict_qwen21(*m, text, std::vector<int64_t>(static_cast<size_t>(refs), rh * rw), h * w,
                          steps, cfg);
  };
  r.run = [=](const RunSpec& c, Workspace& ws) {
    Qwen21Inputs in = input(c.refs);
    in.cfg_scale = c.cfg ? 4.0f : 1.0f;
    Qwen21Options d;
    d.steps = c.steps;
    d.use_cache = c.exact;
    d.kv_budget_bytes = c.budget;
    d.batch_cfg = c.batch_cfg;
    d.step_caches = c.step_caches;
    return denoise_qwen21(*m, in, d, &ws);
  };
  return r;
}

}  // namespace flowkv::cli
