// Built-in Qwen-Image-2.1-shaped models with deterministic random weights.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "flowkv/tensor.h"
#include "models/qwen_image/config.h"

namespace flowkv::qwen {

// "qwen21-tiny" (tests) and "qwen21-small" (the benchmark: width 384 = 3 heads x 128, 8 layers,
// SwiGLU ratio 3, axes (16, 56, 56) as released, 64 latent channels).
bool builtin_config21(const std::string& name, Config21* out);
std::vector<std::string> builtin_names21();
std::map<std::string, Tensor> random_weights21(const Config21& c, uint64_t seed, DType dtype);

// "qwen-image-tiny" (the family tests: 2 dual-stream blocks x 64, 2x2-packed 16 channels).
bool builtin_config_qwen_image(const std::string& name, ConfigQwenImage* out);
std::vector<std::string> builtin_names_qwen_image();
std::map<std::string, Tensor> random_weights_qwen_image(const ConfigQwenImage& c, uint64_t seed,
                                                        DType dtype);

}  // namespace flowkv::qwen
