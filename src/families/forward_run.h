// What every family's single forward (Flux2Transformer::forward, QwenImage21Transformer::forward
// and FamilyModel::forward go through it) sets up around its model call: the workspace arena (the
// caller's or a fresh one), the NaN/infinity checker when asked, the profile counters and the
// wall time.
#pragma once

#include <chrono>
#include <string>

#include "core/arena.h"
#include "core/exec_context.h"
#include "flowkv/model.h"
#include "flowkv/profile.h"
#include "flowkv/tensor.h"
#include "flowkv/workspace.h"

namespace flowkv::pipeline {
class DenoiseAdapter;
}

namespace flowkv::families {

class ForwardRun {
 public:
  ForwardRun(Workspace* ws, bool check_finite, ForwardProfile* profile)
      : arena_((ws ? *ws : local_).arena()), check_(check_finite), profile_(profile) {}

  // Inputs are checked before the call (named as the caller's fields).
  void input(const std::string& name, const Tensor& t) {
    if (check_ && t.defined()) finite_.record(name, t);
  }
  ExecContext context() {
    return {&arena_, KernelPath::kFast, check_ ? &finite_ : nullptr, profile_ ? &prof_ : nullptr};
  }
  // After the call: checks the output and fills the profile.
  void finish(const Tensor& out) {
    if (check_) finite_.record("output", out);
    if (!profile_) return;
    profile_->seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
    profile_->linear_seconds = prof_.linear.seconds;
    profile_->linear_flops = prof_.linear.flops;
    profile_->attention_seconds = prof_.attention.seconds;
    profile_->attention_flops = prof_.attention.flops;
  }

 private:
  Workspace local_;
  Arena& arena_;
  bool check_;
  ForwardProfile* profile_;
  FiniteChecker finite_;
  Profile prof_;
  std::chrono::steady_clock::time_point t0_ = std::chrono::steady_clock::now();
};

// One forward through a family's denoising adapter (pipeline/denoise.h): the request checked,
// one branch prepared (no exact cache kept), the call at opts.sigma, and the branch's velocity
// [B, N, C] times `sign` (-1 gives NucleusMoE-Image's own prediction back: its adapter hands
// the loop the negated one). Qwen-Image's and NucleusMoE-Image's FamilyModel::forward.
Tensor adapter_forward(pipeline::DenoiseAdapter& a, const DenoiseInputs& in,
                       const ForwardOptions& opts, ForwardProfile* profile, Workspace* ws,
                       float sign = 1.0f);

}  // namespace flowkv::families
