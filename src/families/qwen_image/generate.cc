// Qwen-Image's pipelines (the prompt encoder and the VAE land next).
#include "families/family.h"
#include "flowkv/error.h"

namespace flowkv::families {

std::shared_ptr<const pipeline::GenerateSpec> qwen_image_open_pipeline(const PipelineFolder& p,
                                                                       const PipelineOptions&) {
  fail(p.path, ": Qwen-Image pipelines are not wired yet");
}

}  // namespace flowkv::families
