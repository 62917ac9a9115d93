// The FLUX.2 transformer as its family owns it: a loaded flux2::Model plus its name, and the
// family's functions that load, build, write and run one. The public Flux2Transformer
// (include/flowkv/flux2.h, src/api/) is a thin handle over them; the family's own model
// (Flux2Model) holds the Impl directly, so dependencies run api -> families, never back up.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "families/adapters.h"
#include "families/family.h"
#include "flowkv/flux2.h"
#include "models/flux2/model.h"

namespace flowkv {

struct Flux2Transformer::Impl {
  flux2::Model model;
  std::string variant;
  bool int8 = false;  // linear layers in 8-bit integer arithmetic
};

// Parses "auto" / "f32" / "bf16" / "int8".
flux2::LoadOptions parse_dtype_option(const std::string& dtype);

}  // namespace flowkv

namespace flowkv::families {

using Flux2Impl = Flux2Transformer::Impl;

// A checkpoint (Flux2Transformer::load: diffusers folder, pipeline folder, BFL single file).
std::shared_ptr<const Flux2Impl> load_flux2(const std::string& path, const std::string& dtype);
// A built-in model with deterministic random weights; an unknown name is an Error listing them.
std::shared_ptr<const Flux2Impl> builtin_flux2(const std::string& name, uint64_t seed,
                                               const std::string& dtype);
// A built-in model written as a diffusers folder (config.json + safetensors).
void write_flux2_builtin(const std::string& name, uint64_t seed, const std::string& dtype,
                         const std::string& dir);
// "F32", "BF16" or "INT8".
std::string flux2_compute_dtype(const Flux2Impl& t);
// One forward from tensors (Flux2Transformer::forward): every shape checked here, where the
// tensors enter, with a flowkv::Error naming the field.
Tensor flux2_forward(const Flux2Impl& impl, const Flux2Call& call, ForwardProfile* profile,
                     Workspace* ws);
// A loaded transformer as the public Model holds it (Model's Flux2Transformer constructor).
LoadedTransformer flux2_loaded(std::shared_ptr<const Flux2Impl> t,
                               Flux2References refs = Flux2References::kKleinKV);

}  // namespace flowkv::families
