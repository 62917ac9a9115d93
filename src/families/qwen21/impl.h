// The Qwen-Image-2.1 transformer as its family owns it: a loaded qwen::Model21 plus its name,
// and the family's functions that load, build and run one. The public QwenImage21Transformer
// (include/flowkv/qwen_image.h, src/api/) is a thin handle over them; the family's own model
// (Qwen21Model) holds the Impl directly, so dependencies run api -> families, never back up.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "families/family.h"
#include "flowkv/qwen_image.h"
#include "models/qwen_image/model21.h"

namespace flowkv {

struct QwenImage21Transformer::Impl {
  qwen::Model21 model;
  std::string variant;
  bool int8 = false;  // linear layers in 8-bit integer arithmetic
};

}  // namespace flowkv

namespace flowkv::families {

using Qwen21Impl = QwenImage21Transformer::Impl;

// A diffusers transformer folder (QwenImage21Transformer::load).
std::shared_ptr<const Qwen21Impl> load_qwen21(const std::string& path, const std::string& dtype);
// A built-in model with deterministic random weights ("qwen21-tiny", "qwen21-small").
std::shared_ptr<const Qwen21Impl> builtin_qwen21(const std::string& name, uint64_t seed,
                                                 const std::string& dtype);
// "F32", "BF16" or "INT8".
std::string qwen21_compute_dtype(const Qwen21Impl& t);
// One forward from tensors (QwenImage21Transformer::forward): every shape checked here, where
// the tensors enter, with a flowkv::Error naming the field.
Tensor qwen21_forward(const Qwen21Impl& impl, const Qwen21Call& call, ForwardProfile* profile,
                      Workspace* ws);
// A loaded transformer as the public Model holds it (Model's QwenImage21Transformer constructor).
LoadedTransformer qwen21_loaded(std::shared_ptr<const Qwen21Impl> t);

}  // namespace flowkv::families
