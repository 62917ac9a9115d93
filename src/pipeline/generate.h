// The one generate orchestration (design.md, "A pipeline is stages, run by one orchestration"):
// prepare (request checks, images decoded and preprocessed, the layout: no weights) -> prompt
// (one or two CFG branches) -> conditioning images -> denoise -> decode. The stages, the
// reference store's use, component residency, previews, progress, cancellation and the stage
// records are written here once; a family supplies a GenerateSpec: how to plan a request, encode
// a prompt branch, encode an image, draw the noise, denoise and decode.
//
// Layering: pipeline/ knows no family. Families implement GenerateSpec (families/<name>/), the
// public Pipeline (src/api/pipeline_api.cc) asks the registry for the spec of a folder's class.
#pragma once

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "cache/ref_store.h"
#include "flowkv/generate.h"
#include "flowkv/model.h"
#include "flowkv/pipeline.h"
#include "io/image.h"
#include "io/pipeline_folder.h"
#include "pipeline/stages.h"
#include "sched/flow_match.h"

namespace flowkv::pipeline {

// The components an opened pipeline has loaded. Resident: a component is loaded once (under its
// own lock, so two requests never load it twice) and kept until release(). Staged: each
// request's Components loads its own and drops them at the end of each stage.
class ComponentStore {
 public:
  explicit ComponentStore(bool resident) : resident_(resident) {}
  bool resident() const { return resident_; }
  // The component `name`, loaded by `load` when it is not held.
  std::shared_ptr<const void> get(const std::string& name,
                                  const std::function<std::shared_ptr<const void>()>& load);
  // Loads `load` counting it (time and count), without keeping it.
  std::shared_ptr<const void> load_counted(
      const std::function<std::shared_ptr<const void>()>& load);
  void release();
  PipelineStats stats() const;
  void count_request() { ++requests_; }

 private:
  struct Slot {
    std::mutex m;
    std::shared_ptr<const void> value;
  };
  const bool resident_;
  mutable std::mutex m_;
  std::map<std::string, std::unique_ptr<Slot>> slots_;
  std::atomic<int64_t> loads_{0}, requests_{0};
  std::atomic<int64_t> load_micros_{0};
};

// One request's view of the components: typed access, and the staged policy's per-stage
// release.
class Components {
 public:
  explicit Components(ComponentStore& store) : store_(store) {}
  template <class T>
  std::shared_ptr<const T> get(const std::string& name, const std::function<T()>& load) {
    auto make = [&]() -> std::shared_ptr<const void> { return std::make_shared<const T>(load()); };
    if (store_.resident()) return std::static_pointer_cast<const T>(store_.get(name, make));
    auto it = stage_.find(name);
    if (it == stage_.end()) it = stage_.emplace(name, store_.load_counted(make)).first;
    return std::static_pointer_cast<const T>(it->second);
  }
  // The end of a stage: a staged pipeline drops what the stage loaded.
  void end_stage() { stage_.clear(); }

 private:
  ComponentStore& store_;
  std::map<std::string, std::shared_ptr<const void>> stage_;
};

// A request as the family planned it before any weight: checked, images preprocessed, sizes.
struct Plan {
  GenerateRequest request;             // as given (its images moved into `images`)
  std::vector<Image> images;           // the conditioning images as the VAE encodes them
  std::vector<std::string> names;      // what messages call each image
  GenerateLayout layout;               // output size and token counts (admission, predict)
  int64_t grid_w = 0, grid_h = 0;      // the target's latent grid, in tokens
  int steps = 0;                       // resolved: the request's, else the pipeline class's default
  std::vector<double> sigmas;          // a fixed sigma grid (the folder's sample_sigmas), or empty
  bool cfg = false;                    // an unconditional branch runs
  std::shared_ptr<const void> family;  // the family's own per-request data
};

// One prompt branch, tokenized and ready to encode.
struct PromptJob {
  // Adds to a store key what decides the embeddings besides the text encoder's files.
  std::function<void(store::KeyBuilder&)> describe;
  // Loads the text encoder through Components if needed; may say more in `note`.
  std::function<PromptEmbeds(std::string* note)> encode;
  std::string note;  // "12 of 512 tokens", "40 tokens (30 text, 10 slots)"
  bool truncated = false;
};

class GenerateSpec {
 public:
  virtual ~GenerateSpec() = default;

  // --- what the family calls things
  virtual std::string images_stage() const = 0;  // "references", "conditions"
  virtual std::string cached_name() const = 0;   // the exact cache's segments: "prefix"
  virtual std::string kv_name() const = 0;       // their K/V in notes: "prefix K/V"
  virtual PixelFormat pixel_format() const = 0;  // how input images are decoded
  virtual int default_steps() const = 0;         // the pipeline class's __call__ default
  // The pipeline class's __call__ true_cfg_scale (a request's cfg_scale 0 takes it).
  virtual float default_cfg_scale() const { return 1.0f; }

  // --- before any weight: the request checked, its images preprocessed, the layout.
  virtual void plan(Plan& p, std::vector<Image> decoded) const = 0;

  // --- the stages
  // The components' files, for the store's keys (text_encoder: the prompt's).
  virtual std::string text_encoder_path() const = 0;
  virtual std::string vae_path() const = 0;
  virtual PromptJob prompt(Components& c, const Plan& p, const std::string& text) const = 0;
  // A conditioning image's latents [1, C, h, w] (the store keeps them under image_rule()) and
  // their packed tokens.
  virtual std::string image_rule() const = 0;
  virtual Tensor encode_image(Components& c, const Image& image) const = 0;
  virtual ReferenceLatents pack_image(const Tensor& z) const = 0;
  // Checks the encoded conditioning against each other (e.g. prompt slots per latent).
  virtual void check_conditioning(const Plan&, const PromptEmbeds& /*positive*/,
                                  const PromptEmbeds* /*negative*/,
                                  const std::vector<ReferenceLatents>& /*images*/) const {}
  // The request runs its exact conditioning cache (for the step notes).
  virtual bool exact_cache(const Plan& p) const = 0;
  // The packed initial latents, drawn as diffusers draws them (the transformer's compute type).
  virtual Tensor noise(Components& c, const Plan& p) const = 0;
  virtual DenoiseResult denoise(Components& c, const DenoiseInputs& in,
                                const DenoiseOptions& o) const = 0;
  virtual Image decode(Components& c, const Plan& p, const Tensor& latents, bool tiled) const = 0;
  // The decode stage's note after the size ("RGBA").
  virtual std::string decode_note() const { return ""; }
  // The family's fields of the PNG parameters: after "Sampler: ..." (e.g. the CFG scale) and
  // after the model's name (e.g. the image count).
  virtual std::string parameters_after_sampler(const Plan&) const { return ""; }
  virtual std::string parameters_after_model(const Plan&) const = 0;
};

// The folder's scheduler (model_index.json's "scheduler": scheduler/scheduler_config.json, read
// or refused by name); nullopt when the folder names none (the family's default then).
std::optional<sched::FlowMatchConfig> pipeline_scheduler(const PipelineFolder& folder);

// Checks the request's schedule before any weight loads (what the loop would refuse later, e.g.
// a terminal stretch of a one-step schedule): the plan's sigmas (or linspace) under the folder's
// scheduler config, else the family's `fallback`, shifted by `mu` (the family's rule).
void check_schedule(const Plan& p, const std::optional<sched::FlowMatchConfig>& scheduler,
                    const sched::FlowMatchConfig& fallback,
                    const std::function<double(const sched::FlowMatchConfig&)>& mu);

// Decodes the request's images (files, then in-memory ones) and lets the spec plan it.
Plan prepare(const GenerateSpec& spec, const GenerateRequest& request, int default_steps);

GenerateResult run_generate(const GenerateSpec& spec, ComponentStore& components,
                            const std::string& pipeline_path, const std::string& pipeline_class,
                            const Plan& plan, const GenerateProgress& progress,
                            const GenerateControl& control);

std::string size_str(int64_t w, int64_t h);
// ", CFG scale: S" (or "off"), for the parameters text of a family with true CFG.
std::string cfg_parameters(const Plan& p);

}  // namespace flowkv::pipeline
