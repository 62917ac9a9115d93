#include "sched/flow_match.h"

#include <cmath>

#include "flowkv/dtype.h"
#include "flowkv/error.h"

namespace flowkv::sched {

FlowMatchConfig flux2_scheduler_config() {
  FlowMatchConfig c;
  c.shift = 3.0;
  c.use_dynamic_shifting = true;
  return c;
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
  FLOWKV_CHECK(c.max_image_seq_len != c.base_image_seq_len,
               "scheduler config: max_image_seq_len equals base_image_seq_len (",
               c.base_image_seq_len, "): the Qwen-Image shift mu divides by their difference");
  const double m = (c.max_shift - c.base_shift) /
                   static_cast<double>(c.max_image_seq_len - c.base_image_seq_len);
  const double b = c.base_shift - m * static_cast<double>(c.base_image_seq_len);
  return static_cast<double>(seq) * m + b;
}

FlowMatchConfig qwen_image_scheduler_config() {
  FlowMatchConfig c;
  c.shift = 1.0;
  c.use_dynamic_shifting = true;
  c.base_shift = 0.5;
  c.max_shift = 0.9;
  c.base_image_seq_len = 256;
  c.max_image_seq_len = 8192;
  c.shift_terminal = 0.02;
  return c;
}

namespace {

// np.linspace(start, stop, n) in float64: start + i * step, the endpoint set exactly.
std::vector<double> np_linspace(double start, double stop, size_t n) {
  std::vector<double> y(n);
  const double step = n > 1 ? (stop - start) / static_cast<double>(n - 1) : 0;
  for (size_t i = 0; i < n; ++i) y[i] = static_cast<double>(i) * step + start;
  if (n > 1) y.back() = stop;
  return y;
}

// Step 2: the shift, in numpy float32 (NEP 50: a Python float meets a float32 array as float32,
// so exp(mu), mu, shift and shift - 1 are each rounded to float32 once, from double).
void shift_sigmas(const FlowMatchConfig& cfg, std::optional<double> mu, std::vector<float>& s) {
  if (cfg.use_dynamic_shifting) {
    // time_shift(mu, 1.0, t): e / (e + (1 / t - 1) ** 1.0); the power of 1.0 is exact.
    const float e = static_cast<float>(cfg.exponential_shift ? std::exp(*mu) : *mu);
    for (float& v : s) v = e / (e + (1.0f / v - 1.0f));
    return;
  }
  // shift * sigmas / (1 + (shift - 1) * sigmas)
  const float sh = static_cast<float>(cfg.shift), sh1 = static_cast<float>(cfg.shift - 1.0);
  for (float& v : s) v = sh * v / (1.0f + sh1 * v);
}

// Step 4: _convert_to_karras / _convert_to_exponential / _convert_to_beta, in float64 over
// [sigma_min, sigma_max] (the config's, else the float32 sigmas' last and first).
std::vector<double> respace(const FlowMatchConfig& cfg, const std::vector<float>& s) {
  const double lo = cfg.sigma_min ? *cfg.sigma_min : static_cast<double>(s.back());
  const double hi = cfg.sigma_max ? *cfg.sigma_max : static_cast<double>(s.front());
  const size_t n = s.size();
  std::vector<double> out(n);
  switch (cfg.spacing) {
    case SigmaSpacing::kKarras: {
      // Python's float ** would be complex for a negative base.
      FLOWKV_CHECK(lo >= 0 && hi >= 0, "scheduler: use_karras_sigmas needs sigmas >= 0, got ", lo,
                   " .. ", hi);
      const double rho = 7.0;
      const double min_inv_rho = std::pow(lo, 1 / rho), max_inv_rho = std::pow(hi, 1 / rho);
      const std::vector<double> ramp = np_linspace(0, 1, n);
      for (size_t i = 0; i < n; ++i) {
        out[i] = std::pow(max_inv_rho + ramp[i] * (min_inv_rho - max_inv_rho), rho);
      }
      break;
    }
    case SigmaSpacing::kExponential: {
      FLOWKV_CHECK(lo > 0 && hi > 0, "scheduler: use_exponential_sigmas takes the log of sigma ",
                   lo > 0 ? hi : lo, " (the schedule must stay above 0)");
      const std::vector<double> l = np_linspace(std::log(hi), std::log(lo), n);
      for (size_t i = 0; i < n; ++i) out[i] = std::exp(l[i]);
      break;
    }
    case SigmaSpacing::kBeta: {
      const std::vector<double> t = np_linspace(0, 1, n);
      for (size_t i = 0; i < n; ++i) out[i] = lo + beta_ppf(1 - t[i], 0.6, 0.6) * (hi - lo);
      break;
    }
    case SigmaSpacing::kShifted:
      break;
  }
  return out;
}

}  // namespace

Schedule set_timesteps(const FlowMatchConfig& cfg, const std::vector<double>& sigmas_in,
                       std::optional<double> mu) {
  FLOWKV_CHECK(!cfg.use_dynamic_shifting || mu,
               "scheduler: use_dynamic_shifting is true, and no mu was given");
  FLOWKV_CHECK(!sigmas_in.empty(), "scheduler: no sigmas");
  // 1. np.array(sigmas).astype(np.float32)
  std::vector<float> s(sigmas_in.begin(), sigmas_in.end());
  shift_sigmas(cfg, mu, s);
  // 3. stretch_shift_to_terminal: (1 - s[-1]) / (1 - shift_terminal) in float32 (the Python
  // float difference rounded once).
  const bool respaced = cfg.spacing != SigmaSpacing::kShifted;
  if (cfg.shift_terminal != 0) {
    const float last = 1.0f - s.back();
    if (last == 0) {
      // diffusers divides by 0 here: its stretched sigmas are NaN (and -inf), which only a
      // respacing over a configured sigma_min and sigma_max leaves unread.
      FLOWKV_CHECK(respaced && cfg.sigma_min && cfg.sigma_max, "scheduler: shift_terminal ",
                   cfg.shift_terminal, " cannot stretch a schedule whose last shifted sigma is 1 (",
                   sigmas_in.size() == 1 ? "a single step" : "sigmas ending at 1",
                   "): diffusers divides 0 by 0 there and its sigmas are NaN");
    } else {
      const float scale = last / static_cast<float>(1.0 - cfg.shift_terminal);
      for (float& v : s) v = 1.0f - (1.0f - v) / scale;
    }
  }
  if (respaced) {
    const std::vector<double> d = respace(cfg, s);
    for (size_t i = 0; i < s.size(); ++i) s[i] = static_cast<float>(d[i]);
  }
  // 5-6. torch float32: timesteps = sigmas * num_train_timesteps, from the inverted sigmas with
  // invert_sigmas; then the terminal sigma.
  if (cfg.invert_sigmas) {
    for (float& v : s) v = 1.0f - v;
  }
  for (size_t i = 0; i < s.size(); ++i) {
    FLOWKV_CHECK(std::isfinite(s[i]), "scheduler: sigma ", i, " of the schedule is ", s[i],
                 " (diffusers computes the same from these sigmas and this config)");
  }
  Schedule out;
  const float n_train = static_cast<float>(cfg.num_train_timesteps);
  for (float v : s) out.timesteps.push_back(v * n_train);
  out.sigmas = std::move(s);
  out.sigmas.push_back(cfg.invert_sigmas ? 1.0f : 0.0f);
  return out;
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
