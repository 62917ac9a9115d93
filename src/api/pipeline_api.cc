// The public Pipeline: a pipeline folder opened once (family, components, spec), its
// components held by the memory policy, every request through the one orchestration
// (pipeline/generate.h).
#include "flowkv/pipeline.h"

#include <filesystem>
#include <system_error>

#include "core/memory.h"
#include "families/family.h"
#include "flowkv/error.h"
#include "io/checkpoint.h"
#include "io/mapped_file.h"
#include "io/pipeline_folder.h"
#include "pipeline/generate.h"

namespace flowkv {

MemoryPolicy parse_memory_policy(const std::string& name) {
  if (name == "resident") return MemoryPolicy::kResident;
  if (name == "staged") return MemoryPolicy::kStaged;
  if (name == "auto") return MemoryPolicy::kAuto;
  fail("memory policy '", name, "': resident, staged or auto");
}

const char* memory_policy_name(MemoryPolicy policy) {
  switch (policy) {
    case MemoryPolicy::kResident:
      return "resident";
    case MemoryPolicy::kStaged:
      return "staged";
    case MemoryPolicy::kAuto:
      break;
  }
  return "auto";
}

struct PreparedRequest::Impl {
  pipeline::Plan plan;
};

const GenerateRequest& PreparedRequest::request() const {
  return impl_->plan.request;
}
const GenerateLayout& PreparedRequest::layout() const {
  return impl_->plan.layout;
}
PreparedRequest PreparedRequest::with_seed(uint64_t seed) const {
  auto impl = std::make_shared<Impl>(*impl_);
  impl->plan.request.seed = seed;
  return PreparedRequest(std::move(impl));
}

struct Pipeline::Impl {
  PipelineFolder folder;
  const families::Family* family = nullptr;
  PipelineOptions options;
  MemoryPolicy memory = MemoryPolicy::kStaged;
  std::shared_ptr<const pipeline::GenerateSpec> spec;
  std::unique_ptr<pipeline::ComponentStore> components;
};

namespace {

// The pipeline folder and the family that generates with its class.
std::pair<PipelineFolder, const families::Family*> pipeline_family(const std::string& dir) {
  std::optional<PipelineFolder> p = find_pipeline_folder(dir);
  FLOWKV_CHECK(p, dir,
               ": not a diffusers pipeline folder (no model_index.json); generate needs the whole "
               "pipeline: the transformer, text encoder, tokenizer or processor, and VAE");
  std::string known;
  for (const families::Family& f : families::registry()) {
    if (!f.open_pipeline) continue;
    if (f.runs_pipeline(p->class_name)) return {std::move(*p), &f};
    known += (known.empty() ? "" : ", ") + f.info.title;
  }
  fail(p->path, "/model_index.json: flowkv does not generate with a ", p->class_name,
       " pipeline; it generates with ", known);
}

// The bytes of the components' weight files as stored (what resident components hold).
int64_t component_bytes(const PipelineFolder& p) {
  namespace fs = std::filesystem;
  int64_t total = 0;
  for (const auto& [name, c] : p.components) {
    std::error_code ec;
    if (!fs::is_directory(c.path, ec)) continue;
    for (fs::recursive_directory_iterator it(c.path, ec), end; !ec && it != end; it.increment(ec)) {
      const std::string ext = it->path().extension().string();
      if (ext != ".safetensors" && ext != ".gguf" && ext != ".bin") continue;
      std::error_code sec;
      const auto size = it->file_size(sec);
      if (!sec) total += static_cast<int64_t>(size);
    }
  }
  return total;
}

}  // namespace

Pipeline Pipeline::open(const std::string& dir, const PipelineOptions& options) {
  auto [folder, family] = pipeline_family(dir);
  FLOWKV_CHECK(options.dtype == "auto" || options.dtype == "f32" || options.dtype == "bf16" ||
                   options.dtype == "int8",
               "dtype '", options.dtype, "': auto, f32, bf16 or int8");
  // Components given in place of the folder's: the spec reads them where the folder's were.
  const std::pair<const char*, std::string> overrides[] = {{"transformer", options.transformer},
                                                           {"text_encoder", options.text_encoder}};
  for (const auto& [name, path] : overrides) {
    if (path.empty()) continue;
    FLOWKV_CHECK(path_exists(path), path, ": no such file or folder (given as the ", name, ")");
    folder.components[name].path = path;
  }
  auto impl = std::make_shared<Impl>();
  impl->folder = std::move(folder);
  impl->family = family;
  impl->options = options;
  impl->spec = family->open_pipeline(impl->folder, options);
  impl->memory = options.memory;
  if (impl->memory == MemoryPolicy::kAuto) {
    const int64_t budget = options.memory_budget_bytes >= 0 ? options.memory_budget_bytes
                                                            : available_memory_bytes() / 4 * 3;
    impl->memory =
        component_bytes(impl->folder) <= budget ? MemoryPolicy::kResident : MemoryPolicy::kStaged;
  }
  impl->components =
      std::make_unique<pipeline::ComponentStore>(impl->memory == MemoryPolicy::kResident);
  return Pipeline(std::move(impl));
}

PreparedRequest Pipeline::prepare(const GenerateRequest& request) const {
  FLOWKV_CHECK(request.dtype == "auto" || request.dtype == impl_->options.dtype, "dtype '",
               request.dtype, "': the pipeline was opened to compute in '", impl_->options.dtype,
               "'; open it with that dtype");
  auto impl = std::make_shared<PreparedRequest::Impl>();
  impl->plan = pipeline::prepare(*impl_->spec, request, impl_->spec->default_steps());
  return PreparedRequest(std::move(impl));
}

GenerateResult Pipeline::generate(const PreparedRequest& request, const GenerateProgress& progress,
                                  const GenerateControl& control) const {
  return pipeline::run_generate(*impl_->spec, *impl_->components, impl_->folder.path,
                                impl_->folder.class_name, request.impl().plan, progress, control);
}

const std::string& Pipeline::path() const {
  return impl_->folder.path;
}
const std::string& Pipeline::pipeline_class() const {
  return impl_->folder.class_name;
}
const FamilyInfo& Pipeline::family() const {
  return impl_->family->info;
}
MemoryPolicy Pipeline::memory() const {
  return impl_->memory;
}
int Pipeline::default_steps() const {
  return impl_->spec->default_steps();
}
PipelineStats Pipeline::stats() const {
  return impl_->components->stats();
}
void Pipeline::release() const {
  impl_->components->release();
}

}  // namespace flowkv
