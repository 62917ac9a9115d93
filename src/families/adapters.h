// The denoising adapters of the families (pipeline/denoise.h): what one request of a family
// looks like to the one loop. Each checks the request's inputs, plans its segments and cache,
// and runs one forward per branch.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "flowkv/model.h"
#include "pipeline/denoise.h"

namespace flowkv::flux2 {
class Model;
}
namespace flowkv::nucleus {
class Model;
}
namespace flowkv::qwen {
class Model21;
class ModelQwenImage;
}  // namespace flowkv::qwen

namespace flowkv::families {

// How a FLUX.2 checkpoint was trained to read its references: Klein 9B KV's rules (references
// attend to references only, modulated from t = 0: cacheable), or appended to the image stream
// (Klein 4B / 9B and dev, diffusers Flux2KleinPipeline: every token reads every token at the
// step's time; nothing is cacheable exactly).
enum class Flux2References { kKleinKV, kJoint };

// The reference rule and the __call__ default step count of a FLUX.2 pipeline class, from the
// family's table of releases (families/flux2/family.cc); an unknown class is an Error naming
// `where`.
Flux2References flux2_pipeline_rule(const std::string& pipeline_class, const std::string& where);
int flux2_pipeline_default_steps(const std::string& pipeline_class);

// A prompt as the Qwen-Image and NucleusMoE-Image adapters take it: rows [B, L, width] and the
// validity of each row ([B, L] bytes; empty when every row is valid: the pipelines pass no mask
// then). Shapes checked against the batch and the text width, with an Error naming the problem.
struct PromptRows {
  const float* text = nullptr;
  int64_t len = 0;
  std::vector<uint8_t> valid;
};
PromptRows prompt_rows(const PromptEmbeds& p, int64_t batch, int64_t width);

// Prompts stacked along the batch for one forward (CFG's branches batched): their rows, and
// their validity when any has a mask (rows of a prompt without one are valid). The prompts
// must have one length.
struct StackedPrompts {
  std::vector<float> text;
  std::vector<uint8_t> valid;  // empty: every row valid
};
StackedPrompts stack_prompts(const std::vector<const PromptRows*>& prompts, int64_t batch,
                             int64_t width);

// A true-CFG request's branches: one forward of [positive, negative] stacked along the batch
// when `batched`, else the positive branch and, under CFG, the negative one.
// fill(branch, {prompts...}) builds a branch. Returns the branch count.
template <class Branch, class Prompt, class Fill>
int plan_cfg_branches(std::vector<Branch>& branches, bool batched, bool cfg, const Prompt* positive,
                      const Prompt* negative, Fill fill) {
  branches.resize(1);
  if (batched) {
    fill(branches[0], {positive, negative});
  } else {
    fill(branches[0], {positive});
    if (cfg) {
      branches.emplace_back();
      fill(branches[1], {negative});
    }
  }
  return static_cast<int>(branches.size());
}

// The payload of the branches' exact memories (those that have one).
template <class Branch>
int64_t memories_bytes(const std::vector<Branch>& branches) {
  int64_t n = 0;
  for (const Branch& b : branches) n += b.memory ? b.memory->bytes() : 0;
  return n;
}

std::unique_ptr<pipeline::DenoiseAdapter> flux2_adapter(
    const flux2::Model& m, const DenoiseInputs& in, const DenoiseOptions& opts,
    Flux2References refs = Flux2References::kKleinKV);
std::unique_ptr<pipeline::DenoiseAdapter> qwen_image_adapter(const qwen::ModelQwenImage& m,
                                                             const DenoiseInputs& in,
                                                             const DenoiseOptions& opts);
std::unique_ptr<pipeline::DenoiseAdapter> nucleus_adapter(const nucleus::Model& m,
                                                          const DenoiseInputs& in,
                                                          const DenoiseOptions& opts);
std::unique_ptr<pipeline::DenoiseAdapter> qwen21_adapter(const qwen::Model21& m,
                                                         const DenoiseInputs& in,
                                                         const DenoiseOptions& opts);

}  // namespace flowkv::families
