// What the Wan-style causal video VAEs run on one frame share: diffusers' AutoencoderKLQwenImage
// (Wan 2.1) and AutoencoderKLQwenImage21 (Wan 2.2, residual). Both are, for a single frame,
// 2-D convolutions, channel RMS norms, single-head mid attention and nearest 2x upsampling on
// channels-last images; they differ in how the levels are wired (shortcuts, channel halving),
// which each model writes in its own model.cc with these blocks.
//
// Activations are channels-last ([H, W, C], one image of the batch at a time), as the
// convolution GEMM and attention read them. Weights are widened to f32 at load.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/exec_context.h"
#include "flowkv/tensor.h"
#include "io/checkpoint.h"
#include "io/json.h"
#include "ops/conv.h"

namespace flowkv::wan_vae {

// Tiled decode, as diffusers' tiled_decode after enable_tiling(tile_sample_min_height, ...):
// the latent is cut into tiles of tile_sample_min / f latent pixels every tile_sample_stride / f
// (f: the VAE's spatial factor); each tile is decoded alone, blended linearly into its upper and
// left neighbours over (min - stride) pixels (blend_v / blend_h), cropped to stride pixels, and
// the image is clamped. Tiles are used only when the latent is larger than one tile. Sizes in
// pixels must be multiples of f, with stride <= min. Memory: one row of decoded tiles plus the
// output image.
struct DecodeOptions {
  bool tiled = false;
  int64_t tile_sample_min_height = 256;  // diffusers' defaults
  int64_t tile_sample_min_width = 256;
  int64_t tile_sample_stride_height = 192;
  int64_t tile_sample_stride_width = 192;
};

// ---------------------------------------------------------------------------------------------
// Config lists (the fields of config.json that are lists); errors name `src` and `key`.

// 1 to max_len integers in [1, hi].
std::vector<int64_t> json_int_list(const Json& v, const char* key, int64_t max_len, int64_t hi,
                                   const std::string& src);
// At most max_len booleans.
std::vector<bool> json_bool_list(const Json& v, const char* key, int64_t max_len,
                                 const std::string& src);
// Finite numbers, rounded to f32 as torch.tensor(list) does.
std::vector<float> json_float_list(const Json& v, const char* key, const std::string& src);

// ---------------------------------------------------------------------------------------------
// Weights

// A tensor by its checkpoint name.
using Getter = std::function<Tensor(const std::string&)>;

struct ResnetW {
  std::vector<float> g1, g2;  // RMS-norm gammas
  ops::Conv2d c1, c2, shortcut;
};
struct AttnW {
  std::vector<float> norm;
  ops::Conv2d q, k, v, proj;
};
struct MidW {
  ResnetW r0, r1;
  AttnW attn;
};

// The name table of a checkpoint, built by walking the architecture. With `causal3d` the
// convolutions of the resnets (and those the models add through conv()) are stored as
// CausalConv3d weights [Cout, Cin, k, k, k] (the Wan-2.1 VAE); else as Conv2d [Cout, Cin, k, k]
// (the 2.1 VAE). The attention's to_qkv / proj are Conv2d in both.
struct WeightTable {
  bool causal3d = false;
  std::vector<ExpectedTensor> t;
  void add(const std::string& n, Shape s) { t.push_back({n, std::move(s)}); }
  void conv2d(const std::string& p, int64_t cout, int64_t cin, int64_t k);
  // A CausalConv3d with a (kt, 1, 1) kernel (the time_convs).
  void time_conv(const std::string& p, int64_t cout, int64_t cin, int64_t kt);
  void conv(const std::string& p, int64_t cout, int64_t cin, int64_t k);
  // RMS_norm gamma: [C, 1, 1, 1] (images=False) or [C, 1, 1] (images=True).
  void norm(const std::string& p, int64_t c, bool images = false);
  void resnet(const std::string& p, int64_t cin, int64_t cout);
  void mid(const std::string& p, int64_t c);
};

std::vector<float> floats(const Tensor& t);
ops::Conv2d load_conv(const Getter& get, const std::string& p, const ops::Conv2dShape& s);
// A residual block <p>.{norm1,conv1,norm2,conv2,conv_shortcut} (3x3 convs, 1x1 shortcut when
// the channel count changes).
ResnetW load_resnet(const Getter& get, const std::string& p, int64_t cin, int64_t cout);
// A mid block <p>.{resnets.0, attentions.0, resnets.1} of c channels.
MidW load_mid(const Getter& get, const std::string& p, int64_t c);

// ---------------------------------------------------------------------------------------------
// Activations and blocks

// One channels-last activation [h, w, c].
struct Act {
  std::unique_ptr<float[]> d;
  int64_t h = 0, w = 0, c = 0;
  static Act make(int64_t h, int64_t w, int64_t c);
  float* p() const { return d.get(); }
  int64_t hw() const { return h * w; }
};

// Per-image intermediates gathered into [B, C, H, W] tensors for the tracer.
class BatchTrace {
 public:
  BatchTrace(Tracer* tracer, int64_t batch) : tracer_(tracer), batch_(batch) {}
  void add(const std::string& name, const Act& a, int64_t b);
  void flush();

 private:
  Tracer* tracer_;
  int64_t batch_;
  std::map<std::string, Tensor> got_;
};

Act conv(const ExecContext& ctx, const ops::Conv2d& cv, const Act& x);
// RMS norm over channels (then SiLU when `silu`), x into y (may be the same).
void norm(const ExecContext& ctx, const Act& x, const Act& y, const std::vector<float>& gamma,
          bool silu);
void add_into(Act& y, const Act& x);
// The residual block: shortcut(x) + conv2(SiLU(norm2(conv1(SiLU(norm1(x)))))).
Act resnet(const ExecContext& ctx, const ResnetW& r, Act x);
// The attention block: RMS norm, one head of width C over the h*w pixels (SDPA's scale
// 1/sqrt(C)), output projection, residual.
Act attention(const ExecContext& ctx, const AttnW& a, const Act& x);
// The mid block, traced as <p>.resnets.0, <p>.attentions.0 and <p>.
Act mid(const ExecContext& ctx, const MidW& m, Act x, BatchTrace& tr, const std::string& p,
        int64_t b);
// A channels-first image [c, h, w] as an activation.
Act channels_last(const float* chw, int64_t c, int64_t h, int64_t w);
Act copy_of(const Act& x);
// Upsample nearest-exact 2x (for a factor of 2 the same as nearest), then the 3x3 conv `cv`,
// reading the small image in place.
Act upsample_conv(const ExecContext& ctx, const ops::Conv2d& cv, const Act& x);

// ---------------------------------------------------------------------------------------------
// The model-level loops: checks, batch, memory, normalisation, tiling

// What the loops need of a model: channel counts, the spatial factor, and the widest
// activation at each resolution (full resolution first) of the encoder and the decoder.
struct Geometry {
  int64_t in_channels = 3;
  int64_t out_channels = 3;
  int64_t z_dim = 16;
  int64_t factor = 8;
  std::vector<int64_t> encoder_by_res, decoder_by_res;
};

// The public surface of a Wan-style VAE on images: the batch loops, checks, normalisation and
// tiling around a model's per-image encoder and decoder.
//
// Images are [B, C_in, H, W] f32 in [-1, 1] (PyTorch order), H and W multiples of the factor f;
// latents are "normalised" [B, z, H/f, W/f].
//   encode:  image -> encoder -> quant_conv -> moments [B, 2z, h, w] -> mode (the mean half:
//            retrieve_latents(sample_mode="argmax")) -> (x - latents_mean) / latents_std
//   decode:  latents -> x * latents_std + latents_mean -> post_quant_conv -> decoder ->
//            clamp to [-1, 1] (vae.decode(...)[0][:, :, 0])
class VaeBase {
 public:
  virtual ~VaeBase();

  // image [B, C_in, H, W] in [-1, 1] -> normalised latents [B, z, H/f, W/f].
  Tensor encode(const ExecContext& ctx, const Tensor& image) const;
  // image -> the posterior's parameters [B, 2z, H/f, W/f] (mean, then log-variance, not
  // clamped), as vae.encode(x).latent_dist.parameters without the frame axis.
  Tensor encode_moments(const ExecContext& ctx, const Tensor& image) const;
  // Normalised latents [B, z, h, w] -> image [B, C_out, fh, fw] clamped to [-1, 1].
  Tensor decode(const ExecContext& ctx, const Tensor& latents, const DecodeOptions& o = {}) const;
  // Raw latents (denormalised) -> image, as vae.decode.
  Tensor decode_z(const ExecContext& ctx, const Tensor& z, const DecodeOptions& o = {}) const;

  // The per-channel normalisation alone, in place on [B, z, h, w]: (x - mean) / std and back
  // (x * std + mean), in f32 as the pipelines compute them.
  void normalize(Tensor& x) const;
  void denormalize(Tensor& x) const;

  // Checks an image batch (shape, dtype, channels, multiple of the scale factor, size limits);
  // `what` names it in the error.
  void check_image(const Tensor& image, const std::string& what) const;
  // Checks a latent batch [B, z, h, w]; `what` names it.
  void check_latents(const Tensor& latents, const std::string& what) const;

 protected:
  VaeBase(Geometry g, std::vector<float> latents_mean, std::vector<float> latents_std);
  VaeBase(VaeBase&&) noexcept;
  VaeBase& operator=(VaeBase&&) noexcept;

  // One image [C_in, H, W] channels-first -> moments [h, w, 2z] (encoder + quant_conv).
  virtual Act encode_one(const ExecContext& ctx, const float* image, int64_t h, int64_t w,
                         BatchTrace& tr, int64_t b) const = 0;
  // One latent [h, w, z] (denormalised) -> image [fh, fw, C_out], not clamped
  // (post_quant_conv + decoder).
  virtual Act decode_one(const ExecContext& ctx, Act z, BatchTrace& tr, int64_t b) const = 0;
  // Appended to the error for an image of the wrong shape.
  virtual std::string image_hint(const Tensor& image) const { return ""; }

 private:
  Geometry g_;
  std::vector<float> mean_, sd_;
};

}  // namespace flowkv::wan_vae
