// A request's stages (prompt, references, denoise, decode) as generate() runs them: each timed,
// with the process's peak resident memory while it ran, and progress reported to the caller.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "flowkv/generate.h"

namespace flowkv::pipeline {

// One running stage: progress within it, and the line its report carries.
class Stage {
 public:
  Stage(const GenerateProgress& progress, int64_t units) : progress_(progress), units_(units) {}
  void advance(int64_t done, const std::string& note) const {
    if (progress_.advance) progress_.advance(done, units_, note);
  }
  std::string detail;

 private:
  const GenerateProgress& progress_;
  int64_t units_;
};

class StageRunner {
 public:
  StageRunner(const GenerateProgress& progress, const GenerateControl& control,
              std::vector<StageReport>& reports)
      : progress_(progress), control_(control), reports_(reports) {}

  // Runs fn(Stage&) as the stage `name` of `units` units; its report is appended (also when
  // fn throws: the error then passes on, the report says how far it got).
  template <class Fn>
  auto run(const std::string& name, int64_t units, Fn&& fn)
      -> decltype(fn(std::declval<Stage&>())) {
    begin(name, units);
    Stage stage(progress_, units);
    struct End {
      StageRunner* r;
      Stage* s;
      ~End() { r->end(*s); }
    } end_guard{this, &stage};
    return fn(stage);
  }

 private:
  void begin(const std::string& name, int64_t units);
  void end(const Stage& stage);

  const GenerateProgress& progress_;
  const GenerateControl& control_;
  std::vector<StageReport>& reports_;
  StageReport current_;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace flowkv::pipeline
