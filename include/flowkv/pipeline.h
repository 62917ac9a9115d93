// A diffusers pipeline folder opened once and run for many requests: the family and its
// components are resolved and checked when it opens; the tokenizer, processor and (by the memory
// policy) the text encoder, VAE and transformer stay loaded between requests. Every family runs
// through the same stages (prompt, conditioning images, denoise, decode).
//
//   flowkv::Pipeline p = flowkv::Pipeline::open(dir, {.memory = flowkv::MemoryPolicy::kResident});
//   flowkv::GenerateRequest r{.prompt = "a red fox"};
//   flowkv::GenerateResult out = p.generate(r);
//
// Thread safety: generate, prepare and layout may be called from several threads at once on one
// Pipeline. The calls share the weights (loaded once, under a lock, the first time a stage needs
// them) and nothing else: every request keeps its own latents, caches, RNG and records.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "flowkv/generate.h"
#include "flowkv/model.h"

namespace flowkv {

enum class MemoryPolicy {
  kResident,  // components stay loaded after first use: the server's default
  kStaged,    // each stage loads its component and releases it (peak: the largest stage)
  kAuto,      // resident when the components' weights fit the memory budget, else staged
};
// "resident", "staged" or "auto"; anything else is a flowkv::Error naming the choices.
MemoryPolicy parse_memory_policy(const std::string& name);
const char* memory_policy_name(MemoryPolicy policy);

struct PipelineOptions {
  MemoryPolicy memory = MemoryPolicy::kAuto;
  // kAuto's budget for the components' weights as stored; -1: 3/4 of the machine's memory.
  int64_t memory_budget_bytes = -1;
  // The transformer's compute type ("auto", "f32", "bf16", "int8"): fixed for the opened
  // pipeline; a request may repeat it or leave GenerateRequest::dtype at "auto".
  std::string dtype = "auto";
  // Components given in place of the folder's: a transformer file or folder (a GGUF file
  // `flowkv quantize` wrote, a safetensors file, a diffusers folder), a text encoder likewise
  // (stable-diffusion.cpp's --diffusion-model / --llm). Empty: the folder's.
  std::string transformer;
  std::string text_encoder;
};

// What the pipeline holds and has done, for a server's /metrics and a caller's checks.
struct PipelineStats {
  int64_t component_loads = 0;  // components loaded since open (resident: at most one each)
  double load_seconds = 0;      // time spent loading them
  int64_t requests = 0;         // generate calls that finished (with a picture)
  int64_t resident_components = 0;
};

// A request checked and its images decoded and preprocessed, with no weight read: admission
// reads its layout, a worker generates it. Cheap to copy (the images are shared).
class PreparedRequest {
 public:
  const GenerateRequest& request() const;
  const GenerateLayout& layout() const;
  // The same request with another seed (a server's n pictures), the images shared.
  PreparedRequest with_seed(uint64_t seed) const;

  struct Impl;
  explicit PreparedRequest(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  const Impl& impl() const { return *impl_; }

 private:
  std::shared_ptr<const Impl> impl_;
};

class Pipeline {
 public:
  // Reads model_index.json, resolves the family that runs its class and every component
  // (configs, tokenizer, processor, scheduler) and checks that they fit together; loads no
  // weights. Throws a flowkv::Error naming the file or field.
  static Pipeline open(const std::string& dir, const PipelineOptions& options = {});

  // Request checks that need no weights (steps, sizes, counts, images decoded and resized,
  // prompt length), then the token layout. Throws a flowkv::Error before any weight loads.
  PreparedRequest prepare(const GenerateRequest& request) const;
  GenerateLayout layout(const GenerateRequest& request) const { return prepare(request).layout(); }

  GenerateResult generate(const PreparedRequest& request, const GenerateProgress& progress = {},
                          const GenerateControl& control = {}) const;
  GenerateResult generate(const GenerateRequest& request, const GenerateProgress& progress = {},
                          const GenerateControl& control = {}) const {
    return generate(prepare(request), progress, control);
  }

  const std::string& path() const;            // the folder holding model_index.json
  const std::string& pipeline_class() const;  // model_index.json's _class_name
  const FamilyInfo& family() const;
  MemoryPolicy memory() const;  // the policy in force (kAuto resolved)
  int default_steps() const;    // the pipeline class's __call__ default
  PipelineStats stats() const;
  // Releases every resident component (the next request loads again).
  void release() const;

  struct Impl;
  explicit Pipeline(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}

 private:
  std::shared_ptr<Impl> impl_;
};

}  // namespace flowkv
