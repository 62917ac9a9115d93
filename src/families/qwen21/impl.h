// The public QwenImage21Transformer's implementation: a loaded qwen::Model21 plus its name (below
// the API: the family wraps the handle, the API defines it).
#pragma once

#include <string>

#include "flowkv/qwen_image.h"
#include "models/qwen_image/model21.h"

namespace flowkv {

struct QwenImage21Transformer::Impl {
  qwen::Model21 model;
  std::string variant;
  bool int8 = false;  // linear layers in 8-bit integer arithmetic
};

}  // namespace flowkv
