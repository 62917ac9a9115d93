#include "sched/flow_match.h"

#include <cmath>

#include "flowkv/dtype.h"
#include "flowkv/error.h"

namespace flowkv::sched {

FlowMatchConfig flux2_scheduler_config() {
  return FlowMatchConfig{};
}

std::vector<double> linspace_sigmas(int steps) {
  FLOWKV_CHECK(steps >= 1, "the number of steps must be at least 1, got ", steps);
  std::vector<double> s(static_cast<size_t>(steps));
  const double start = 1.0, stop = 1.0 / steps;
  if (steps == 1) {
    s[0] = start;
    return s;
  }
  const double step = (stop - start) / (steps - 1);
  for (int i = 0; i < steps; ++i) s[static_cast<size_t>(i)] = start + i * step;
  s.back() = stop;  // numpy sets the endpoint exactly
  return s;
}

double empirical_mu(int64_t seq, int steps) {
  const double a1 = 8.73809524e-05, b1 = 1.89833333, a2 = 0.00016927, b2 = 0.45666666;
  if (seq > 4300) return a2 * static_cast<double>(seq) + b2;
  const double m200 = a2 * static_cast<double>(seq) + b2;
  const double m10 = a1 * static_cast<double>(seq) + b1;
  const double a = (m200 - m10) / 190.0;
  const double b = m200 - 200.0 * a;
  return a * steps + b;
}

double linear_mu(int64_t seq, const FlowMatchConfig& c) {
  const double m = (c.max_shift - c.base_shift) /
                   static_cast<double>(c.max_image_seq_len - c.base_image_seq_len);
  const double b = c.base_shift - m * static_cast<double>(c.base_image_seq_len);
  return static_cast<double>(seq) * m + b;
}

FlowMatchConfig qwen_image_scheduler_config() {
  FlowMatchConfig c;
  c.shift = 1.0;
  c.base_shift = 0.5;
  c.max_shift = 0.9;
  c.base_image_seq_len = 256;
  c.max_image_seq_len = 8192;
  c.shift_terminal = 0.02;
  return c;
}

Schedule set_timesteps(const FlowMatchConfig& cfg, const std::vector<double>& sigmas_in,
                       std::optional<double> mu) {
  FLOWKV_CHECK(!cfg.use_dynamic_shifting || mu, "dynamic shifting needs mu");
  FLOWKV_CHECK(!sigmas_in.empty(), "no sigmas");
  Schedule s;
  for (double v : sigmas_in) {
    float sigma = static_cast<float>(v);  // np.array(sigmas).astype(np.float32)
    if (cfg.use_dynamic_shifting) {
      // numpy float32 with the Python float exp(mu) taken as float32 (NEP 50 weak scalars).
      const float e = static_cast<float>(cfg.exponential_shift ? std::exp(*mu) : *mu);
      const float r = 1.0f / sigma - 1.0f;
      sigma = e / (e + r);
    } else {
      const float sh = static_cast<float>(cfg.shift);
      sigma = sh * sigma / (1.0f + (sh - 1.0f) * sigma);
    }
    s.sigmas.push_back(sigma);
  }
  if (cfg.shift_terminal > 0) {
    const float scale = (1.0f - s.sigmas.back()) / (1.0f - static_cast<float>(cfg.shift_terminal));
    for (float& v : s.sigmas) v = 1.0f - (1.0f - v) / scale;
  }
  for (float v : s.sigmas) s.timesteps.push_back(v * static_cast<float>(cfg.num_train_timesteps));
  s.sigmas.push_back(0.0f);
  return s;
}

float model_timestep(float t, bool bf16_latents) {
  if (!bf16_latents) return t / 1000.0f;
  return round_bf16(round_bf16(t) / 1000.0f);
}

void euler_step(float* x, const float* v, int64_t n, float sigma, float sigma_next,
                bool bf16_latents) {
  const float dt = sigma_next - sigma;
  if (!bf16_latents) {
    for (int64_t i = 0; i < n; ++i) {
      const float step = dt * v[i];
      x[i] = x[i] + step;
    }
    return;
  }
  const float dt16 = round_bf16(dt);
  for (int64_t i = 0; i < n; ++i) {
    const float step = round_bf16(dt16 * round_bf16(v[i]));
    x[i] = round_bf16(x[i] + step);
  }
}

}  // namespace flowkv::sched
