// The QwenImage21Pipeline denoising loop (diffusers pipeline_qwenimage21.py) from given prompt
// embeddings, condition latents and noise: the first step prefills the prefix (text and
// condition images) and stores its K/V, later steps run only the target; one cache per CFG
// branch. Both branches run as one batched forward when their token layouts match.
#pragma once

#include <functional>
#include <vector>

#include "core/exec_context.h"
#include "flowkv/step_cache.h"
#include "models/qwen_image/model21.h"
#include "sched/flow_match.h"

namespace flowkv::pipeline {

struct Qwen21Prompt {
  const float* text = nullptr;  // [B, L, context_in_dim]
  int64_t len = 0;
  const uint8_t* slots = nullptr;  // [L]: condition-image slots
  const uint8_t* valid = nullptr;  // [B, L] or nullptr (all valid)
};

struct Qwen21Request {
  int64_t batch = 1;
  Qwen21Prompt prompt;
  Qwen21Prompt negative;        // text == nullptr: no classifier-free guidance
  float cfg_scale = 1.0f;       // true CFG when > 1 and a negative prompt is given
  const float* cond = nullptr;  // [B, sum h*w, in_channels]
  std::vector<qwen::Grid> cond_grids;
  const float* noise = nullptr;  // [B, T, in_channels]
  qwen::Grid target;
  int steps = 40;
  bool use_cache = true;
  bool batch_cfg = true;       // one forward for both branches when their layouts match
  std::vector<double> sigmas;  // a fixed grid (sample_sigmas); sets the step count
  sched::FlowMatchConfig scheduler = sched::qwen_image_scheduler_config();
  int64_t kv_budget_bytes = -1;
  // Approximate step caches, "name[:k=v,...]" each (fresh state for this request). They see the
  // target; the prefix always runs or comes from its exact cache. With any policy the two CFG
  // branches run as separate calls, each with its own policy state.
  std::vector<std::string> step_caches;
  std::function<void(int step, int steps)> on_step;
  std::function<void(int step, const float* cond_v, const float* uncond_v, const float* v,
                     const float* latents)>
      observe;
};

struct Qwen21Result {
  std::vector<float> latents;  // [B, T, in_channels]
  sched::Schedule schedule;
  double mu = 0;
  std::vector<double> step_seconds;
  double transformer_seconds = 0;
  double loop_seconds = 0;
  int64_t kv_bytes = 0;
  bool cfg = false;
  bool batched_cfg = false;
  std::vector<StepCacheStats> step_caches;
};

int64_t planned_kv_bytes(const qwen::Model21& m, const Qwen21Request& r);
Qwen21Result run_qwen21(const ExecContext& ctx, const qwen::Model21& m, const Qwen21Request& r);

}  // namespace flowkv::pipeline
