// The FLUX.2 VAE (diffusers AutoencoderKLFlux2) and the Klein pipelines' latent conventions.
//
// Images are [B, 3, H, W] f32 in [-1, 1] (PyTorch order); H and W must be multiples of
// config.pixel_multiple() (16 when released). Latents, as the transformer sees them, are
// "normalised patchified" [B, 4L, H/16, W/16] (L = latent_channels = 32: 128 channels):
//
//   encode:  rgb -> encoder -> quant_conv -> moments [B, 2L, H/8, W/8] -> mode (the mean half:
//            Flux2KleinPipeline._encode_vae_image calls retrieve_latents with
//            sample_mode="argmax") -> patchify 2x2 -> (x - running_mean) / sqrt(running_var + eps)
//   decode:  latents -> x * sqrt(running_var + eps) + running_mean -> unpatchify ->
//            post_quant_conv -> decoder -> [B, 3, H, W]
//
// The transformer reads tokens: pack() turns [B, C, h, w] into [B, h*w, C] (row-major over
// (y, x), as _pack_latents) and unpack() inverts it. The steps are free functions so the
// pipeline can use each one alone (e.g. denormalise the denoised tokens, then decode).
//
// Internally activations are channels-last ([H, W, C], one image of the batch at a time), the
// layout the convolution GEMM and attention read. Weights are widened to f32 at load (84M
// parameters: 336 MB at the released size).
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/exec_context.h"
#include "flowkv/tensor.h"
#include "models/flux2_vae/config.h"

namespace flowkv::flux2_vae {

// [B, C, H, W] -> [B, 4C, H/2, W/2]: channel c*4 + dy*2 + dx holds pixel (2y+dy, 2x+dx) of c.
Tensor patchify(const Tensor& z);
Tensor unpatchify(const Tensor& x);
// [B, C, h, w] <-> [B, h*w, C].
Tensor pack(const Tensor& x);
Tensor unpack(const Tensor& tokens, int64_t h, int64_t w);

// Tiled decode, as diffusers' AutoencoderKLFlux2.tiled_decode: the /8 latent is cut into
// tiles of `tile_latent` latent pixels every tile_latent * (1 - overlap) pixels; each tile is
// decoded alone and blended linearly into its upper and left neighbours over
// tile_latent * 8 * overlap pixels (blend_v / blend_h), then cropped. Tiles exist only when the
// latent is larger than one tile. Memory: one tile's activations plus the output image.
struct DecodeOptions {
  bool tiled = false;
  int64_t tile_latent = 0;  // latent pixels per tile side; 0: sample_size / scale_factor (128)
  double overlap = 0.25;    // diffusers' tile_overlap_factor
};

class Vae {
 public:
  Vae(Vae&&) noexcept;
  Vae& operator=(Vae&&) noexcept;
  ~Vae();

  // Loads a diffusers vae/ folder (config.json + safetensors), or the vae/ of a pipeline
  // folder, through scan_checkpoint and CheckpointReader; every missing, misshapen or
  // unexpected tensor is a flowkv::Error naming the folder. BF16/F16 weights are widened to f32.
  static Vae load(const std::string& path);
  // From tensors under diffusers names (tests, random or zero weights for measurements).
  static Vae from_tensors(const Config& c, const std::map<std::string, Tensor>& tensors,
                          const std::string& what = "VAE tensors");

  const Config& config() const { return cfg_; }
  int64_t held_bytes() const;

  // rgb [B, 3, H, W] in [-1, 1] -> normalised patchified latents [B, 4L, H/16, W/16].
  Tensor encode(const ExecContext& ctx, const Tensor& rgb) const;
  // rgb -> the posterior's moments [B, 2L, H/8, W/8] (mean, then log-variance), as vae.encode.
  Tensor encode_moments(const ExecContext& ctx, const Tensor& rgb) const;
  // Normalised patchified latents [B, 4L, h, w] -> image [B, 3, 16h, 16w] (about [-1, 1];
  // the pipeline clamps when it converts to pixels).
  Tensor decode(const ExecContext& ctx, const Tensor& latents, const DecodeOptions& o = {}) const;
  // The /8 latent z [B, L, H/8, W/8] -> image, as vae.decode (post_quant_conv, decoder).
  Tensor decode_z(const ExecContext& ctx, const Tensor& z, const DecodeOptions& o = {}) const;

  // The BatchNorm normalisation alone, in place on [B, 4L, h, w]: (x - mean) / std and back.
  void normalize(Tensor& x) const;
  void denormalize(Tensor& x) const;

  // Checks an image batch (shape, dtype, multiple of pixel_multiple, size limits); `what`
  // names it in the error.
  void check_image(const Tensor& rgb, const std::string& what) const;

  struct Weights;  // opaque: the loaded layers (model.cc)

 private:
  template <class F>
  void per_channel(Tensor& x, F&& f) const;
  Vae(Config c, std::unique_ptr<Weights> w);
  Config cfg_;
  std::unique_ptr<Weights> w_;
};

}  // namespace flowkv::flux2_vae
