// A diffusers pipeline folder: model_index.json naming the pipeline class and its components
// (each a subfolder: transformer/, text_encoder/, tokenizer/, vae/, scheduler/, ...).
#pragma once

#include <map>
#include <optional>
#include <string>

#include "io/json.h"

namespace flowkv {

struct PipelineComponent {
  std::string library;     // "diffusers", "transformers"
  std::string class_name;  // "Flux2Transformer2DModel", "Qwen3ForCausalLM", ...
  std::string path;        // its subfolder (may be absent on disk: the loader says so)
};

struct PipelineFolder {
  std::string path;        // the folder holding model_index.json
  std::string class_name;  // "Flux2KleinKVPipeline", ...
  Json index;              // model_index.json as read (pipeline options such as is_distilled)
  std::map<std::string, PipelineComponent> components;  // by name; null entries left out

  // The component of that name; a flowkv::Error naming the folder when it is missing.
  const PipelineComponent& component(const std::string& name) const;
};

// The pipeline folder at `path`, or the one `path` is a component subfolder of (a transformer
// folder inside a pipeline); nullopt when neither holds a model_index.json. A model_index.json
// that is not a pipeline index is a flowkv::Error naming the file and the field.
std::optional<PipelineFolder> find_pipeline_folder(const std::string& path);
// The index of the pipeline folder `dir` from model_index.json's parsed text.
PipelineFolder parse_pipeline_index(const Json& index, const std::string& dir);

}  // namespace flowkv
