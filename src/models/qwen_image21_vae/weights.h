// The Qwen-Image-2.1 VAE's one weight-name table: every tensor of diffusers'
// AutoencoderKLQwenImage21 state dict (checkpoint keys, PyTorch shapes), generated from the
// config by the same walk of the architecture the loader uses.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "io/checkpoint.h"
#include "models/qwen_image21_vae/config.h"

namespace flowkv::qwen21_vae {

// Channels per level: encoder [base * 1, base * m0, ..., base * m_{L-1}] (L + 1 entries; down
// block i maps entry i to i + 1) and decoder [dbase * m_{L-1}, dbase * m_{L-1}, ..., dbase * m0]
// (up block i maps entry i to i + 1).
std::vector<int64_t> encoder_dims(const Config& c);
std::vector<int64_t> decoder_dims(const Config& c);

// Every tensor a checkpoint of this config must hold, with its shape. It includes the
// downsample3d / upsample3d time_conv weights, which a single frame never reads (they are
// checked for shape and not loaded).
std::vector<ExpectedTensor> weight_table(const Config& c);

// Problems (missing, wrong shape, unreadable dtype, unexpected) between the files and the table.
std::vector<std::string> check_weights(const std::map<std::string, TensorInfo>& tensors,
                                       const Config& c);

int64_t parameter_count(const Config& c);

}  // namespace flowkv::qwen21_vae
