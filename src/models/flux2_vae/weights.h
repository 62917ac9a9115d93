// The FLUX.2 VAE's one weight-name table: every tensor of diffusers' AutoencoderKLFlux2
// state dict (checkpoint keys, PyTorch shapes), generated from the config by the same walk of
// the architecture the loader uses.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "io/checkpoint.h"
#include "models/flux2_vae/config.h"

namespace flowkv::flux2_vae {

// Every tensor a checkpoint of this config must hold, with its shape.
std::vector<ExpectedTensor> weight_table(const Config& c);

// Tensors a checkpoint may hold that the model does not need (BatchNorm's training counter,
// "bn.num_batches_tracked", an I64 scalar).
bool ignored_tensor(const std::string& name);

// Problems (missing, wrong shape, unreadable dtype, unexpected) between the files and the table.
std::vector<std::string> check_weights(const std::map<std::string, TensorInfo>& tensors,
                                       const Config& c);

int64_t parameter_count(const Config& c);

}  // namespace flowkv::flux2_vae
