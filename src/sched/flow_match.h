// The flow-matching Euler scheduler as the FLUX.2 and Qwen-Image pipelines use it (diffusers
// FlowMatchEulerDiscreteScheduler + the pipelines' sigma and mu choices). Pure functions: no
// model, no state. Float types follow diffusers (numpy float32 for the shifted sigmas).
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

namespace flowkv::sched {

struct FlowMatchConfig {
  int64_t num_train_timesteps = 1000;
  double shift = 3.0;
  bool use_dynamic_shifting = true;
  bool exponential_shift = true;  // time_shift_type: "exponential" (else "linear")
  double base_shift = 0.5, max_shift = 1.15;
  int64_t base_image_seq_len = 256, max_image_seq_len = 4096;
  double shift_terminal = 0;  // 0: none
};

// FLUX.1-dev's scheduler config, which the FLUX.2 pipelines load (spec §1.2).
FlowMatchConfig flux2_scheduler_config();

// np.linspace(1.0, 1/n, n): the FLUX.2 pipelines' default sigmas (float64).
std::vector<double> linspace_sigmas(int steps);

// FLUX.2's compute_empirical_mu(image_seq_len, num_steps): the shift from the target token
// count (reference tokens are not counted) and the step count.
double empirical_mu(int64_t image_seq_len, int steps);

// Qwen-Image's calculate_shift: mu linear in the target token count between
// (base_image_seq_len, base_shift) and (max_image_seq_len, max_shift), not clamped.
double linear_mu(int64_t image_seq_len, const FlowMatchConfig& cfg);

// The released Qwen-Image / Qwen-Image-2.1 scheduler config (spec qwen-image.md §3.3).
FlowMatchConfig qwen_image_scheduler_config();

struct Schedule {
  std::vector<float> sigmas;     // steps + 1 values, the last 0
  std::vector<float> timesteps;  // steps values: sigma * num_train_timesteps
};

// set_timesteps(sigmas=..., mu=...): float32 sigmas, shifted (exponential or linear with mu
// under dynamic shifting, else by `shift`), optionally stretched to shift_terminal.
Schedule set_timesteps(const FlowMatchConfig& cfg, const std::vector<double>& sigmas,
                       std::optional<double> mu);

// The timestep the pipeline passes the model: t cast to the latent dtype, divided by 1000 in
// that dtype (bf16 latents round twice, spec §5.7).
float model_timestep(float t, bool bf16_latents);

// One Euler step in place: x += (sigma_next - sigma) * v, as diffusers computes it: in f32
// (product then sum, no fused multiply-add), or for bf16 latents
// x = bf16(x + bf16(bf16(dt) * bf16(v))) (spec §5.8).
void euler_step(float* x, const float* v, int64_t n, float sigma, float sigma_next,
                bool bf16_latents);

}  // namespace flowkv::sched
