// The flow-matching Euler scheduler as the FLUX.2 and Qwen-Image pipelines use it (diffusers
// FlowMatchEulerDiscreteScheduler + the pipelines' sigma and mu choices). Pure functions: no
// model, no state. Float types follow diffusers (numpy float32 for the shifted sigmas).
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

namespace flowkv::sched {

// How set_timesteps respaces the shifted sigmas (diffusers' use_karras_sigmas,
// use_exponential_sigmas, use_beta_sigmas: at most one of them).
enum class SigmaSpacing { kShifted, kKarras, kExponential, kBeta };

// diffusers' FlowMatchEulerDiscreteScheduler config; the defaults are its __init__ defaults
// (FlowMatchConfig{} is FlowMatchEulerDiscreteScheduler()). A pipeline folder's
// scheduler/scheduler_config.json is read by sched/scheduler_config.h.
struct FlowMatchConfig {
  int64_t num_train_timesteps = 1000;
  double shift = 1.0;  // the static shift, used when use_dynamic_shifting is false
  bool use_dynamic_shifting = false;
  bool exponential_shift = true;  // time_shift_type: "exponential" (else "linear")
  // Not read by the scheduler: the Qwen-Image pipelines' mu (linear_mu) is.
  double base_shift = 0.5, max_shift = 1.15;
  int64_t base_image_seq_len = 256, max_image_seq_len = 4096;
  double shift_terminal = 0;   // 0: none (diffusers' None)
  bool invert_sigmas = false;  // sigmas 1 - sigma, timesteps from them, a final sigma of 1
  SigmaSpacing spacing = SigmaSpacing::kShifted;
  // The karras / exponential / beta range; unset: the shifted sigmas' last and first. Extra
  // config keys diffusers reads there (hasattr(self.config, "sigma_min")), nowhere else.
  std::optional<double> sigma_min, sigma_max;
};

// FLUX.1-dev's scheduler config, which the FLUX.2 pipelines load (spec §1.2): the default when
// a model has no pipeline folder's scheduler config.
FlowMatchConfig flux2_scheduler_config();

// np.linspace(1.0, 1/n, n): the FLUX.2 pipelines' default sigmas (float64).
std::vector<double> linspace_sigmas(int steps);

// FLUX.2's compute_empirical_mu(image_seq_len, num_steps): the shift from the target token
// count (reference tokens are not counted) and the step count.
double empirical_mu(int64_t image_seq_len, int steps);

// Qwen-Image's calculate_shift: mu linear in the target token count between
// (base_image_seq_len, base_shift) and (max_image_seq_len, max_shift), not clamped (an Error
// when the two lengths are equal: diffusers divides by zero).
double linear_mu(int64_t image_seq_len, const FlowMatchConfig& cfg);

// The released Qwen-Image / Qwen-Image-2.1 scheduler config (spec qwen-image.md §3.3): the
// default when a model has no pipeline folder's scheduler config.
FlowMatchConfig qwen_image_scheduler_config();

struct Schedule {
  std::vector<float> sigmas;     // steps + 1 values, the last 0 (1 with invert_sigmas)
  std::vector<float> timesteps;  // steps values: sigma * num_train_timesteps
};

// diffusers' set_timesteps(sigmas=..., mu=...), bit for bit in its float types: the sigmas cast
// to float32; shifted (exponential or linear with mu under dynamic shifting, else by `shift`);
// stretched to shift_terminal; respaced (karras, exponential, beta: in float64, then float32);
// timesteps sigma * num_train_timesteps; inverted with invert_sigmas; the final sigma appended.
// An Error for what diffusers would turn into NaN, inf or a Python exception (no mu under
// dynamic shifting, shift_terminal with a last shifted sigma of 1, a log of a sigma <= 0).
Schedule set_timesteps(const FlowMatchConfig& cfg, const std::vector<double>& sigmas,
                       std::optional<double> mu);

// scipy.stats.beta.ppf(p, a, b): the inverse of the regularized incomplete beta function, to
// double precision (what _convert_to_beta needs before its float32 cast).
double beta_ppf(double p, double a, double b);

// The timestep the pipeline passes the model: t cast to the latent dtype, divided by 1000 in
// that dtype (bf16 latents round twice, spec §5.7).
float model_timestep(float t, bool bf16_latents);

// One Euler step in place: x += (sigma_next - sigma) * v, as diffusers computes it: in f32
// (product then sum, no fused multiply-add), or for bf16 latents
// x = bf16(x + bf16(bf16(dt) * bf16(v))) (spec §5.8).
void euler_step(float* x, const float* v, int64_t n, float sigma, float sigma_next,
                bool bf16_latents);

}  // namespace flowkv::sched
