// The family registry (design.md, "Families and the request path"). A family is its models
// under src/models/ plus one folder here (src/families/<name>/: its registration and table of
// releases, its denoise adapter, its generate spec): detection from config.json, loader,
// built-in models, its cost-model shape, its token layout and cache rules, the tables step
// caches read, the adapter the one denoising loop (pipeline/denoise.h) drives and the spec the
// one generate orchestration (pipeline/generate.h) runs. Tools, API and pipeline pick a
// family through this registry and never branch on a family's name.
//
// Layering: families/ sits above pipeline/, models/, cache/ and cost/, below api/.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cache/hooks.h"
#include "cost/cost_model.h"
#include "flowkv/generate.h"
#include "flowkv/inspect.h"
#include "flowkv/model.h"
#include "flowkv/pipeline.h"
#include "io/checkpoint.h"
#include "io/json.h"
#include "io/pipeline_folder.h"
#include "sched/flow_match.h"
#include "segments/layout.h"
#include "segments/segment_input.h"

namespace flowkv::pipeline {
class DenoiseAdapter;
class GenerateSpec;
}  // namespace flowkv::pipeline
namespace flowkv::flux2 {
class Model;
struct Config;
}  // namespace flowkv::flux2
namespace flowkv::nucleus {
class Model;
struct Config;
}  // namespace flowkv::nucleus
namespace flowkv::qwen {
class Model21;
class ModelQwenImage;
struct Config21;
struct ConfigQwenImage;
}  // namespace flowkv::qwen

namespace flowkv::families {

// A loaded model of one family, as the frontend sees it.
class FamilyModel {
 public:
  virtual ~FamilyModel() = default;
  virtual std::string variant() const = 0;
  virtual std::string config_json() const = 0;
  virtual std::string compute_dtype() const = 0;
  virtual int64_t in_channels() const = 0;
  virtual int64_t text_channels() const = 0;
  // The block topology step caches see, with the tables they read (TeaCache coefficients,
  // MagCache ratios).
  virtual cache::Topology topology() const = 0;
  // The adapter the denoising loop drives for one request (validated, nothing allocated yet).
  virtual std::unique_ptr<pipeline::DenoiseAdapter> adapter(const DenoiseInputs& in,
                                                            const DenoiseOptions& opts) const = 0;
  virtual Tensor forward(const DenoiseInputs& in, const ForwardOptions& opts,
                         ForwardProfile* profile, Workspace* ws) const = 0;
  virtual DenoiseInputs example_inputs(const ExampleShape& shape) const = 0;
  virtual KVPrediction predict(int64_t text_tokens, const std::vector<int64_t>& image_tokens,
                               int64_t target_tokens, int steps, bool cfg) const = 0;
};

using Tables = std::map<std::string, std::vector<double>>;

struct Family {
  FamilyInfo info;
  // True when this config.json (its _class_name) is one of this family's transformers.
  std::function<bool(const Json& config)> detects;
  // Optional: true when files without a _class_name hold this family's tensors (FLUX.2's BFL
  // single files).
  std::function<bool(const CheckpointScan& scan)> detects_tensors;
  // Every built-in name the loader takes (info.builtins lists those offered; this also
  // accepts unlisted ones, e.g. the forward benchmark's "medium").
  std::function<bool(const std::string& name)> has_builtin;
  std::function<std::shared_ptr<const FamilyModel>(const std::string& path,
                                                   const std::string& dtype)>
      load;
  std::function<std::shared_ptr<const FamilyModel>(const std::string& name, uint64_t seed,
                                                   const std::string& dtype)>
      builtin;
  // Optional: writes a built-in model as a diffusers folder (export-builtin).
  std::function<void(const std::string& name, uint64_t seed, const std::string& dtype,
                     const std::string& dir)>
      write_builtin;
  // Optional: writes a released shape (or built-in) with all-zero weights of `dtype` ("f32" or
  // "bf16") as a diffusers folder of sparse files: real-size memory checks without real weights.
  std::function<void(const std::string& name, const std::string& dtype, const std::string& dir)>
      write_zeros;
  // Optional: a tensor as this family's GGUF files hold it (`flowkv quantize` from a
  // safetensors checkpoint): nullopt keeps it as stored; else the F32 tensor to write, a stack
  // of matrices [..., out, in] quantized row by row (NucleusMoE-Image's experts, stored
  // pre-transposed for x @ W, are written output-major so that rows are whole blocks).
  std::function<std::optional<Tensor>(const std::string& name, const Tensor& stored)> gguf_form;
  // `flowkv inspect` for a checkpoint this family detects: fills family, variant, config and
  // problems of the report (and layout and parameters where the family maps the files).
  std::function<void(const CheckpointScan& scan, InspectReport& report)> inspect;
  // A released shape (by name) or a config.json / checkpoint of this family, without weights.
  std::function<KVPrediction(const PredictRequest& r)> predict_shape;
  // The token layout of a released shape or config, for the cacheability report; nullopt when
  // the rules are not known from the shape alone (a FLUX.2 config: Klein 9B and Klein 9B KV
  // share one architecture).
  std::function<std::optional<TokenLayout>(const std::string& model, int64_t text_tokens,
                                           const std::vector<int64_t>& image_tokens,
                                           int64_t target_tokens)>
      layout;
  // What its models publish for step caches (cache::Topology::tables).
  Tables tables;
  // Optional: whether this family generates with a diffusers pipeline class (model_index.json
  // _class_name), and its spec of the stages from a prompt and pictures to a picture
  // (pipeline/generate.h), made when a Pipeline opens the folder: components resolved and
  // checked to fit together, tokenizer and processor read, no weights loaded.
  std::function<bool(const std::string& pipeline_class)> runs_pipeline;
  std::function<std::shared_ptr<const pipeline::GenerateSpec>(const PipelineFolder& pipeline,
                                                              const PipelineOptions& options)>
      open_pipeline;
};

// Every family, in registration order (families.cc holds the one list).
const std::vector<Family>& registry();
// By short name or alias; throws a flowkv::Error listing the names when there is none.
const Family& by_name(const std::string& name);
// The family whose detects() accepts this config, or nullptr.
const Family* for_config(const Json& config);
// The family of a scanned checkpoint: by its config's _class_name, else (no config, or one
// without _class_name) by its tensors; nullptr when none.
const Family* for_scan(const CheckpointScan& scan);
// The family of a built-in model / released shape / checkpoint path (throws when none).
const Family& resolve(const std::string& model);
// A config.json given as a file, or the one of a checkpoint folder (nullopt: none).
std::optional<Json> config_of(const std::string& path);

// A FLUX.2 transformer's config: its config.json, a GGUF's flowkv metadata, or inferred from
// the tensors of a config-less conversion.
flux2::Config flux2_checkpoint_config(const std::string& path);
// FLUX.2 Klein's whole pipeline (families/flux2/generate.cc).
std::shared_ptr<const pipeline::GenerateSpec> klein_open_pipeline(const PipelineFolder& p,
                                                                  const PipelineOptions& o);
// Qwen-Image-2.1's whole pipeline (families/qwen21/generate.cc), and its pipeline class's
// __call__ default step count (the family's table of releases).
int qwen21_pipeline_default_steps(const std::string& pipeline_class);
std::shared_ptr<const pipeline::GenerateSpec> qwen21_open_pipeline(const PipelineFolder& p,
                                                                   const PipelineOptions& o);
// Qwen-Image's pipelines, text to image and Edit-Plus (families/qwen_image/generate.cc).
std::shared_ptr<const pipeline::GenerateSpec> qwen_image_open_pipeline(const PipelineFolder& p,
                                                                       const PipelineOptions& o);
// A released-shape Qwen-Image pipeline of zero weights (text to image, or Edit-Plus with its
// processor): the transformer, Qwen2.5-VL-7B with its vision tower, the released VAE, scheduler;
// tokenizer/ is left for the user's Qwen2.5 tokenizer files.
void qwen_image_write_zero_pipeline(const qwen::ConfigQwenImage& transformer, bool edit,
                                    DType dtype, const std::string& dir);
// A released-shape Qwen-Image-2.1 pipeline of zero weights: the transformer, Qwen3-VL-8B, the
// released VAE, the processor's preprocessor_config.json (copy a tokenizer.json in), scheduler.
void qwen21_write_zero_pipeline(const qwen::Config21& transformer, DType dtype,
                                const std::string& dir);
// Qwen3-VL-8B of zero weights (the text encoder of Qwen-Image-2.1 and NucleusMoE-Image) and
// its processor's preprocessor_config.json (copy a tokenizer.json in).
void write_zero_qwen3_vl_8b(const std::string& text_encoder_dir, const std::string& processor_dir,
                            DType dtype);

// NucleusMoE-Image's pipeline (families/nucleus/generate.cc), its pipeline class's __call__
// default step count, and a released-shape pipeline of zero weights: the transformer,
// Qwen3-VL-8B, the Qwen-Image VAE, the processor's configs (copy a tokenizer.json in), scheduler.
std::shared_ptr<const pipeline::GenerateSpec> nucleus_open_pipeline(const PipelineFolder& p,
                                                                    const PipelineOptions& o);
int nucleus_pipeline_default_steps(const std::string& pipeline_class);
void nucleus_write_zero_pipeline(const nucleus::Config& transformer, DType dtype,
                                 const std::string& dir);

// Each family's registration (one file per family).
Family flux2_family();
Family qwen_image_family();
Family qwen21_family();
Family nucleus_family();

// A model's block topology with the tables its family publishes: what step caches are made
// against (the families' models and their denoising adapters).
cache::Topology flux2_topology(const flux2::Model& m);
cache::Topology qwen21_topology(const qwen::Model21& m);
cache::Topology qwen_image_topology(const qwen::ModelQwenImage& m);
cache::Topology nucleus_topology(const nucleus::Model& m);

// FLUX.1's step-cache tables, published by the families that have none fitted yet (with
// MeanCache's reference schedules, searched on other models, which a user names).
Tables flux1_tables();

// Deterministic uniform [-1, 1) values of `shape` from `seed` (example inputs).
Tensor example_tensor(Shape shape, uint64_t seed);
// The example request's noise, target grid and conditioning latents (`channels` each).
void example_latents(DenoiseInputs& in, const ExampleShape& s, int64_t channels);
// A request's noise [B, height*width, channels] and conditioning latents [B, h*w, channels]
// checked (an Error naming the tensor, `images` naming the conditioning); their grids, in order.
std::vector<ImageGrid> check_latents(const DenoiseInputs& in, int64_t channels,
                                     const std::string& images);
// The FlowMatchEulerDiscreteScheduler config the Qwen-Image pipelines are released with
// (scheduler/scheduler_config.json of the zero-weight exports).
Json qwen_scheduler_json();

// A prediction from a token layout and its cache plan, through the one cost model.
KVPrediction prediction(const std::string& model, const cost::ModelShape& shape,
                        const TokenLayout& layout, const CachePlan& plan, int steps, bool cfg);

// [text, ref 1 .. ref k, target] with the references appended to the image stream: every
// segment reads every segment and follows the current step (FLUX.2 Klein 4B / 9B and dev,
// Qwen-Image), so only constant inputs hold and nothing is cacheable exactly.
TokenLayout joint_layout(int64_t text_tokens, const std::vector<int64_t>& image_tokens,
                         int64_t target_tokens);

}  // namespace flowkv::families

// What the public Model holds: its family and the loaded model.
namespace flowkv {
struct Model::Impl {
  const families::Family* family = nullptr;
  std::shared_ptr<const families::FamilyModel> model;
  // What the reference store's keys start with: the weights and their revision, the compute
  // type (pipeline/identity.h). Empty for a model built in memory: it uses no store.
  std::string identity;
};
}  // namespace flowkv

namespace flowkv::families {

// A loaded transformer as the pipeline's denoise stage holds it: its family, the model, and
// the identity the reference store's keys start with.
using LoadedTransformer = Model::Impl;

// A checkpoint of any family (Model::load), and a FLUX.2 one under the reference rule its
// pipeline class names (Klein KV's rules, else references joined to the target's stream).
LoadedTransformer load_transformer(const std::string& path, const std::string& dtype);
LoadedTransformer load_flux2_transformer(const std::string& path, const std::string& dtype,
                                         bool klein_kv_rules);

// The one denoising loop over a loaded transformer (denoise() and the generate specs): steps
// resolved from the sigmas or the family's default, the scheduler config when the pipeline
// folder has one (else the family's).
DenoiseResult run_family_denoise(const LoadedTransformer& t, const DenoiseInputs& in,
                                 const DenoiseOptions& opts,
                                 const std::optional<sched::FlowMatchConfig>& scheduler,
                                 Workspace* ws = nullptr);
DenoiseOptions resolve_steps(const LoadedTransformer& t, DenoiseOptions o);
// The initial latents [1, channels, h, w] as the pipelines draw them: randn from
// torch.Generator("cpu").manual_seed(seed) in the transformer's compute type (bf16 for a bf16
// model), widened to f32.
Tensor torch_noise(const LoadedTransformer& t, uint64_t seed, int64_t channels, int64_t h,
                   int64_t w);

}  // namespace flowkv::families
