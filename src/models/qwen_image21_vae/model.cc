// The Qwen-Image-2.1 VAE forward on one frame, read as diffusers' QwenImage21Encoder3d /
// QwenImage21Decoder3d / AutoencoderKLQwenImage21 read with an empty feature cache.
#include "models/qwen_image21_vae/model.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>

#include "core/arena.h"
#include "core/checked.h"
#include "core/memory.h"
#include "core/parallel.h"
#include "flowkv/error.h"
#include "flowkv/limits.h"
#include "io/checkpoint.h"
#include "models/common/vae_files.h"
#include "models/qwen_image21_vae/weights.h"
#include "ops/attention.h"
#include "ops/conv.h"

namespace flowkv::qwen21_vae {

using ops::Conv2d;
using ops::Conv2dShape;

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

struct ResnetW {
  std::vector<float> g1, g2;  // RMS-norm gammas
  Conv2d c1, c2, shortcut;
};
struct AttnW {
  std::vector<float> norm;
  Conv2d q, k, v, proj;
};
struct MidW {
  ResnetW r0, r1;
  AttnW attn;
};
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

using Getter = std::function<Tensor(const std::string&)>;

std::vector<float> floats(const Tensor& t) {
  const Tensor f = t.to_f32();
  return {f.f32(), f.f32() + f.numel()};
}

Conv2d load_conv(const Getter& get, const std::string& p, const Conv2dShape& s) {
  return Conv2d(get(p + ".weight"), get(p + ".bias"), s);
}

ResnetW load_resnet(const Getter& get, const std::string& p, int64_t cin, int64_t cout) {
  ResnetW r;
  r.g1 = floats(get(p + ".norm1.gamma"));
  r.c1 = load_conv(get, p + ".conv1", Conv2dShape::same3x3(cin, cout));
  r.g2 = floats(get(p + ".norm2.gamma"));
  r.c2 = load_conv(get, p + ".conv2", Conv2dShape::same3x3(cout, cout));
  if (cin != cout)
    r.shortcut = load_conv(get, p + ".conv_shortcut", Conv2dShape::pointwise(cin, cout));
  return r;
}

// Rows [i*c, (i+1)*c) of a [3c, ...] tensor, as its own tensor.
Tensor rows(const Tensor& t, int64_t i, int64_t c) {
  const Tensor f = t.to_f32();
  const int64_t per = f.numel() / f.dim(0);
  std::vector<float> v(f.f32() + i * c * per, f.f32() + (i + 1) * c * per);
  Shape s = f.shape();
  s[0] = c;
  return Tensor::from_vector(v, s);
}

MidW load_mid(const Getter& get, const std::string& p, int64_t c) {
  MidW m;
  m.r0 = load_resnet(get, p + ".resnets.0", c, c);
  const std::string a = p + ".attentions.0";
  m.attn.norm = floats(get(a + ".norm.gamma"));
  // to_qkv's output channels are q, k, v in turn (qkv.chunk(3, dim=-1) after the permute).
  const Tensor w = get(a + ".to_qkv.weight"), b = get(a + ".to_qkv.bias");
  m.attn.q = Conv2d(rows(w, 0, c), rows(b, 0, c), Conv2dShape::pointwise(c, c));
  m.attn.k = Conv2d(rows(w, 1, c), rows(b, 1, c), Conv2dShape::pointwise(c, c));
  m.attn.v = Conv2d(rows(w, 2, c), rows(b, 2, c), Conv2dShape::pointwise(c, c));
  m.attn.proj = load_conv(get, a + ".proj", Conv2dShape::pointwise(c, c));
  m.r1 = load_resnet(get, p + ".resnets.1", c, c);
  return m;
}

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

}  // namespace

Vae::Vae(Config c, std::unique_ptr<Weights> w) : cfg_(std::move(c)), w_(std::move(w)) {}
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

// One channels-last activation [h, w, c].
struct Act {
  std::unique_ptr<float[]> d;
  int64_t h = 0, w = 0, c = 0;
  static Act make(int64_t h, int64_t w, int64_t c) {
    Act a;
    a.d.reset(new float[static_cast<size_t>(checked_numel({h, w, c}, "VAE activation"))]);
    a.h = h;
    a.w = w;
    a.c = c;
    return a;
  }
  float* p() const { return d.get(); }
  int64_t hw() const { return h * w; }
};

// Per-image intermediates gathered into [B, C, H, W] tensors for the tracer.
class BatchTrace {
 public:
  BatchTrace(Tracer* tracer, int64_t batch) : tracer_(tracer), batch_(batch) {}
  void add(const std::string& name, const Act& a, int64_t b) {
    if (!tracer_ || !tracer_->wants(name)) return;
    Tensor& t = got_[name];
    if (!t.defined()) t = Tensor::zeros({batch_, a.c, a.h, a.w});
    ops::to_channels_first(a.p(), a.hw(), a.c, t.f32() + b * a.c * a.hw());
  }
  void flush() {
    for (auto& [name, t] : got_) tracer_->record(name, t);
    got_.clear();
  }

 private:
  Tracer* tracer_;
  int64_t batch_;
  std::map<std::string, Tensor> got_;
};

Act conv(const ExecContext& ctx, const Conv2d& cv, const Act& x) {
  const Conv2dShape& s = cv.shape();
  Act y = Act::make(s.out_h(x.h), s.out_w(x.w), s.out_channels);
  cv.forward(ctx, x.p(), x.h, x.w, y.p());
  return y;
}

void norm(const ExecContext& ctx, const Act& x, const Act& y, const std::vector<float>& gamma,
          bool silu) {
  ops::rms_norm_channels(ctx, x.p(), y.p(), x.hw(), x.c, gamma.data(), silu);
}

void add_into(Act& y, const Act& x) {
  const int64_t n = y.hw() * y.c, per = 1 << 16;
  parallel_for_on(n < (1 << 20) ? 1 : num_threads(), (n + per - 1) / per, [&](int64_t t) {
    const int64_t i1 = std::min(n, (t + 1) * per);
    for (int64_t i = t * per; i < i1; ++i) y.d[size_t(i)] = y.d[size_t(i)] + x.d[size_t(i)];
  });
}

// QwenImage21ResidualBlock: shortcut(x) + conv2(SiLU(norm2(conv1(SiLU(norm1(x)))))).
Act resnet(const ExecContext& ctx, const ResnetW& r, Act x) {
  Act skip, u;
  if (!r.shortcut.empty()) {
    skip = conv(ctx, r.shortcut, x);
    norm(ctx, x, x, r.g1, true);
    u = conv(ctx, r.c1, x);
  } else {
    Act t = Act::make(x.h, x.w, x.c);
    norm(ctx, x, t, r.g1, true);
    u = conv(ctx, r.c1, t);
    skip = std::move(x);
  }
  x = Act();
  norm(ctx, u, u, r.g2, true);
  Act out = conv(ctx, r.c2, u);
  u = Act();
  add_into(out, skip);
  return out;
}

// QwenImage21AttentionBlock: RMS norm, one head of width C over the h*w pixels (SDPA's scale
// 1/sqrt(C)), output projection, residual.
Act attention(const ExecContext& ctx, const AttnW& a, const Act& x) {
  Act q, k, v;
  {
    Act n = Act::make(x.h, x.w, x.c);
    norm(ctx, x, n, a.norm, false);
    q = conv(ctx, a.q, n);
    k = conv(ctx, a.k, n);
    v = conv(ctx, a.v, n);
  }
  const int64_t hw = x.hw(), c = x.c;
  Act o = Act::make(x.h, x.w, c);
  ops::AttnShape s{.batch = 1, .heads = 1, .head_dim = c, .seq_q = hw};
  const ops::KVSource src = ops::KVSource::f32(make_mat(k.p(), hw, c), make_mat(v.p(), hw, c), hw);
  ops::attention(ctx, s, make_mat(q.p(), hw, c), {&src, 1}, make_mat(o.p(), hw, c));
  q = Act();
  k = Act();
  v = Act();
  Act out = conv(ctx, a.proj, o);
  add_into(out, x);
  return out;
}

Act mid(const ExecContext& ctx, const MidW& m, Act x, BatchTrace& tr, const std::string& p,
        int64_t b) {
  x = resnet(ctx, m.r0, std::move(x));
  tr.add(p + ".resnets.0", x, b);
  x = attention(ctx, m.attn, x);
  tr.add(p + ".attentions.0", x, b);
  x = resnet(ctx, m.r1, std::move(x));
  tr.add(p, x, b);
  return x;
}

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

Act channels_last(const float* chw, int64_t c, int64_t h, int64_t w) {
  Act a = Act::make(h, w, c);
  ops::to_channels_last(chw, c, h * w, a.p());
  return a;
}

// Encoder + quant_conv of one image [C_in, H, W] channels-first -> moments [h, w, 2z].
Act encode_one(const ExecContext& ctx, const Vae::Weights& w, const Config& c, const float* img,
               int64_t h, int64_t wd, BatchTrace& tr, int64_t b) {
  Act x = conv(ctx, w.enc_in, channels_last(img, c.in_channels, h, wd));
  tr.add("encoder.conv_in", x, b);
  for (size_t i = 0; i < w.down.size(); ++i) {
    const LevelW& l = w.down[i];
    Act copy = Act::make(x.h, x.w, x.c);
    std::memcpy(copy.p(), x.p(), size_t(x.hw() * x.c) * 4);
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
Act decode_one(const ExecContext& ctx, const Vae::Weights& w, Act x, BatchTrace& tr, int64_t b) {
  x = conv(ctx, w.post_quant, x);
  tr.add("post_quant_conv", x, b);
  x = conv(ctx, w.dec_in, x);
  tr.add("decoder.conv_in", x, b);
  x = mid(ctx, w.dec_mid, std::move(x), tr, "decoder.mid_block", b);
  for (size_t i = 0; i < w.up.size(); ++i) {
    const LevelW& l = w.up[i];
    Act copy;
    if (l.spatial) {
      copy = Act::make(x.h, x.w, x.c);
      std::memcpy(copy.p(), x.p(), size_t(x.hw() * x.c) * 4);
    }
    for (const ResnetW& r : l.resnets) x = resnet(ctx, r, std::move(x));
    if (!l.resample.empty()) {
      // Upsample nearest-exact 2x (for a factor of 2 the same as nearest), then a 3x3 conv
      // reading the small image in place.
      Act y = Act::make(2 * x.h, 2 * x.w, l.resample.shape().out_channels);
      l.resample.forward(ctx, x.p(), x.h, x.w, y.p(), /*upsample2x=*/true);
      x = std::move(y);
    }
    if (l.spatial) add_dup_up(x, copy, l.factor_t);
    tr.add("decoder.up_blocks." + std::to_string(i), x, b);
  }
  norm(ctx, x, x, w.dec_norm, true);
  x = conv(ctx, w.dec_out, x);
  tr.add("decoder", x, b);
  return x;
}

void clamp_unit(float* p, int64_t n) {
  for (int64_t i = 0; i < n; ++i) p[i] = std::clamp(p[i], -1.0f, 1.0f);
}

// Rough peak bytes of a forward: five activations of the widest level.
int64_t activation_bytes(const std::vector<int64_t>& ch_by_res, int64_t h, int64_t w) {
  int64_t peak = 0;
  for (size_t i = 0; i < ch_by_res.size(); ++i) {
    const int64_t s = int64_t{1} << i;
    const int64_t px = checked_mul(h / s + 1, w / s + 1, "VAE activation size");
    peak = std::max(peak, checked_mul(checked_mul(px, ch_by_res[i], "VAE activation size"), 20,
                                      "VAE activation bytes"));
  }
  return peak;
}

}  // namespace

void Vae::check_image(const Tensor& img, const std::string& what) const {
  const int64_t m = cfg_.scale_factor();
  FLOWKV_CHECK(img.ndim() == 4 && img.dtype() == DType::kF32 && img.dim(1) == cfg_.in_channels,
               what, ": expected an f32 image batch [B, ", cfg_.in_channels, ", H, W], got ",
               shape_str(img.shape()),
               img.ndim() == 4 && img.dim(1) == 3 && cfg_.in_channels == 4
                   ? " (the Qwen-Image-2.1 VAE reads RGBA: add alpha)"
                   : "");
  const int64_t h = img.dim(2), w = img.dim(3);
  FLOWKV_CHECK(img.dim(0) >= 1 && h > 0 && w > 0, what, ": empty image batch ",
               shape_str(img.shape()));
  FLOWKV_CHECK(h <= limits::kMaxImageSide && w <= limits::kMaxImageSide, what, ": ", w, "x", h,
               " is larger than the limit of ", limits::kMaxImageSide, " pixels per side");
  FLOWKV_CHECK(h % m == 0 && w % m == 0, what, ": ", w, "x", h, " is not a multiple of ", m,
               " pixels per side (the VAE's /", m, "); resize or crop it first");
}

void Vae::check_latents(const Tensor& z, const std::string& what) const {
  const int64_t c = cfg_.z_dim, f = cfg_.scale_factor();
  FLOWKV_CHECK(z.ndim() == 4 && z.dtype() == DType::kF32 && z.dim(1) == c && z.dim(0) >= 1 &&
                   z.dim(2) >= 1 && z.dim(3) >= 1,
               what, ": expected f32 latents [B, ", c, ", h, w], got ", shape_str(z.shape()));
  FLOWKV_CHECK(z.dim(2) <= limits::kMaxImageSide / f && z.dim(3) <= limits::kMaxImageSide / f, what,
               ": a ", z.dim(3) * f, "x", z.dim(2) * f, " image is larger than the limit of ",
               limits::kMaxImageSide, " pixels per side");
}

Tensor Vae::encode_moments(const ExecContext& ctx0, const Tensor& img) const {
  check_image(img, "VAE encode input");
  const int64_t bsz = img.dim(0), h = img.dim(2), w = img.dim(3), f = cfg_.scale_factor();
  // Channels per resolution, full resolution first: level r's resnets widen enc[r] to enc[r+1].
  const std::vector<int64_t> enc = encoder_dims(cfg_);
  std::vector<int64_t> by_res;
  for (size_t r = 0; r + 1 < enc.size(); ++r) by_res.push_back(std::max(enc[r], enc[r + 1]));
  check_memory(activation_bytes(by_res, h, w),
               "VAE encode of a " + std::to_string(w) + "x" + std::to_string(h) + " image",
               "use a smaller image");
  Arena arena;
  ExecContext ctx = ctx0;
  if (!ctx.arena) ctx.arena = &arena;
  BatchTrace tr(ctx.tracer, bsz);
  const int64_t c2 = 2 * cfg_.z_dim, hw = (h / f) * (w / f);
  Tensor out = Tensor::empty({bsz, c2, h / f, w / f});
  for (int64_t b = 0; b < bsz; ++b) {
    Act m = encode_one(ctx, *w_, cfg_, img.f32() + b * cfg_.in_channels * h * w, h, w, tr, b);
    ops::to_channels_first(m.p(), hw, c2, out.f32() + b * c2 * hw);
  }
  tr.flush();
  return out;
}

template <class F>
void Vae::per_channel(Tensor& x, F&& f) const {
  check_latents(x, "VAE latents");
  const int64_t c = cfg_.z_dim, hw = x.dim(2) * x.dim(3);
  for (int64_t n = 0; n < x.dim(0) * c; ++n) {
    const float m = cfg_.latents_mean[size_t(n % c)], s = cfg_.latents_std[size_t(n % c)];
    float* p = x.f32() + n * hw;
    for (int64_t i = 0; i < hw; ++i) p[i] = f(p[i], m, s);
  }
}

void Vae::normalize(Tensor& x) const {
  per_channel(x, [](float v, float m, float s) { return (v - m) / s; });
}

void Vae::denormalize(Tensor& x) const {
  per_channel(x, [](float v, float m, float s) { return v * s + m; });
}

Tensor Vae::encode(const ExecContext& ctx, const Tensor& img) const {
  const Tensor moments = encode_moments(ctx, img);
  const int64_t bsz = moments.dim(0), z = cfg_.z_dim, hw = moments.dim(2) * moments.dim(3);
  Tensor x = Tensor::empty({bsz, z, moments.dim(2), moments.dim(3)});
  for (int64_t b = 0; b < bsz; ++b) {
    std::memcpy(x.f32() + b * z * hw, moments.f32() + b * 2 * z * hw, size_t(z * hw) * 4);
  }
  if (ctx.tracer) {
    ctx.tracer->record("moments", moments);
    ctx.tracer->record("mode", x.clone());
  }
  normalize(x);
  if (ctx.tracer) ctx.tracer->record("normalized", x);
  return x;
}

Tensor Vae::decode(const ExecContext& ctx, const Tensor& latents, const DecodeOptions& o) const {
  check_latents(latents, "VAE decode input");
  Tensor x = latents.clone();
  denormalize(x);
  if (ctx.tracer) ctx.tracer->record("denormalized", x);
  Tensor img = decode_z(ctx, x, o);
  if (ctx.tracer) ctx.tracer->record("image", img);
  return img;
}

namespace {

// b[y] = a[a_h - e + y] * (1 - y/e) + b[y] * (y/e) for y < e (blend_v; a: the tile above), on
// channels-first tiles [c, h, w]; the weights are doubles rounded to f32, as torch multiplies
// an f32 tensor by a Python float.
void blend_v(const std::vector<float>& a, int64_t a_h, std::vector<float>& b, int64_t b_h,
             int64_t wd, int64_t c, int64_t extent) {
  const int64_t e = std::min({a_h, b_h, extent});
  for (int64_t ch = 0; ch < c; ++ch) {
    for (int64_t y = 0; y < e; ++y) {
      const float wb = static_cast<float>(double(y) / double(e)),
                  wa = static_cast<float>(1.0 - double(y) / double(e));
      const float* ar = a.data() + (ch * a_h + a_h - e + y) * wd;
      float* br = b.data() + (ch * b_h + y) * wd;
      for (int64_t x = 0; x < wd; ++x) br[x] = ar[x] * wa + br[x] * wb;
    }
  }
}

// The same across columns (blend_h; a: the tile to the left, of the same height).
void blend_h(const std::vector<float>& a, int64_t a_w, std::vector<float>& b, int64_t h,
             int64_t b_w, int64_t c, int64_t extent) {
  const int64_t e = std::min({a_w, b_w, extent});
  for (int64_t ch = 0; ch < c; ++ch) {
    for (int64_t y = 0; y < h; ++y) {
      const float* ar = a.data() + (ch * h + y) * a_w + a_w - e;
      float* br = b.data() + (ch * h + y) * b_w;
      for (int64_t x = 0; x < e; ++x) {
        const float wb = static_cast<float>(double(x) / double(e)),
                    wa = static_cast<float>(1.0 - double(x) / double(e));
        br[x] = ar[x] * wa + br[x] * wb;
      }
    }
  }
}

struct Tile {
  std::vector<float> px;  // [c, h, w], blended
  int64_t h = 0, w = 0;
};

}  // namespace

Tensor Vae::decode_z(const ExecContext& ctx0, const Tensor& z, const DecodeOptions& o) const {
  check_latents(z, "VAE decode");
  const int64_t l = cfg_.z_dim, f = cfg_.scale_factor(), co = cfg_.out_channels;
  const int64_t bsz = z.dim(0), h = z.dim(2), w = z.dim(3), oh = h * f, ow = w * f;
  bool tiled = false;
  int64_t tlh = 0, tlw = 0, tsh = 0, tsw = 0;  // tile latent size, tile stride latent
  if (o.tiled) {
    for (int64_t v : {o.tile_sample_min_height, o.tile_sample_min_width,
                      o.tile_sample_stride_height, o.tile_sample_stride_width}) {
      FLOWKV_CHECK(v >= f && v <= limits::kMaxImageSide && v % f == 0,
                   "VAE tiled decode: tile sizes and strides must be multiples of ", f,
                   " pixels, got ", v);
    }
    FLOWKV_CHECK(o.tile_sample_stride_height <= o.tile_sample_min_height &&
                     o.tile_sample_stride_width <= o.tile_sample_min_width,
                 "VAE tiled decode: a tile stride larger than the tile leaves gaps");
    tlh = o.tile_sample_min_height / f;
    tlw = o.tile_sample_min_width / f;
    tsh = o.tile_sample_stride_height / f;
    tsw = o.tile_sample_stride_width / f;
    tiled = w > tlw || h > tlh;
  }
  // Channels per resolution, full resolution first: at resolution r the up block that
  // upsamples into it writes dec[L - r - 1] channels and the next one narrows them to dec[L - r].
  const std::vector<int64_t> dec = decoder_dims(cfg_);
  const int64_t nl = cfg_.levels();
  std::vector<int64_t> by_res;
  for (int64_t r = 0; r < nl; ++r)
    by_res.push_back(std::max(dec[size_t(nl - r)], dec[size_t(nl - r - 1)]));
  const int64_t sh = tiled ? std::min(h, tlh) : h, sw = tiled ? std::min(w, tlw) : w;
  check_memory(checked_add(activation_bytes(by_res, sh * f, sw * f),
                           checked_mul(bsz * co, oh * ow * 4, "VAE image bytes"), "VAE decode"),
               "VAE decode of a " + std::to_string(ow) + "x" + std::to_string(oh) + " image",
               tiled ? "use smaller tiles" : "decode in tiles (DecodeOptions.tiled)");
  Arena arena;
  ExecContext ctx = ctx0;
  if (!ctx.arena) ctx.arena = &arena;
  Tensor out = Tensor::empty({bsz, co, oh, ow});
  BatchTrace tr(ctx.tracer, bsz);
  for (int64_t b = 0; b < bsz; ++b) {
    const float* zb = z.f32() + b * l * h * w;
    float* ob = out.f32() + b * co * oh * ow;
    if (!tiled) {
      Act img = decode_one(ctx, *w_, channels_last(zb, l, h, w), tr, b);
      ops::to_channels_first(img.p(), img.hw(), co, ob);
      continue;
    }
    BatchTrace none(nullptr, 1);
    const int64_t blend_hgt = o.tile_sample_min_height - o.tile_sample_stride_height;
    const int64_t blend_wid = o.tile_sample_min_width - o.tile_sample_stride_width;
    std::vector<Tile> above;  // the previous row of blended tiles
    for (int64_t ty = 0, ti = 0; ty < h; ty += tsh, ++ti) {
      std::vector<Tile> row;
      for (int64_t tx = 0, tj = 0; tx < w; tx += tsw, ++tj) {
        const int64_t th = std::min(tlh, h - ty), tw = std::min(tlw, w - tx);
        Act zt = Act::make(th, tw, l);
        for (int64_t y = 0; y < th; ++y) {
          for (int64_t x = 0; x < tw; ++x) {
            for (int64_t ch = 0; ch < l; ++ch)
              zt.d[size_t((y * tw + x) * l + ch)] = zb[(ch * h + ty + y) * w + tx + x];
          }
        }
        Act d = decode_one(ctx, *w_, std::move(zt), none, 0);
        Tile t;
        t.h = th * f;
        t.w = tw * f;
        t.px.resize(static_cast<size_t>(co * t.h * t.w));
        ops::to_channels_first(d.p(), t.h * t.w, co, t.px.data());
        d = Act();
        if (ti > 0) {
          const Tile& a = above[size_t(tj)];
          FLOWKV_CHECK(a.w == t.w, "VAE tiled decode: tile widths differ between rows");
          blend_v(a.px, a.h, t.px, t.h, t.w, co, blend_hgt);
        }
        if (tj > 0) {
          const Tile& a = row.back();
          blend_h(a.px, a.w, t.px, t.h, t.w, co, blend_wid);
        }
        // Crop [:stride, :stride] into place (the last row and column are cut to the image).
        const int64_t y0 = ti * o.tile_sample_stride_height, x0 = tj * o.tile_sample_stride_width;
        const int64_t ch_h = std::min({o.tile_sample_stride_height, t.h, oh - y0}),
                      ch_w = std::min({o.tile_sample_stride_width, t.w, ow - x0});
        for (int64_t ch = 0; ch < co; ++ch) {
          for (int64_t y = 0; y < ch_h; ++y) {
            std::memcpy(ob + (ch * oh + y0 + y) * ow + x0, t.px.data() + (ch * t.h + y) * t.w,
                        size_t(ch_w) * 4);
          }
        }
        row.push_back(std::move(t));
      }
      above = std::move(row);
    }
  }
  tr.flush();
  clamp_unit(out.f32(), out.numel());
  return out;
}

}  // namespace flowkv::qwen21_vae
