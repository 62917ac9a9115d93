#include "pipeline/stages.h"

#include "core/memory.h"

namespace flowkv::pipeline {

void StageRunner::begin(const std::string& name, int64_t units) {
  if (control_.cancelled && control_.cancelled()) throw Cancelled("cancelled before " + name);
  reset_peak_rss();  // the stage's own peak (where the kernel allows; else the process's)
  current_ = {.name = name};
  start_ = std::chrono::steady_clock::now();
  if (progress_.begin) progress_.begin(name, units);
}

void StageRunner::end(const Stage& stage) {
  current_.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  current_.peak_rss_bytes = peak_rss_bytes();
  current_.detail = stage.detail;
  reports_.push_back(current_);
  if (progress_.end) progress_.end(current_);
}

}  // namespace flowkv::pipeline
