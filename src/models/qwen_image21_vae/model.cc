// The Qwen-Image-2.1 VAE forward on one frame, read as diffusers' QwenImage21Encoder3d /
// QwenImage21Decoder3d / AutoencoderKLQwenImage21 read with an empty feature cache.
#include "models/qwen_image21_vae/model.h"

#include <algorithm>

#include "core/memory.h"
#include "flowkv/error.h"
#include "io/checkpoint.h"
#include "models/common/vae_files.h"
#include "models/qwen_image21_vae/weights.h"
#include "ops/conv.h"

namespace flowkv::qwen21_vae {

using ops::Conv2d;
using ops::Conv2dShape;
using namespace wan_vae;  // the shared blocks: Act, ResnetW, conv, resnet, mid, ...

Tensor pack(const Tensor& x) {
  FLOWKV_CHECK(x.ndim() == 4 && x.dtype() == DType::kF32, "pack: expected f32 [B, C, h, w], got ",
               shape_str(x.shape()));
  const int64_t b = x.dim(0), c = x.dim(1), hw = x.dim(2) * x.dim(3);
  Tensor out = Tensor::empty({b, hw, c});
  for (int64_t n = 0; n < b; ++n)
    ops::to_channels_last(x.f32() + n * c * hw, c, hw, out.f32() + n * c * hw);
  return out;
}

Tensor unpack(const Tensor& t, int64_t h, int64_t w) {
  FLOWKV_CHECK(t.ndim() == 3 && t.dtype() == DType::kF32 && h > 0 && w > 0 && t.dim(1) == h * w,
               "unpack: expected f32 [B, ", h, "*", w, ", C] tokens, got ", shape_str(t.shape()));
  const int64_t b = t.dim(0), c = t.dim(2), hw = h * w;
  Tensor out = Tensor::empty({b, c, h, w});
  for (int64_t n = 0; n < b; ++n)
    ops::to_channels_first(t.f32() + n * c * hw, hw, c, out.f32() + n * c * hw);
  return out;
}

// ---------------------------------------------------------------------------------------------
// Weights

namespace {

// A residual down (encoder) or up (decoder) block.
struct LevelW {
  std::vector<ResnetW> resnets;
  Conv2d resample;          // downsample2d/3d's stride-2 conv or upsample's conv; empty: none
  int64_t in = 0, out = 0;  // channels
  int64_t factor_t = 1;     // the shortcut's time factor (2 where the level is "3d")
  bool spatial = false;     // the shortcut halves (encoder) or doubles (decoder) H and W
};

}  // namespace

struct Vae::Weights {
  Conv2d enc_in, enc_out, quant, post_quant, dec_in, dec_out;
  std::vector<LevelW> down, up;
  MidW enc_mid, dec_mid;
  std::vector<float> enc_norm, dec_norm;
  int64_t bytes = 0;
};

namespace {

std::unique_ptr<Vae::Weights> build(const Config& c, const Getter& get) {
  auto w = std::make_unique<Vae::Weights>();
  const int64_t n = c.levels(), z = c.z_dim;
  const std::vector<int64_t> enc = encoder_dims(c), dec = decoder_dims(c);
  w->enc_in = load_conv(get, "encoder.conv_in", Conv2dShape::same3x3(c.in_channels, enc[0]));
  for (int64_t i = 0; i < n; ++i) {
    const std::string p = "encoder.down_blocks." + std::to_string(i);
    LevelW l;
    l.in = enc[size_t(i)];
    l.out = enc[size_t(i + 1)];
    for (int64_t j = 0; j < c.num_res_blocks; ++j) {
      l.resnets.push_back(
          load_resnet(get, p + ".resnets." + std::to_string(j), j == 0 ? l.in : l.out, l.out));
    }
    if (i < n - 1) {
      l.resample =
          load_conv(get, p + ".downsampler.resample.1", Conv2dShape::down3x3(l.out, l.out));
      l.spatial = true;
      l.factor_t = c.temporal_down(i) ? 2 : 1;
    }
    w->down.push_back(std::move(l));
  }
  w->enc_mid = load_mid(get, "encoder.mid_block", enc.back());
  w->enc_norm = floats(get("encoder.norm_out.gamma"));
  w->enc_out = load_conv(get, "encoder.conv_out", Conv2dShape::same3x3(enc.back(), 2 * z));
  w->quant = load_conv(get, "quant_conv", Conv2dShape::pointwise(2 * z, 2 * z));
  w->post_quant = load_conv(get, "post_quant_conv", Conv2dShape::pointwise(z, z));
  w->dec_in = load_conv(get, "decoder.conv_in", Conv2dShape::same3x3(z, dec[0]));
  w->dec_mid = load_mid(get, "decoder.mid_block", dec[0]);
  for (int64_t i = 0; i < n; ++i) {
    const std::string p = "decoder.up_blocks." + std::to_string(i);
    LevelW l;
    l.in = dec[size_t(i)];
    l.out = dec[size_t(i + 1)];
    for (int64_t j = 0; j <= c.num_res_blocks; ++j) {
      l.resnets.push_back(
          load_resnet(get, p + ".resnets." + std::to_string(j), j == 0 ? l.in : l.out, l.out));
    }
    if (i < n - 1) {
      l.resample = load_conv(get, p + ".upsampler.resample.1", Conv2dShape::same3x3(l.out, l.out));
      l.spatial = true;
      l.factor_t = c.temporal_up(i) ? 2 : 1;
    }
    w->up.push_back(std::move(l));
  }
  w->dec_norm = floats(get("decoder.norm_out.gamma"));
  w->dec_out = load_conv(get, "decoder.conv_out", Conv2dShape::same3x3(dec.back(), c.out_channels));
  w->bytes = parameter_count(c) * 4;
  return w;
}

// What the shared loops need of the config (below, with the forward).
wan_vae::Geometry geometry_of(const Config& c);

}  // namespace

Vae::Vae(Config c, std::unique_ptr<Weights> w)
    : VaeBase(geometry_of(c), c.latents_mean, c.latents_std),
      cfg_(std::move(c)),
      w_(std::move(w)) {}
Vae::Vae(Vae&&) noexcept = default;
Vae& Vae::operator=(Vae&&) noexcept = default;
Vae::~Vae() = default;

Vae Vae::from_tensors(const Config& c, const std::map<std::string, Tensor>& tensors,
                      const std::string& what) {
  c.validate(what);
  const auto problems = check_weights(tensor_infos(tensors), c);
  FLOWKV_CHECK(problems.empty(),
               format_problems(what + " do not match the Qwen-Image-2.1 VAE config", problems));
  return Vae(c, build(c, [&](const std::string& n) { return tensors.at(n); }));
}

Vae Vae::load(const std::string& path) {
  const std::string dir = vae_folder(path);
  const CheckpointScan scan = scan_checkpoint(dir);
  FLOWKV_CHECK(scan.config.has_value() && !scan.single_file, dir,
               ": expected a diffusers VAE folder (config.json and safetensors)");
  const Config c = Config::from_json(*scan.config, dir + "/config.json");
  const auto problems = check_weights(scan.tensors, c);
  FLOWKV_CHECK(
      problems.empty(),
      format_problems(dir + ": the weights do not match config.json (AutoencoderKLQwenImage21)",
                      problems));
  check_weights_fit(
      weight_table(c), [](const ExpectedTensor& e) { return shape_numel(e.shape) * 4; },
      "the Qwen-Image-2.1 VAE (f32)");
  CheckpointReader reader(scan);
  return Vae(c, build(c, [&](const std::string& n) { return reader.get(n); }));
}

int64_t Vae::held_bytes() const {
  return w_->bytes;
}

// ---------------------------------------------------------------------------------------------
// Forward

namespace {

// QwenImage21AvgDown3D on one frame, added into y [h/fs, w/fs, out]. The input's channels
// and its (factor_t, fs, fs) sub-positions form index c*F + ft*fs*fs + dy*fs + dx (F = factor_t
// fs^2); output channel o is the mean of indices [o*G, (o+1)*G), G = in*F/out. With factor_t 2
// the single frame is the second one: the first (ft = 0) is the zero frame F.pad put in front.
void add_avg_down(Act& y, const Act& x, int64_t factor_t, int64_t fs) {
  const int64_t f = factor_t * fs * fs, cin = x.c, cout = y.c, g = cin * f / cout;
  for (int64_t oy = 0; oy < y.h; ++oy) {
    for (int64_t ox = 0; ox < y.w; ++ox) {
      float* out = y.p() + (oy * y.w + ox) * cout;
      for (int64_t o = 0; o < cout; ++o) {
        float s = 0.0f;
        for (int64_t i = o * g; i < (o + 1) * g; ++i) {
          const int64_t c = i / f, r = i % f, ft = r / (fs * fs), dy = (r / fs) % fs, dx = r % fs;
          if (ft != factor_t - 1) continue;  // the zero frame
          s += x.p()[((oy * fs + dy) * x.w + ox * fs + dx) * cin + c];
        }
        out[o] += s / static_cast<float>(g);
      }
    }
  }
}

// QwenImage21DupUp3D on one frame (first_chunk), added into y [2h, 2w, out]: channels repeated
// `repeats` = out*F/in times, read as (out, factor_t, 2, 2); of the factor_t frames the last.
void add_dup_up(Act& y, const Act& x, int64_t factor_t) {
  const int64_t fs = 2, f = factor_t * fs * fs, cin = x.c, cout = y.c, rep = cout * f / cin;
  for (int64_t oy = 0; oy < y.h; ++oy) {
    for (int64_t ox = 0; ox < y.w; ++ox) {
      const float* in = x.p() + ((oy / fs) * x.w + ox / fs) * cin;
      float* out = y.p() + (oy * y.w + ox) * cout;
      const int64_t sub = (factor_t - 1) * fs * fs + (oy % fs) * fs + ox % fs;
      for (int64_t o = 0; o < cout; ++o) out[o] += in[(o * f + sub) / rep];
    }
  }
}

// Encoder + quant_conv of one image [C_in, H, W] channels-first -> moments [h, w, 2z].
Act encode_frame(const ExecContext& ctx, const Vae::Weights& w, const Config& c, const float* img,
                 int64_t h, int64_t wd, BatchTrace& tr, int64_t b) {
  Act x = conv(ctx, w.enc_in, channels_last(img, c.in_channels, h, wd));
  tr.add("encoder.conv_in", x, b);
  for (size_t i = 0; i < w.down.size(); ++i) {
    const LevelW& l = w.down[i];
    const Act copy = copy_of(x);
    for (const ResnetW& r : l.resnets) x = resnet(ctx, r, std::move(x));
    if (!l.resample.empty()) x = conv(ctx, l.resample, x);
    add_avg_down(x, copy, l.factor_t, l.spatial ? 2 : 1);
    tr.add("encoder.down_blocks." + std::to_string(i), x, b);
  }
  x = mid(ctx, w.enc_mid, std::move(x), tr, "encoder.mid_block", b);
  norm(ctx, x, x, w.enc_norm, true);
  x = conv(ctx, w.enc_out, x);
  tr.add("encoder.conv_out", x, b);
  x = conv(ctx, w.quant, x);
  tr.add("quant_conv", x, b);
  return x;
}

// post_quant_conv + decoder of one latent [h, w, z] -> image [16h, 16w, C_out], not clamped.
Act decode_frame(const ExecContext& ctx, const Vae::Weights& w, Act x, BatchTrace& tr, int64_t b) {
  x = conv(ctx, w.post_quant, x);
  tr.add("post_quant_conv", x, b);
  x = conv(ctx, w.dec_in, x);
  tr.add("decoder.conv_in", x, b);
  x = mid(ctx, w.dec_mid, std::move(x), tr, "decoder.mid_block", b);
  for (size_t i = 0; i < w.up.size(); ++i) {
    const LevelW& l = w.up[i];
    const Act copy = l.spatial ? copy_of(x) : Act();
    for (const ResnetW& r : l.resnets) x = resnet(ctx, r, std::move(x));
    if (!l.resample.empty()) x = upsample_conv(ctx, l.resample, x);
    if (l.spatial) add_dup_up(x, copy, l.factor_t);
    tr.add("decoder.up_blocks." + std::to_string(i), x, b);
  }
  norm(ctx, x, x, w.dec_norm, true);
  x = conv(ctx, w.dec_out, x);
  tr.add("decoder", x, b);
  return x;
}

// What the shared loops need of the config.
wan_vae::Geometry geometry_of(const Config& c) {
  wan_vae::Geometry g;
  g.in_channels = c.in_channels;
  g.out_channels = c.out_channels;
  g.z_dim = c.z_dim;
  g.factor = c.scale_factor();
  // Channels per resolution, full resolution first: encoder level r's resnets widen enc[r] to
  // enc[r+1]; at decoder resolution r the up block that upsamples into it writes dec[L - r - 1]
  // channels and the next one narrows them to dec[L - r].
  const std::vector<int64_t> enc = encoder_dims(c), dec = decoder_dims(c);
  for (size_t r = 0; r + 1 < enc.size(); ++r)
    g.encoder_by_res.push_back(std::max(enc[r], enc[r + 1]));
  const int64_t nl = c.levels();
  for (int64_t r = 0; r < nl; ++r)
    g.decoder_by_res.push_back(std::max(dec[size_t(nl - r)], dec[size_t(nl - r - 1)]));
  return g;
}

}  // namespace

Act Vae::encode_one(const ExecContext& ctx, const float* image, int64_t h, int64_t w,
                    BatchTrace& tr, int64_t b) const {
  return encode_frame(ctx, *w_, cfg_, image, h, w, tr, b);
}

Act Vae::decode_one(const ExecContext& ctx, Act z, BatchTrace& tr, int64_t b) const {
  return decode_frame(ctx, *w_, std::move(z), tr, b);
}

std::string Vae::image_hint(const Tensor& img) const {
  const bool rgb = img.ndim() == 4 && img.dim(1) == 3 && cfg_.in_channels == 4;
  return rgb ? " (the Qwen-Image-2.1 VAE reads RGBA: add alpha)" : "";
}

}  // namespace flowkv::qwen21_vae
