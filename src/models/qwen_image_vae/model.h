// The Qwen-Image VAE (diffusers AutoencoderKLQwenImage, the Wan-2.1 VAE) on one frame, and the
// QwenImage pipelines' latent conventions.
//
// Images are [B, C, H, W] f32 in [-1, 1] (PyTorch order; C = input_channels, 3 = RGB when
// released); H and W must be multiples of config.scale_factor() (8 when released). Latents are
// "normalised" [B, z, H/8, W/8] (z = 16).
//
//   encode:  image -> encoder -> quant_conv -> moments [B, 2z, h, w] -> mode (the mean half:
//            _encode_vae_image's retrieve_latents(sample_mode="argmax")) ->
//            (x - latents_mean) / latents_std
//   decode:  latents -> x * latents_std + latents_mean -> post_quant_conv -> decoder ->
//            clamp to [-1, 1] (vae.decode(...)[0][:, :, 0])
//
// diffusers runs these as a video VAE on a [B, C, 1, H, W] tensor, the first (and only) chunk
// with an empty feature cache. For that frame every CausalConv3d pads 2*p zero frames in front
// (no cache is passed on the first chunk), so a k x k x k kernel sees the frame at its last time
// tap only: it is a 2-D convolution with weight[:, :, k - 1] (flowkv loads that slice). The
// downsample3d layers only cache the frame and the upsample3d layers only mark "Rep" on the
// first chunk: no time_conv runs, and the resamplers are 2-D (zero-pad right/bottom + stride-2
// 3x3 conv; nearest-exact 2x + a 3x3 conv that halves the channels).
//
// The transformer reads tokens: pack() cuts [B, C, h, w] into 2x2 patches, [B, (h/2)(w/2), 4C]
// (QwenImagePipeline._pack_latents), and unpack() inverts it (_unpack_latents without the frame
// axis).
#pragma once

#include <map>
#include <memory>
#include <string>

#include "core/exec_context.h"
#include "flowkv/tensor.h"
#include "models/common/wan_vae.h"
#include "models/qwen_image_vae/config.h"

namespace flowkv::qwen_vae {

// [B, C, h, w] -> [B, (h/2)(w/2), 4C]: token (py, px) in row-major order over the 2x2 patches,
// channel c*4 + dy*2 + dx. h and w must be even.
Tensor pack(const Tensor& z);
// The inverse; h, w: the latent size (even).
Tensor unpack(const Tensor& tokens, int64_t h, int64_t w);

// Tiled decode as diffusers' AutoencoderKLQwenImage.tiled_decode after enable_tiling (defaults:
// 256 px tiles every 192 px). Unlike diffusers' tiled_decode, the tiled image is clamped to
// [-1, 1] too (the pipelines' postprocess clamps anyway).
using DecodeOptions = wan_vae::DecodeOptions;

// encode, encode_moments, decode, decode_z, normalize, denormalize, check_image and
// check_latents: wan_vae::VaeBase.
class Vae : public wan_vae::VaeBase {
 public:
  Vae(Vae&&) noexcept;
  Vae& operator=(Vae&&) noexcept;
  ~Vae();

  // Loads a diffusers vae/ folder (config.json + safetensors), the vae/ of a pipeline folder, or
  // a lone .safetensors file under diffusers names (then the config is the class defaults: the
  // released VAE). Every missing, misshapen or unexpected tensor is a flowkv::Error naming the
  // folder or file and the tensor, raised before any weight is read. BF16/F16 weights are
  // widened to f32.
  static Vae load(const std::string& path);
  // From tensors under diffusers names (tests, zero weights for measurements).
  static Vae from_tensors(const Config& c, const std::map<std::string, Tensor>& tensors,
                          const std::string& what = "VAE tensors");

  const Config& config() const { return cfg_; }
  // Bytes of the weights as held (f32, the 2-D slices of the 3-D kernels, no time_convs).
  int64_t weight_bytes() const;
  int64_t held_bytes() const { return weight_bytes(); }

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

}  // namespace flowkv::qwen_vae
