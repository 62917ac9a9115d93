// FLUX.2 VAE configuration: diffusers' AutoencoderKLFlux2 config.json (vae/config.json of a
// Klein pipeline folder). Released values: block_out_channels [128, 256, 512, 512],
// layers_per_block 2, latent_channels 32, norm_num_groups 32, batch_norm_eps 1e-4,
// patch_size [2, 2].
#pragma once

#include <string>
#include <vector>

#include "io/json.h"

namespace flowkv::flux2_vae {

struct Config {
  int64_t in_channels = 3;
  int64_t out_channels = 3;
  std::vector<int64_t> block_out_channels = {128, 256, 512, 512};
  std::vector<int64_t> decoder_block_out_channels;  // empty: block_out_channels (config null)
  int64_t layers_per_block = 2;
  int64_t latent_channels = 32;
  int64_t norm_num_groups = 32;
  int64_t sample_size = 1024;  // diffusers' tiling default: tiles of sample_size pixels
  bool use_quant_conv = true;
  bool use_post_quant_conv = true;
  bool mid_block_add_attention = true;
  double batch_norm_eps = 1e-4;      // of the latent BatchNorm (its running stats)
  double batch_norm_momentum = 0.1;  // training only; read and checked, unused
  // GroupNorm eps of every resnet, attention and output norm: diffusers' Encoder and Decoder
  // hard-code 1e-6 (resnet_eps); it is not a config field.
  static constexpr float kGroupNormEps = 1e-6f;

  const std::vector<int64_t>& decoder_channels() const {
    return decoder_block_out_channels.empty() ? block_out_channels : decoder_block_out_channels;
  }
  int64_t num_blocks() const { return static_cast<int64_t>(block_out_channels.size()); }
  // Pixels per latent pixel (one down block fewer than blocks halves): 8 when released.
  int64_t scale_factor() const { return int64_t{1} << (num_blocks() - 1); }
  // Pixels per patchified latent (token) side: 16 when released; images must be multiples.
  int64_t pixel_multiple() const { return 2 * scale_factor(); }
  int64_t patched_channels() const { return 4 * latent_channels; }

  // Reads config.json; missing fields take diffusers' defaults. Throws a flowkv::Error naming
  // `source` and the field on wrong types, unsupported block types or impossible values.
  static Config from_json(const Json& j, const std::string& source);
  Json to_json() const;
  void validate(const std::string& source) const;
};

}  // namespace flowkv::flux2_vae
