// The Qwen-Image VAE forward on one frame, read as diffusers' QwenImageEncoder3d /
// QwenImageDecoder3d / AutoencoderKLQwenImage on the first chunk (empty feature cache).
#include "models/qwen_image_vae/model.h"

#include <algorithm>
#include <cstring>

#include "flowkv/error.h"
#include "io/checkpoint.h"
#include "models/common/vae_files.h"
#include "models/qwen_image_vae/weights.h"
#include "ops/conv.h"

namespace flowkv::qwen_vae {

using ops::Conv2d;
using ops::Conv2dShape;
using namespace wan_vae;  // the shared blocks: Act, ResnetW, conv, resnet, mid, ...

namespace {

// Checks [B, C, h, w] (pack) or [B, (h/2)(w/2), 4C] (unpack) against even h, w.
void check_even(int64_t h, int64_t w, const char* what) {
  FLOWKV_CHECK(h > 0 && w > 0 && h % 2 == 0 && w % 2 == 0, what, ": the latent size ", w, "x", h,
               " must be even (2x2 patches)");
}

}  // namespace

Tensor pack(const Tensor& x) {
  FLOWKV_CHECK(x.ndim() == 4 && x.dtype() == DType::kF32, "pack: expected f32 [B, C, h, w], got ",
               shape_str(x.shape()));
  const int64_t b = x.dim(0), c = x.dim(1), h = x.dim(2), w = x.dim(3);
  check_even(h, w, "pack");
  const int64_t ph = h / 2, pw = w / 2;
  Tensor out = Tensor::empty({b, ph * pw, 4 * c});
  // view (B, C, h/2, 2, w/2, 2) -> permute (0, 2, 4, 1, 3, 5) -> (B, (h/2)(w/2), 4C)
  for (int64_t n = 0; n < b; ++n) {
    const float* src = x.f32() + n * c * h * w;
    float* dst = out.f32() + n * c * h * w;
    for (int64_t py = 0; py < ph; ++py) {
      for (int64_t px = 0; px < pw; ++px) {
        float* tok = dst + (py * pw + px) * 4 * c;
        for (int64_t ch = 0; ch < c; ++ch) {
          for (int64_t dy = 0; dy < 2; ++dy) {
            for (int64_t dx = 0; dx < 2; ++dx)
              tok[ch * 4 + dy * 2 + dx] = src[(ch * h + 2 * py + dy) * w + 2 * px + dx];
          }
        }
      }
    }
  }
  return out;
}

Tensor unpack(const Tensor& t, int64_t h, int64_t w) {
  check_even(h, w, "unpack");
  FLOWKV_CHECK(t.ndim() == 3 && t.dtype() == DType::kF32 && t.dim(1) == (h / 2) * (w / 2) &&
                   t.dim(2) % 4 == 0 && t.dim(2) > 0,
               "unpack: expected f32 [B, ", h / 2, "*", w / 2, ", 4C] tokens, got ",
               shape_str(t.shape()));
  const int64_t b = t.dim(0), c = t.dim(2) / 4, ph = h / 2, pw = w / 2;
  Tensor out = Tensor::empty({b, c, h, w});
  for (int64_t n = 0; n < b; ++n) {
    const float* src = t.f32() + n * c * h * w;
    float* dst = out.f32() + n * c * h * w;
    for (int64_t py = 0; py < ph; ++py) {
      for (int64_t px = 0; px < pw; ++px) {
        const float* tok = src + (py * pw + px) * 4 * c;
        for (int64_t ch = 0; ch < c; ++ch) {
          for (int64_t dy = 0; dy < 2; ++dy) {
            for (int64_t dx = 0; dx < 2; ++dx)
              dst[(ch * h + 2 * py + dy) * w + 2 * px + dx] = tok[ch * 4 + dy * 2 + dx];
          }
        }
      }
    }
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// Weights

namespace {

// An encoder level (its resnets, then the stride-2 downsampler) or a decoder up block (its
// resnets, then the upsampler that halves the channels); no resample on the last level.
struct LevelW {
  std::vector<ResnetW> resnets;
  Conv2d resample;
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

// A CausalConv3d kernel [Cout, Cin, kt, kh, kw] on a single frame after its 2*p causal zero
// frames: only the last time tap meets the frame, so the 2-D kernel is weight[:, :, kt - 1].
Tensor last_time_tap(const Tensor& w) {
  const Tensor f = w.to_f32();
  const int64_t oi = f.dim(0) * f.dim(1), kt = f.dim(2), k2 = f.dim(3) * f.dim(4);
  Tensor out = Tensor::empty({f.dim(0), f.dim(1), f.dim(3), f.dim(4)});
  for (int64_t i = 0; i < oi; ++i)
    std::memcpy(out.f32() + i * k2, f.f32() + (i * kt + kt - 1) * k2, size_t(k2) * 4);
  return out;
}

std::unique_ptr<Vae::Weights> build(const Config& c, const Getter& raw) {
  auto w = std::make_unique<Vae::Weights>();
  const Getter get = [&](const std::string& n) {
    Tensor t = raw(n);
    if (t.ndim() == 5) t = last_time_tap(t);
    w->bytes += t.numel() * 4;  // held as f32
    return t;
  };
  const int64_t n = c.levels(), z = c.z_dim;
  const std::vector<int64_t> enc = encoder_dims(c), dec = decoder_dims(c);
  w->enc_in = load_conv(get, "encoder.conv_in", Conv2dShape::same3x3(c.input_channels, enc[0]));
  for (int64_t i = 0; i < n; ++i) {
    const int64_t in = enc[size_t(i)], out = enc[size_t(i + 1)];
    LevelW l;
    for (int64_t j = 0; j < c.num_res_blocks; ++j)
      l.resnets.push_back(load_resnet(get, down_resnet_name(c, i, j), j == 0 ? in : out, out));
    if (i < n - 1) {
      l.resample =
          load_conv(get, downsampler_name(c, i) + ".resample.1", Conv2dShape::down3x3(out, out));
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
    const int64_t out = dec[size_t(i + 1)];
    LevelW l;
    for (int64_t j = 0; j <= c.num_res_blocks; ++j) {
      l.resnets.push_back(load_resnet(get, p + ".resnets." + std::to_string(j),
                                      j == 0 ? up_block_in(c, i) : out, out));
    }
    if (i < n - 1) {
      l.resample =
          load_conv(get, p + ".upsamplers.0.resample.1", Conv2dShape::same3x3(out, out / 2));
    }
    w->up.push_back(std::move(l));
  }
  w->dec_norm = floats(get("decoder.norm_out.gamma"));
  w->dec_out =
      load_conv(get, "decoder.conv_out", Conv2dShape::same3x3(dec.back(), c.input_channels));
  return w;
}

// The f32 bytes load holds of a table entry: none for the time_convs, 3-D kernels cut to their
// last tap.
int64_t held_bytes_of(const ExpectedTensor& e) {
  if (e.name.find(".time_conv.") != std::string::npos) return 0;
  return shape_numel(e.shape) / (e.shape.size() == 5 ? e.shape[2] : 1) * 4;
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
               format_problems(what + " do not match the Qwen-Image VAE config", problems));
  return Vae(c, build(c, [&](const std::string& n) { return tensors.at(n); }));
}

Vae Vae::load(const std::string& path) {
  const std::string dir = vae_folder(path);
  const CheckpointScan scan = scan_checkpoint(dir);
  FLOWKV_CHECK(!scan.gguf && (scan.config.has_value() || scan.single_file), dir,
               ": expected a diffusers VAE folder (config.json and safetensors) or a .safetensors "
               "file");
  // A lone file under diffusers names has no config: the class defaults (the released VAE).
  const Config c =
      scan.single_file ? Config{} : Config::from_json(*scan.config, dir + "/config.json");
  const auto problems = check_weights(scan.tensors, c);
  FLOWKV_CHECK(
      problems.empty(),
      format_problems(dir + ": the weights do not match config.json (AutoencoderKLQwenImage)",
                      problems));
  check_weights_fit(weight_table(c), held_bytes_of, "the Qwen-Image VAE (f32)");
  CheckpointReader reader(scan);
  return Vae(c, build(c, [&](const std::string& n) { return reader.get(n); }));
}

int64_t Vae::weight_bytes() const {
  return w_->bytes;
}

// ---------------------------------------------------------------------------------------------
// Forward

namespace {

// Encoder + quant_conv of one image [C, H, W] channels-first -> moments [h, w, 2z]. Traced
// under diffusers' module names: every entry of the flat encoder.down_blocks list.
Act encode_frame(const ExecContext& ctx, const Vae::Weights& w, const Config& c, const float* img,
                 int64_t h, int64_t wd, BatchTrace& tr, int64_t b) {
  Act x = conv(ctx, w.enc_in, channels_last(img, c.input_channels, h, wd));
  tr.add("encoder.conv_in", x, b);
  for (size_t i = 0; i < w.down.size(); ++i) {
    const LevelW& l = w.down[i];
    for (size_t j = 0; j < l.resnets.size(); ++j) {
      x = resnet(ctx, l.resnets[j], std::move(x));
      tr.add(down_resnet_name(c, int64_t(i), int64_t(j)), x, b);
    }
    if (!l.resample.empty()) {
      x = conv(ctx, l.resample, x);
      tr.add(downsampler_name(c, int64_t(i)), x, b);
    }
  }
  x = mid(ctx, w.enc_mid, std::move(x), tr, "encoder.mid_block", b);
  norm(ctx, x, x, w.enc_norm, true);
  x = conv(ctx, w.enc_out, x);
  tr.add("encoder.conv_out", x, b);
  x = conv(ctx, w.quant, x);
  tr.add("quant_conv", x, b);
  return x;
}

// post_quant_conv + decoder of one latent [h, w, z] -> image [8h, 8w, C], not clamped.
Act decode_frame(const ExecContext& ctx, const Vae::Weights& w, Act x, BatchTrace& tr, int64_t b) {
  x = conv(ctx, w.post_quant, x);
  tr.add("post_quant_conv", x, b);
  x = conv(ctx, w.dec_in, x);
  tr.add("decoder.conv_in", x, b);
  x = mid(ctx, w.dec_mid, std::move(x), tr, "decoder.mid_block", b);
  for (size_t i = 0; i < w.up.size(); ++i) {
    const LevelW& l = w.up[i];
    for (const ResnetW& r : l.resnets) x = resnet(ctx, r, std::move(x));
    if (!l.resample.empty()) x = upsample_conv(ctx, l.resample, x);
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
  g.in_channels = c.input_channels;
  g.out_channels = c.input_channels;
  g.z_dim = c.z_dim;
  g.factor = c.scale_factor();
  // The widest activation per resolution, full resolution first. Encoder level r: enc[r] ->
  // enc[r + 1]. Decoder up block i runs at resolution L - 1 - i, from up_block_in(i) to
  // dec[i + 1] channels (its upsampler's half lands where the next block reads it).
  const std::vector<int64_t> enc = encoder_dims(c), dec = decoder_dims(c);
  const int64_t nl = c.levels();
  g.decoder_by_res.resize(size_t(nl));
  for (int64_t r = 0; r < nl; ++r) {
    g.encoder_by_res.push_back(std::max(enc[size_t(r)], enc[size_t(r + 1)]));
    g.decoder_by_res[size_t(nl - 1 - r)] = std::max(up_block_in(c, r), dec[size_t(r + 1)]);
  }
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
  const bool rgba = img.ndim() == 4 && img.dim(1) == 4 && cfg_.input_channels == 3;
  return rgba ? " (the Qwen-Image VAE reads RGB: drop alpha)" : "";
}

}  // namespace flowkv::qwen_vae
