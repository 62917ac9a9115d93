// The FLUX.2 VAE forward, read as diffusers' Encoder / Decoder / AutoencoderKLFlux2 read.
#include "models/flux2_vae/model.h"

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
#include "models/flux2_vae/weights.h"
#include "ops/attention.h"
#include "ops/conv.h"

namespace flowkv::flux2_vae {

using ops::Conv2d;
using ops::Conv2dShape;

// ---------------------------------------------------------------------------------------------
// Latent layout helpers (the pipeline's _patchify_latents, _unpatchify_latents, _pack_latents)

Tensor patchify(const Tensor& z) {
  FLOWKV_CHECK(z.ndim() == 4 && z.dtype() == DType::kF32 && z.dim(2) % 2 == 0 && z.dim(3) % 2 == 0,
               "patchify: expected f32 [B, C, H, W] with even H and W, got ", shape_str(z.shape()));
  const int64_t b = z.dim(0), c = z.dim(1), h = z.dim(2), w = z.dim(3);
  Tensor out = Tensor::empty({b, 4 * c, h / 2, w / 2});
  const float* s = z.f32();
  float* d = out.f32();
  for (int64_t n = 0; n < b * c; ++n) {
    for (int64_t dy = 0; dy < 2; ++dy) {
      for (int64_t dx = 0; dx < 2; ++dx) {
        float* o = d + (n * 4 + dy * 2 + dx) * (h / 2) * (w / 2);
        for (int64_t y = 0; y < h / 2; ++y) {
          for (int64_t x = 0; x < w / 2; ++x)
            o[y * (w / 2) + x] = s[(n * h + 2 * y + dy) * w + 2 * x + dx];
        }
      }
    }
  }
  return out;
}

Tensor unpatchify(const Tensor& x) {
  FLOWKV_CHECK(x.ndim() == 4 && x.dtype() == DType::kF32 && x.dim(1) % 4 == 0,
               "unpatchify: expected f32 [B, 4C, h, w], got ", shape_str(x.shape()));
  const int64_t b = x.dim(0), c = x.dim(1) / 4, h = x.dim(2), w = x.dim(3);
  Tensor out = Tensor::empty({b, c, 2 * h, 2 * w});
  const float* s = x.f32();
  float* d = out.f32();
  for (int64_t n = 0; n < b * c; ++n) {
    for (int64_t dy = 0; dy < 2; ++dy) {
      for (int64_t dx = 0; dx < 2; ++dx) {
        const float* i = s + (n * 4 + dy * 2 + dx) * h * w;
        for (int64_t y = 0; y < h; ++y) {
          for (int64_t xx = 0; xx < w; ++xx)
            d[(n * 2 * h + 2 * y + dy) * 2 * w + 2 * xx + dx] = i[y * w + xx];
        }
      }
    }
  }
  return out;
}

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

struct NormW {
  std::vector<float> gamma, beta;
};
struct ResnetW {
  NormW n1, n2;
  Conv2d c1, c2, shortcut;
};
struct AttnW {
  NormW norm;
  Conv2d q, k, v, out;
};
struct MidW {
  ResnetW r0, r1;
  bool has_attn = false;
  AttnW attn;
};
struct StageW {
  std::vector<ResnetW> resnets;
  Conv2d resample;  // downsampler (encoder) or upsampler's conv (decoder); empty on the last
};

}  // namespace

struct Vae::Weights {
  Conv2d enc_in, enc_out, quant, post_quant, dec_in, dec_out;
  std::vector<StageW> down, up;
  MidW enc_mid, dec_mid;
  NormW enc_norm, dec_norm;
  std::vector<float> bn_mean, bn_std;
  int64_t bytes = 0;
};

namespace {

using Getter = std::function<Tensor(const std::string&)>;

std::vector<float> floats(const Tensor& t) {
  const Tensor f = t.to_f32();
  return {f.f32(), f.f32() + f.numel()};
}

NormW load_norm(const Getter& get, const std::string& p) {
  return {floats(get(p + ".weight")), floats(get(p + ".bias"))};
}

Conv2d load_conv(const Getter& get, const std::string& p, const Conv2dShape& s) {
  return Conv2d(get(p + ".weight"), get(p + ".bias"), s);
}

ResnetW load_resnet(const Getter& get, const std::string& p, int64_t cin, int64_t cout) {
  ResnetW r;
  r.n1 = load_norm(get, p + ".norm1");
  r.c1 = load_conv(get, p + ".conv1", Conv2dShape::same3x3(cin, cout));
  r.n2 = load_norm(get, p + ".norm2");
  r.c2 = load_conv(get, p + ".conv2", Conv2dShape::same3x3(cout, cout));
  if (cin != cout)
    r.shortcut = load_conv(get, p + ".conv_shortcut", Conv2dShape::pointwise(cin, cout));
  return r;
}

MidW load_mid(const Getter& get, const std::string& p, int64_t c, bool attn) {
  MidW m;
  m.r0 = load_resnet(get, p + ".resnets.0", c, c);
  m.has_attn = attn;
  if (attn) {
    const std::string a = p + ".attentions.0";
    m.attn.norm = load_norm(get, a + ".group_norm");
    auto lin = [&](const char* n) {
      return Conv2d::from_linear(get(a + n + ".weight"), get(a + n + ".bias"));
    };
    m.attn.q = lin(".to_q");
    m.attn.k = lin(".to_k");
    m.attn.v = lin(".to_v");
    m.attn.out = lin(".to_out.0");
  }
  m.r1 = load_resnet(get, p + ".resnets.1", c, c);
  return m;
}

}  // namespace

Vae::Vae(Config c, std::unique_ptr<Weights> w) : cfg_(std::move(c)), w_(std::move(w)) {}
Vae::Vae(Vae&&) noexcept = default;
Vae& Vae::operator=(Vae&&) noexcept = default;
Vae::~Vae() = default;

static std::unique_ptr<Vae::Weights> build(const Config& c, const Getter& get);

Vae Vae::from_tensors(const Config& c, const std::map<std::string, Tensor>& tensors,
                      const std::string& what) {
  c.validate(what);
  const auto problems = check_weights(tensor_infos(tensors), c);
  FLOWKV_CHECK(problems.empty(),
               format_problems(what + " do not match the FLUX.2 VAE config", problems));
  return Vae(c, build(c, [&](const std::string& n) { return tensors.at(n); }));
}

Vae Vae::load(const std::string& path) {
  const std::string dir = vae_folder(path);
  const CheckpointScan scan = scan_checkpoint(dir);
  FLOWKV_CHECK(scan.config.has_value() && !scan.single_file, dir,
               ": expected a diffusers VAE folder (config.json and safetensors)");
  const Config c = Config::from_json(*scan.config, dir + "/config.json");
  const auto problems = check_weights(scan.tensors, c);
  FLOWKV_CHECK(problems.empty(),
               format_problems(dir + ": the weights do not match config.json (AutoencoderKLFlux2)",
                               problems));
  check_weights_fit(
      weight_table(c), [](const ExpectedTensor& e) { return shape_numel(e.shape) * 4; },
      "the FLUX.2 VAE (f32)");
  CheckpointReader reader(scan);
  return Vae(c, build(c, [&](const std::string& n) { return reader.get(n); }));
}

static std::unique_ptr<Vae::Weights> build(const Config& c, const Getter& get) {
  auto w = std::make_unique<Vae::Weights>();
  const auto& ch = c.block_out_channels;
  const int64_t n = c.num_blocks(), lat = c.latent_channels;
  w->enc_in = load_conv(get, "encoder.conv_in", Conv2dShape::same3x3(c.in_channels, ch[0]));
  for (int64_t i = 0; i < n; ++i) {
    const std::string p = "encoder.down_blocks." + std::to_string(i);
    const int64_t in = i == 0 ? ch[0] : ch[size_t(i - 1)], out = ch[size_t(i)];
    StageW s;
    for (int64_t j = 0; j < c.layers_per_block; ++j) {
      s.resnets.push_back(
          load_resnet(get, p + ".resnets." + std::to_string(j), j == 0 ? in : out, out));
    }
    if (i < n - 1)
      s.resample = load_conv(get, p + ".downsamplers.0.conv", Conv2dShape::down3x3(out, out));
    w->down.push_back(std::move(s));
  }
  w->enc_mid = load_mid(get, "encoder.mid_block", ch.back(), c.mid_block_add_attention);
  w->enc_norm = load_norm(get, "encoder.conv_norm_out");
  w->enc_out = load_conv(get, "encoder.conv_out", Conv2dShape::same3x3(ch.back(), 2 * lat));
  if (c.use_quant_conv)
    w->quant = load_conv(get, "quant_conv", Conv2dShape::pointwise(2 * lat, 2 * lat));
  if (c.use_post_quant_conv) {
    w->post_quant = load_conv(get, "post_quant_conv", Conv2dShape::pointwise(lat, lat));
  }
  const auto& dc = c.decoder_channels();
  const std::vector<int64_t> rev(dc.rbegin(), dc.rend());
  w->dec_in = load_conv(get, "decoder.conv_in", Conv2dShape::same3x3(lat, rev[0]));
  w->dec_mid = load_mid(get, "decoder.mid_block", rev[0], c.mid_block_add_attention);
  for (int64_t i = 0; i < n; ++i) {
    const std::string p = "decoder.up_blocks." + std::to_string(i);
    const int64_t in = i == 0 ? rev[0] : rev[size_t(i - 1)], out = rev[size_t(i)];
    StageW s;
    for (int64_t j = 0; j <= c.layers_per_block; ++j) {
      s.resnets.push_back(
          load_resnet(get, p + ".resnets." + std::to_string(j), j == 0 ? in : out, out));
    }
    if (i < n - 1)
      s.resample = load_conv(get, p + ".upsamplers.0.conv", Conv2dShape::same3x3(out, out));
    w->up.push_back(std::move(s));
  }
  w->dec_norm = load_norm(get, "decoder.conv_norm_out");
  w->dec_out = load_conv(get, "decoder.conv_out", Conv2dShape::same3x3(dc[0], c.out_channels));
  w->bn_mean = floats(get("bn.running_mean"));
  const std::vector<float> var = floats(get("bn.running_var"));
  const float eps = static_cast<float>(c.batch_norm_eps);
  for (float v : var) {
    FLOWKV_CHECK(std::isfinite(v) && v + eps > 0, "bn.running_var holds ", v,
                 ": the latent normalisation needs non-negative variances");
    w->bn_std.push_back(std::sqrt(v + eps));  // f32, as torch.sqrt(running_var + eps)
  }
  w->bytes = parameter_count(c) * 4;
  return w;
}

int64_t Vae::held_bytes() const {
  return w_->bytes;
}

// ---------------------------------------------------------------------------------------------
// Forward

namespace {

// One channels-last activation [h, w, c] (uninitialised storage; freed with the object).
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
  void add(const char* name, const Act& a, int64_t b) {
    if (!tracer_ || !tracer_->wants(name)) return;
    Tensor& t = got_[name];
    if (!t.defined()) t = Tensor::zeros({batch_, a.c, a.h, a.w});
    ops::to_channels_first(a.p(), a.hw(), a.c, t.f32() + b * a.c * a.hw());
  }
  void add(const std::string& name, const Act& a, int64_t b) { add(name.c_str(), a, b); }
  void flush() {
    for (auto& [name, t] : got_) tracer_->record(name, t);
    got_.clear();
  }

 private:
  Tracer* tracer_;
  int64_t batch_;
  std::map<std::string, Tensor> got_;
};

constexpr float kEps = Config::kGroupNormEps;

Act conv(const ExecContext& ctx, const Conv2d& cv, const Act& x) {
  const Conv2dShape& s = cv.shape();
  Act y = Act::make(s.out_h(x.h), s.out_w(x.w), s.out_channels);
  cv.forward(ctx, x.p(), x.h, x.w, y.p());
  return y;
}

void norm(const ExecContext& ctx, const Act& x, const Act& y, const NormW& n, int64_t groups,
          bool silu) {
  ops::group_norm(ctx, x.p(), y.p(), x.hw(), x.c, n.gamma.data(), n.beta.data(),
                  {.groups = groups, .eps = kEps, .silu = silu});
}

void add_into(Act& y, const Act& x) {
  const int64_t n = y.hw() * y.c, per = 1 << 16;
  parallel_for_on(n < (1 << 20) ? 1 : num_threads(), (n + per - 1) / per, [&](int64_t t) {
    const int64_t i1 = std::min(n, (t + 1) * per);
    for (int64_t i = t * per; i < i1; ++i) y.d[size_t(i)] = x.d[size_t(i)] + y.d[size_t(i)];
  });
}

// ResnetBlock2D: norm1 -> SiLU -> conv1 -> norm2 -> SiLU -> conv2, plus the (projected) input.
// Consumes its input: with a shortcut conv, the projection is taken first and norm1 then runs
// in place, so the block holds input + projection + conv1 output at most (at 1024x1024 the
// decoder's 256 -> 128 block: 2 GiB instead of 2.5 GiB).
Act resnet(const ExecContext& ctx, const ResnetW& r, Act x, int64_t groups) {
  Act skip, u;
  if (!r.shortcut.empty()) {
    skip = conv(ctx, r.shortcut, x);
    norm(ctx, x, x, r.n1, groups, true);
    u = conv(ctx, r.c1, x);
  } else {
    Act t = Act::make(x.h, x.w, x.c);
    norm(ctx, x, t, r.n1, groups, true);
    u = conv(ctx, r.c1, t);
    skip = std::move(x);
  }
  x = Act();
  norm(ctx, u, u, r.n2, groups, true);
  Act out = conv(ctx, r.c2, u);
  u = Act();
  add_into(out, skip);
  return out;
}

// The mid block's Attention (_from_deprecated_attn_block): GroupNorm, one head of width C over
// the h*w pixels, output projection, residual.
Act attention(const ExecContext& ctx, const AttnW& a, const Act& x, int64_t groups) {
  Act q, k, v;
  {
    Act n = Act::make(x.h, x.w, x.c);
    norm(ctx, x, n, a.norm, groups, false);
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
  Act out = conv(ctx, a.out, o);
  add_into(out, x);
  return out;
}

Act mid(const ExecContext& ctx, const MidW& m, Act x, int64_t groups, BatchTrace& tr,
        const std::string& p, int64_t b) {
  x = resnet(ctx, m.r0, std::move(x), groups);
  tr.add(p + ".resnets.0", x, b);
  if (m.has_attn) {
    x = attention(ctx, m.attn, x, groups);
    tr.add(p + ".attentions.0", x, b);
  }
  x = resnet(ctx, m.r1, std::move(x), groups);
  tr.add(p, x, b);
  return x;
}

Act channels_last(const float* chw, int64_t c, int64_t h, int64_t w) {
  Act a = Act::make(h, w, c);
  ops::to_channels_last(chw, c, h * w, a.p());
  return a;
}

}  // namespace

// Encoder + quant_conv of one image: [C_in, H, W] channels-first -> moments [h, w, 2L].
static Act encode_one(const ExecContext& ctx, const Vae::Weights& w, const Config& c,
                      const float* img, int64_t h, int64_t wd, BatchTrace& tr, int64_t b) {
  const int64_t g = c.norm_num_groups;
  Act x = conv(ctx, w.enc_in, channels_last(img, c.in_channels, h, wd));
  tr.add("encoder.conv_in", x, b);
  for (size_t i = 0; i < w.down.size(); ++i) {
    for (const ResnetW& r : w.down[i].resnets) x = resnet(ctx, r, std::move(x), g);
    if (!w.down[i].resample.empty()) x = conv(ctx, w.down[i].resample, x);
    tr.add("encoder.down_blocks." + std::to_string(i), x, b);
  }
  x = mid(ctx, w.enc_mid, std::move(x), g, tr, "encoder.mid_block", b);
  norm(ctx, x, x, w.enc_norm, g, true);
  x = conv(ctx, w.enc_out, x);
  tr.add("encoder.conv_out", x, b);
  if (!w.quant.empty()) {
    x = conv(ctx, w.quant, x);
    tr.add("quant_conv", x, b);
  }
  return x;
}

// post_quant_conv + Decoder of one /8 latent [h, w, L] -> image [h*f, w*f, C_out].
static Act decode_one(const ExecContext& ctx, const Vae::Weights& w, const Config& c, Act x,
                      BatchTrace& tr, int64_t b) {
  const int64_t g = c.norm_num_groups;
  if (!w.post_quant.empty()) {
    x = conv(ctx, w.post_quant, x);
    tr.add("post_quant_conv", x, b);
  }
  x = conv(ctx, w.dec_in, x);
  tr.add("decoder.conv_in", x, b);
  x = mid(ctx, w.dec_mid, std::move(x), g, tr, "decoder.mid_block", b);
  for (size_t i = 0; i < w.up.size(); ++i) {
    for (const ResnetW& r : w.up[i].resnets) x = resnet(ctx, r, std::move(x), g);
    if (!w.up[i].resample.empty()) {
      // Upsample2D: nearest 2x, then a 3x3 conv reading the small image in place.
      const Conv2d& cv = w.up[i].resample;
      Act y = Act::make(2 * x.h, 2 * x.w, cv.shape().out_channels);
      cv.forward(ctx, x.p(), x.h, x.w, y.p(), /*upsample2x=*/true);
      x = std::move(y);
    }
    tr.add("decoder.up_blocks." + std::to_string(i), x, b);
  }
  norm(ctx, x, x, w.dec_norm, g, true);
  return conv(ctx, w.dec_out, x);
}

// ---------------------------------------------------------------------------------------------
// Public entry points

namespace {

// Rough peak bytes of a forward at a resolution: four activations of the widest level (input,
// normed, conv output, output of a resnet) plus attention's q, k, v, o at the deepest level.
int64_t activation_bytes(const std::vector<int64_t>& ch, int64_t h, int64_t w) {
  int64_t peak = 0;
  for (size_t i = 0; i < ch.size(); ++i) {
    const int64_t s = int64_t{1} << i;
    const int64_t px = checked_mul(h / s + 1, w / s + 1, "VAE activation size");
    peak = std::max(peak, checked_mul(checked_mul(px, ch[i], "VAE activation size"), 16,
                                      "VAE activation bytes"));
  }
  return peak;
}

}  // namespace

void Vae::check_image(const Tensor& rgb, const std::string& what) const {
  const int64_t m = cfg_.pixel_multiple();
  FLOWKV_CHECK(rgb.ndim() == 4 && rgb.dtype() == DType::kF32 && rgb.dim(1) == cfg_.in_channels,
               what, ": expected an f32 image batch [B, ", cfg_.in_channels, ", H, W], got ",
               shape_str(rgb.shape()));
  const int64_t h = rgb.dim(2), w = rgb.dim(3);
  FLOWKV_CHECK(rgb.dim(0) >= 1 && h > 0 && w > 0, what, ": empty image batch ",
               shape_str(rgb.shape()));
  FLOWKV_CHECK(h <= limits::kMaxImageSide && w <= limits::kMaxImageSide, what, ": ", w, "x", h,
               " is larger than the limit of ", limits::kMaxImageSide, " pixels per side");
  FLOWKV_CHECK(h % m == 0 && w % m == 0, what, ": ", w, "x", h, " is not a multiple of ", m,
               " pixels per side (the VAE's /", cfg_.scale_factor(),
               " and the 2x2 patches); resize or crop it first");
}

Tensor Vae::encode_moments(const ExecContext& ctx0, const Tensor& rgb) const {
  check_image(rgb, "VAE encode input");
  const int64_t bsz = rgb.dim(0), h = rgb.dim(2), w = rgb.dim(3), f = cfg_.scale_factor();
  check_memory(activation_bytes(cfg_.block_out_channels, h, w),
               "VAE encode of a " + std::to_string(w) + "x" + std::to_string(h) + " image",
               "use a smaller reference image");
  Arena arena;
  ExecContext ctx = ctx0;
  if (!ctx.arena) ctx.arena = &arena;
  BatchTrace tr(ctx.tracer, bsz);
  const int64_t c2 = 2 * cfg_.latent_channels, hw = (h / f) * (w / f);
  Tensor out = Tensor::empty({bsz, c2, h / f, w / f});
  for (int64_t b = 0; b < bsz; ++b) {
    Act m = encode_one(ctx, *w_, cfg_, rgb.f32() + b * cfg_.in_channels * h * w, h, w, tr, b);
    ops::to_channels_first(m.p(), hw, c2, out.f32() + b * c2 * hw);
  }
  tr.flush();
  return out;
}

// x <- f(x, mean, std) per channel of [B, 4L, h, w] latents.
template <class F>
void Vae::per_channel(Tensor& x, F&& f) const {
  const int64_t c = cfg_.patched_channels();
  FLOWKV_CHECK(x.ndim() == 4 && x.dtype() == DType::kF32 && x.dim(1) == c,
               "VAE latents: expected f32 [B, ", c, ", h, w], got ", shape_str(x.shape()));
  const int64_t hw = x.dim(2) * x.dim(3);
  for (int64_t n = 0; n < x.dim(0) * c; ++n) {
    const float m = w_->bn_mean[size_t(n % c)], s = w_->bn_std[size_t(n % c)];
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

Tensor Vae::encode(const ExecContext& ctx, const Tensor& rgb) const {
  const Tensor moments = encode_moments(ctx, rgb);
  const int64_t bsz = moments.dim(0), l = cfg_.latent_channels,
                hw = moments.dim(2) * moments.dim(3);
  // The posterior's mode is its mean: the first L channels of the moments.
  Tensor mode = Tensor::empty({bsz, l, moments.dim(2), moments.dim(3)});
  for (int64_t b = 0; b < bsz; ++b) {
    std::memcpy(mode.f32() + b * l * hw, moments.f32() + b * 2 * l * hw, size_t(l * hw) * 4);
  }
  Tensor x = patchify(mode);
  if (ctx.tracer) {
    ctx.tracer->record("mode", mode);
    ctx.tracer->record("patchified", x.clone());
  }
  normalize(x);
  if (ctx.tracer) ctx.tracer->record("normalized", x);
  return x;
}

Tensor Vae::decode(const ExecContext& ctx, const Tensor& latents, const DecodeOptions& o) const {
  const int64_t c = cfg_.patched_channels();
  FLOWKV_CHECK(latents.ndim() == 4 && latents.dtype() == DType::kF32 && latents.dim(1) == c &&
                   latents.dim(0) >= 1 && latents.dim(2) >= 1 && latents.dim(3) >= 1,
               "VAE decode input: expected normalised patchified f32 latents [B, ", c,
               ", h, w], got ", shape_str(latents.shape()));
  Tensor x = latents.clone();
  denormalize(x);
  if (ctx.tracer) ctx.tracer->record("denormalized", x);
  Tensor z = unpatchify(x);
  if (ctx.tracer) ctx.tracer->record("unpatchified", z);
  Tensor img = decode_z(ctx, z, o);
  if (ctx.tracer) ctx.tracer->record("image", img);
  return img;
}

namespace {

// diffusers' tiled_decode for one image, keeping only what the blends still need: the bottom
// strip of each tile of the previous tile row and the right strip of the previous tile.
struct TilePlan {
  int64_t tile, stride, blend, limit;  // latent px, latent px, image px, image px
};

// b[y] = a[a_h - e + y] * (1 - y/e) + b[y] * (y/e) for y < e, as blend_v (a: the tile above).
void blend_rows(const float* a_bottom, int64_t a_rows, float* b, int64_t b_h, int64_t wd, int64_t c,
                int64_t extent) {
  const int64_t e = std::min({a_rows, b_h, extent});
  for (int64_t ch = 0; ch < c; ++ch) {
    for (int64_t y = 0; y < e; ++y) {
      const float wb = static_cast<float>(double(y) / double(e)),
                  wa = static_cast<float>(1.0 - double(y) / double(e));
      const float* ar = a_bottom + (ch * a_rows + a_rows - e + y) * wd;
      float* br = b + (ch * b_h + y) * wd;
      for (int64_t x = 0; x < wd; ++x) br[x] = ar[x] * wa + br[x] * wb;
    }
  }
}

void blend_cols(const float* a_right, int64_t a_cols, float* b, int64_t h, int64_t b_w, int64_t c,
                int64_t extent) {
  const int64_t e = std::min({a_cols, b_w, extent});
  for (int64_t ch = 0; ch < c; ++ch) {
    for (int64_t y = 0; y < h; ++y) {
      const float* ar = a_right + (ch * h + y) * a_cols + a_cols - e;
      float* br = b + (ch * h + y) * b_w;
      for (int64_t x = 0; x < e; ++x) {
        const float wb = static_cast<float>(double(x) / double(e)),
                    wa = static_cast<float>(1.0 - double(x) / double(e));
        br[x] = ar[x] * wa + br[x] * wb;
      }
    }
  }
}

}  // namespace

Tensor Vae::decode_z(const ExecContext& ctx0, const Tensor& z, const DecodeOptions& o) const {
  const int64_t l = cfg_.latent_channels, f = cfg_.scale_factor(), co = cfg_.out_channels;
  FLOWKV_CHECK(z.ndim() == 4 && z.dtype() == DType::kF32 && z.dim(1) == l && z.dim(0) >= 1 &&
                   z.dim(2) >= 1 && z.dim(3) >= 1,
               "VAE decode: expected f32 latents [B, ", l, ", h, w], got ", shape_str(z.shape()));
  const int64_t bsz = z.dim(0), h = z.dim(2), w = z.dim(3);
  FLOWKV_CHECK(h * f <= limits::kMaxImageSide && w * f <= limits::kMaxImageSide, "VAE decode: a ",
               w * f, "x", h * f, " image is larger than the limit of ", limits::kMaxImageSide,
               " pixels per side");
  const int64_t tile =
      o.tile_latent > 0 ? o.tile_latent : std::max<int64_t>(1, cfg_.sample_size / f);
  FLOWKV_CHECK(o.overlap >= 0 && o.overlap < 1, "VAE decode: tile overlap must be in [0, 1)");
  const bool tiled = o.tiled && (h > tile || w > tile);
  const TilePlan plan{tile, static_cast<int64_t>(double(tile) * (1 - o.overlap)),
                      static_cast<int64_t>(double(tile * f) * o.overlap),
                      tile * f - static_cast<int64_t>(double(tile * f) * o.overlap)};
  FLOWKV_CHECK(!tiled || (plan.stride >= 1 && plan.stride * f == plan.limit), "VAE decode: tile ",
               tile, " with overlap ", o.overlap,
               " does not give whole, consistent strides (diffusers' crop would misplace tiles)");
  const int64_t sh = tiled ? std::min(h, tile) : h, sw = tiled ? std::min(w, tile) : w;
  // Channels per resolution, full resolution first: an up block's upsampling conv already
  // writes the next finer level with its own (wider) channel count.
  const auto& dc = cfg_.decoder_channels();
  std::vector<int64_t> by_res(dc.size());
  for (size_t i = 0; i < dc.size(); ++i)
    by_res[i] = std::max(dc[i], dc[std::min(i + 1, dc.size() - 1)]);
  check_memory(
      checked_add(activation_bytes(by_res, sh * f, sw * f),
                  checked_mul(bsz * co, h * f * w * f * 4, "VAE image bytes"), "VAE decode"),
      "VAE decode of a " + std::to_string(w * f) + "x" + std::to_string(h * f) + " image",
      tiled ? "use smaller tiles" : "decode in tiles (DecodeOptions.tiled)");
  Arena arena;
  ExecContext ctx = ctx0;
  if (!ctx.arena) ctx.arena = &arena;
  Tensor out = Tensor::empty({bsz, co, h * f, w * f});
  const int64_t oh = h * f, ow = w * f;
  BatchTrace tr(ctx.tracer, bsz);
  for (int64_t b = 0; b < bsz; ++b) {
    const float* zb = z.f32() + b * l * h * w;
    float* ob = out.f32() + b * co * oh * ow;
    if (!tiled) {
      Act img = decode_one(ctx, *w_, cfg_, channels_last(zb, l, h, w), tr, b);
      ops::to_channels_first(img.p(), img.hw(), co, ob);
      continue;
    }
    // Tiles start every plan.stride latent pixels, as range(0, h, overlap_size).
    std::vector<int64_t> ys, xs;
    for (int64_t y = 0; y < h; y += plan.stride) ys.push_back(y);
    for (int64_t x = 0; x < w; x += plan.stride) xs.push_back(x);
    std::vector<std::vector<float>> above(xs.size());  // bottom strips of the previous tile row
    std::vector<int64_t> above_rows(xs.size(), 0);
    BatchTrace none(nullptr, 1);
    for (size_t ti = 0; ti < ys.size(); ++ti) {
      std::vector<float> left;  // right strip of the previous tile of this row
      int64_t left_cols = 0;
      for (size_t tj = 0; tj < xs.size(); ++tj) {
        const int64_t th = std::min(tile, h - ys[ti]), tw = std::min(tile, w - xs[tj]);
        Act zt = Act::make(th, tw, l);
        for (int64_t y = 0; y < th; ++y) {
          for (int64_t x = 0; x < tw; ++x) {
            for (int64_t ch = 0; ch < l; ++ch) {
              zt.d[size_t((y * tw + x) * l + ch)] = zb[(ch * h + ys[ti] + y) * w + xs[tj] + x];
            }
          }
        }
        Act dec = decode_one(ctx, *w_, cfg_, std::move(zt), none, 0);
        const int64_t ph = th * f, pw = tw * f;
        std::vector<float> t(static_cast<size_t>(co * ph * pw));
        ops::to_channels_first(dec.p(), ph * pw, co, t.data());
        dec = Act();
        if (ti > 0) blend_rows(above[tj].data(), above_rows[tj], t.data(), ph, pw, co, plan.blend);
        if (tj > 0) blend_cols(left.data(), left_cols, t.data(), ph, pw, co, plan.blend);
        // Keep the strips the next tiles blend with (of the blended tile, as diffusers keeps it).
        above_rows[tj] = std::min(ph, plan.blend);
        above[tj].assign(static_cast<size_t>(co * above_rows[tj] * pw), 0.0f);
        for (int64_t ch = 0; ch < co; ++ch) {
          std::memcpy(above[tj].data() + ch * above_rows[tj] * pw,
                      t.data() + (ch * ph + ph - above_rows[tj]) * pw,
                      size_t(above_rows[tj] * pw) * 4);
        }
        left_cols = std::min(pw, plan.blend);
        left.assign(static_cast<size_t>(co * ph * left_cols), 0.0f);
        for (int64_t ch = 0; ch < co; ++ch) {
          for (int64_t y = 0; y < ph; ++y) {
            std::memcpy(left.data() + (ch * ph + y) * left_cols,
                        t.data() + (ch * ph + y) * pw + pw - left_cols, size_t(left_cols) * 4);
          }
        }
        // Crop [:limit, :limit] into place.
        const int64_t y0 = int64_t(ti) * plan.limit, x0 = int64_t(tj) * plan.limit;
        const int64_t ch_h = std::min(plan.limit, ph), ch_w = std::min(plan.limit, pw);
        FLOWKV_CHECK(y0 + ch_h <= oh && x0 + ch_w <= ow, "VAE tiled decode: tile plan overruns");
        for (int64_t ch = 0; ch < co; ++ch) {
          for (int64_t y = 0; y < ch_h; ++y) {
            std::memcpy(ob + (ch * oh + y0 + y) * ow + x0, t.data() + (ch * ph + y) * pw,
                        size_t(ch_w) * 4);
          }
        }
      }
    }
  }
  tr.flush();
  return out;
}

}  // namespace flowkv::flux2_vae
