// Qwen-Image VAE configuration: diffusers' AutoencoderKLQwenImage config.json (vae/ of a
// QwenImagePipeline or QwenImageEditPlusPipeline folder). The class defaults are the released
// values: base_dim 96, z_dim 16, dim_mult [1, 2, 4, 4] (/8), num_res_blocks 2,
// temperal_downsample [false, true, true], attn_scales [], input_channels 3 (RGB), and 16
// latents_mean / latents_std values. It is the Wan-2.1 video VAE, fine-tuned.
#pragma once

#include <string>
#include <vector>

#include "io/json.h"

namespace flowkv::qwen_vae {

// diffusers' class defaults of latents_mean and latents_std (16 values each).
const std::vector<float>& default_latents_mean();
const std::vector<float>& default_latents_std();

struct Config {
  int64_t base_dim = 96;
  int64_t z_dim = 16;
  std::vector<int64_t> dim_mult = {1, 2, 4, 4};
  int64_t num_res_blocks = 2;
  // Per encoder level (all but the last): whether its downsampler is "downsample3d", which also
  // halves time. A single frame never runs a time_conv (the first chunk only fills the feature
  // cache), so the flag only decides whether the checkpoint holds one. The decoder reads the
  // list reversed (temperal_upsample). Exactly levels() - 1 entries: diffusers' pipelines take
  // the spatial factor as 2^len(temperal_downsample).
  std::vector<bool> temperal_downsample = {false, true, true};
  int64_t input_channels = 3;  // image channels in (encoder) and out (decoder)
  std::vector<float> latents_mean = default_latents_mean();  // z_dim values each
  std::vector<float> latents_std = default_latents_std();
  // Note: attn_scales must be empty (as released: no attention in the down blocks) and dropout
  // is read and ignored (inference).

  int64_t levels() const { return static_cast<int64_t>(dim_mult.size()); }
  // Pixels per latent pixel: 2^(levels - 1), 8 when released (the pipelines' vae_scale_factor).
  int64_t scale_factor() const { return int64_t{1} << (levels() - 1); }
  bool temporal_down(int64_t level) const { return temperal_downsample[size_t(level)]; }
  // diffusers' temperal_upsample = temperal_downsample[::-1], indexed by decoder level.
  bool temporal_up(int64_t level) const {
    return temperal_downsample[temperal_downsample.size() - 1 - size_t(level)];
  }

  // Reads config.json; missing fields take diffusers' defaults. Throws a flowkv::Error naming
  // `source` and the field on wrong types, values flowkv does not implement (a non-empty
  // attn_scales) or impossible values (latents_mean / latents_std not z_dim long, a
  // temperal_downsample that does not match dim_mult, a zero std, ...).
  static Config from_json(const Json& j, const std::string& source);
  // A config.json diffusers' AutoencoderKLQwenImage accepts (from_pretrained).
  Json to_json() const;
  void validate(const std::string& source) const;
};

}  // namespace flowkv::qwen_vae
