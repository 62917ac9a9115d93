// The Qwen-Image VAE's one weight-name table: every tensor of diffusers'
// AutoencoderKLQwenImage state dict (checkpoint keys, PyTorch shapes), generated from the
// config by the same walk of the architecture the loader uses.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "io/checkpoint.h"
#include "models/qwen_image_vae/config.h"

namespace flowkv::qwen_vae {

// Channels per level: encoder [b, b*m0, ..., b*m_{L-1}] (L + 1 entries; level i maps entry i to
// i + 1) and decoder [b*m_{L-1}, b*m_{L-1}, ..., b*m0] (up block i writes entry i + 1; it reads
// entry i, halved for i > 0 by the upsampler before it).
std::vector<int64_t> encoder_dims(const Config& c);
std::vector<int64_t> decoder_dims(const Config& c);
// The input channels of decoder up block i.
int64_t up_block_in(const Config& c, int64_t i);

// The checkpoint prefix of encoder level i's resnet j and of its downsampler: diffusers keeps
// them in one flat list, encoder.down_blocks.<k> (num_res_blocks resnets, then the resample).
std::string down_resnet_name(const Config& c, int64_t level, int64_t j);
std::string downsampler_name(const Config& c, int64_t level);

// Every tensor a checkpoint of this config must hold, with its shape. The CausalConv3d weights
// are 5-D [Cout, Cin, k, k, k]; the time_convs of "downsample3d" / "upsample3d" levels, which a
// single frame never reads, are checked for shape and not loaded.
std::vector<ExpectedTensor> weight_table(const Config& c);

// Problems (missing, wrong shape, unreadable dtype, unexpected) between the files and the table.
std::vector<std::string> check_weights(const std::map<std::string, TensorInfo>& tensors,
                                       const Config& c);

int64_t parameter_count(const Config& c);

}  // namespace flowkv::qwen_vae
