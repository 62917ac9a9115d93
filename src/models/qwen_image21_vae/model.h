// The Qwen-Image-2.1 VAE (diffusers AutoencoderKLQwenImage21) on one frame, and the
// QwenImage21Pipeline's latent conventions.
//
// Images are [B, C_in, H, W] f32 in [-1, 1] (PyTorch order; C_in = 4, RGBA, when released); H
// and W must be multiples of config.scale_factor() (16 when released). Latents are
// "normalised" [B, z, H/16, W/16] (z = 64), unpatched: one transformer token per latent pixel.
//
//   encode:  image -> encoder -> quant_conv -> moments [B, 2z, h, w] -> mode (the mean half:
//            _encode_vae_image's retrieve_latents(sample_mode="argmax")) ->
//            (x - latents_mean) / latents_std
//   decode:  latents -> x * latents_std + latents_mean -> post_quant_conv -> decoder ->
//            clamp to [-1, 1] (vae.decode(...)[0][:, :, 0])
//
// diffusers runs these as a video VAE on a [B, C, 1, H, W] tensor. For one frame its
// "CausalConv3d"s are nn.Conv2d on the squeezed frame; the first chunk never runs a time_conv
// (the feature cache is empty: downsample3d caches the frame, upsample3d marks "Rep"); but the
// residual shortcuts still see the time axis: AvgDown3D with factor_t 2 pads one zero frame in
// front and averages it into half of each output group, and DupUp3D with factor_t 2 keeps the
// second of the two frames it makes (first_chunk). flowkv computes exactly that, in 2-D.
//
// The transformer reads tokens: pack() turns [B, C, h, w] into [B, h*w, C] (_pack_latents) and
// unpack() inverts it (_unpack_latents without the frame axis).
#pragma once

#include <map>
#include <memory>
#include <string>

#include "core/exec_context.h"
#include "flowkv/tensor.h"
#include "models/common/wan_vae.h"
#include "models/qwen_image21_vae/config.h"

namespace flowkv::qwen21_vae {

// [B, C, h, w] <-> [B, h*w, C].
Tensor pack(const Tensor& x);
Tensor unpack(const Tensor& tokens, int64_t h, int64_t w);

// Tiled decode as diffusers' AutoencoderKLQwenImage21.tiled_decode (models/common/wan_vae.h).
using DecodeOptions = wan_vae::DecodeOptions;

// encode, encode_moments, decode, decode_z, normalize, denormalize, check_image and
// check_latents: wan_vae::VaeBase.
class Vae : public wan_vae::VaeBase {
 public:
  Vae(Vae&&) noexcept;
  Vae& operator=(Vae&&) noexcept;
  ~Vae();

  // Loads a diffusers vae/ folder (config.json + safetensors), or the vae/ of a pipeline
  // folder; every missing, misshapen or unexpected tensor is a flowkv::Error naming the folder.
  // BF16/F16 weights are widened to f32.
  static Vae load(const std::string& path);
  // From tensors under diffusers names (tests, zero weights for measurements).
  static Vae from_tensors(const Config& c, const std::map<std::string, Tensor>& tensors,
                          const std::string& what = "VAE tensors");

  const Config& config() const { return cfg_; }
  int64_t held_bytes() const;

  struct Weights;  // opaque: the loaded layers (model.cc)

 private:
  using Act = wan_vae::Act;
  using BatchTrace = wan_vae::BatchTrace;
  Act encode_one(const ExecContext& ctx, const float* image, int64_t h, int64_t w, BatchTrace& tr,
                 int64_t b) const override;
  Act decode_one(const ExecContext& ctx, Act z, BatchTrace& tr, int64_t b) const override;
  std::string image_hint(const Tensor& image) const override;
  Vae(Config c, std::unique_ptr<Weights> w);
  Config cfg_;
  std::unique_ptr<Weights> w_;
};

}  // namespace flowkv::qwen21_vae
