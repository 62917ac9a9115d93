// What a generate's denoise stage tells its caller, the same for every family: each step's note
// in the stage's progress ("step 2/4 0.41 s, references from the KV cache"), a StepEvent, the
// previews of the x0 estimate at the steps the request asked for, and cancellation.
#pragma once

#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "flowkv/generate.h"
#include "flowkv/model.h"
#include "io/image.h"
#include "pipeline/stages.h"

namespace flowkv::pipeline {

class DenoiseStage {
 public:
  // `what`: the cached conditioning's name ("references", "prefix"); `cached`: the request
  // runs its exact cache; `suffix` ends every step's note (" (2 branches)").
  DenoiseStage(Stage& stage, const GenerateControl& control, std::string what, bool cached,
               std::string suffix = "");
  // Sets o's on_step, on_store_lookup, on_estimate and cancelled. `decode` turns an x0
  // estimate into a picture (called only at preview steps).
  void attach(DenoiseOptions& o, std::function<Image(const Tensor& x0)> decode);

 private:
  void step(int step, int steps);

  Stage& stage_;
  const GenerateControl& control_;
  std::string what_, suffix_;
  bool cached_;
  bool from_store_ = false;
  std::vector<int> previews_;
  int previews_sent_ = 0;
  StepEvent last_;
  std::chrono::steady_clock::time_point t_;
};

}  // namespace flowkv::pipeline
