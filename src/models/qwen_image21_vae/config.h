// Qwen-Image-2.1 VAE configuration: diffusers' AutoencoderKLQwenImage21 config.json (vae/ of a
// QwenImage21Pipeline folder). The class defaults are the released values: base_dim 96,
// decoder_base_dim 144, z_dim 64, dim_mult [1, 2, 4, 8, 8] (/16), num_res_blocks 2,
// temperal_downsample [false, true, true, true], is_residual true, in/out_channels 4 (RGBA),
// patch_size null, scale_factor_spatial 16, and 64 latents_mean / latents_std values.
#pragma once

#include <string>
#include <vector>

#include "io/json.h"

namespace flowkv::qwen21_vae {

// diffusers' class defaults of latents_mean and latents_std (64 values each).
const std::vector<float>& default_latents_mean();
const std::vector<float>& default_latents_std();

struct Config {
  int64_t base_dim = 96;
  int64_t decoder_base_dim = 144;  // config null: base_dim
  int64_t z_dim = 64;
  std::vector<int64_t> dim_mult = {1, 2, 4, 8, 8};
  int64_t num_res_blocks = 2;
  // Per encoder level (all but the last): whether the level also halves time. A single frame
  // never runs a time_conv, but the flag still decides the residual shortcut's arithmetic
  // (AvgDown3D averages a zero frame in; DupUp3D keeps the second of two frames) and whether the
  // checkpoint holds a time_conv. The decoder reads the list reversed.
  std::vector<bool> temperal_downsample = {false, true, true, true};
  int64_t in_channels = 4;
  int64_t out_channels = 4;
  int64_t scale_factor_temporal = 8;  // read and checked; one frame never uses it
  std::vector<float> latents_mean = default_latents_mean();  // z_dim values each
  std::vector<float> latents_std = default_latents_std();
  // Note: attn_scales and dropout are read and ignored, as diffusers ignores them in the
  // residual (is_residual = true) architecture and at inference.

  int64_t levels() const { return static_cast<int64_t>(dim_mult.size()); }
  // Pixels per latent pixel: 2^(levels - 1), 16 when released (also config scale_factor_spatial).
  int64_t scale_factor() const { return int64_t{1} << (levels() - 1); }
  bool temporal_down(int64_t level) const { return temperal_downsample[size_t(level)]; }
  // diffusers' temperal_upsample = temperal_downsample[::-1], indexed by decoder level.
  bool temporal_up(int64_t level) const {
    return temperal_downsample[temperal_downsample.size() - 1 - size_t(level)];
  }

  // Reads config.json; missing fields take diffusers' defaults. Throws a flowkv::Error naming
  // `source` and the field on wrong types, values flowkv does not implement (is_residual false,
  // a patch_size, a scale_factor_spatial that is not 2^(levels-1)) or impossible values.
  static Config from_json(const Json& j, const std::string& source);
  Json to_json() const;
  void validate(const std::string& source) const;
};

}  // namespace flowkv::qwen21_vae
