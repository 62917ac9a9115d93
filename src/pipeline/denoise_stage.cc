#include "pipeline/denoise_stage.h"

#include <algorithm>
#include <cstdio>

#include "pipeline/request_store.h"

namespace flowkv::pipeline {

DenoiseStage::DenoiseStage(Stage& stage, const GenerateControl& control, std::string what,
                           bool cached, std::string suffix)
    : stage_(stage),
      control_(control),
      what_(std::move(what)),
      suffix_(std::move(suffix)),
      cached_(cached),
      t_(std::chrono::steady_clock::now()) {}

void DenoiseStage::step(int step, int steps) {
  const auto now = std::chrono::steady_clock::now();
  const double seconds = std::chrono::duration<double>(now - t_).count();
  t_ = now;
  char secs[32];
  std::snprintf(secs, sizeof secs, "%.2f s", seconds);
  const std::string cache = what_.empty() ? ""
                            : !cached_    ? ", " + what_ + " computed"
                            : from_store_ ? ", " + what_ + " from the reference store"
                            : step == 1   ? ", " + what_ + " computed, K/V stored"
                                          : ", " + what_ + " from the KV cache";
  stage_.advance(step, "step " + std::to_string(step) + "/" + std::to_string(steps) + " " + secs +
                           cache + suffix_);
  last_ = {.step = step,
           .steps = steps,
           .seconds = seconds,
           .conditioning_cached = cached_ && (from_store_ || step > 1),
           .from_store = cached_ && from_store_};
  if (control_.on_step) control_.on_step(last_);
}

void DenoiseStage::attach(DenoiseOptions& o, std::function<Image(const Tensor& x0)> decode) {
  o.cancelled = control_.cancelled;
  o.on_store_lookup = [this](int64_t hits, int64_t misses) {
    from_store_ = hits > 0 && misses == 0;
  };
  o.on_step = [this](int s, int n) {
    if (previews_.empty() && control_.on_preview) previews_ = preview_steps(control_.previews, n);
    step(s, n);
  };
  if (control_.previews <= 0 || !control_.on_preview) return;
  o.on_estimate = [this, decode = std::move(decode)](int s, int, const Tensor& x0) {
    if (std::find(previews_.begin(), previews_.end(), s) == previews_.end()) return;
    const Image im = decode(x0);
    GenerateResult preview;
    preview.width = im.width, preview.height = im.height, preview.channels = im.channels;
    preview.pixels = im.pixels;
    control_.on_preview(previews_sent_++, last_, preview);
  };
}

}  // namespace flowkv::pipeline
