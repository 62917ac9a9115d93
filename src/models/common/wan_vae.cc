// The Wan-style VAE blocks and loops on one frame (see wan_vae.h), read as diffusers'
// QwenImage*ResidualBlock / AttentionBlock / MidBlock and the autoencoders' _encode / _decode /
// tiled_decode with an empty feature cache.
#include "models/common/wan_vae.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/arena.h"
#include "core/checked.h"
#include "core/mat.h"
#include "core/memory.h"
#include "core/parallel.h"
#include "flowkv/error.h"
#include "flowkv/limits.h"
#include "ops/attention.h"

namespace flowkv::wan_vae {

using ops::Conv2d;
using ops::Conv2dShape;

std::vector<int64_t> json_int_list(const Json& v, const char* key, int64_t max_len, int64_t hi,
                                   const std::string& src) {
  FLOWKV_CHECK(v.is_array() && !v.empty() && static_cast<int64_t>(v.size()) <= max_len, src, ": ",
               key, " must be a list of 1 to ", max_len, " integers");
  std::vector<int64_t> out;
  for (const Json& x : v) out.push_back(json_int_value(x, 1, hi, src + ": " + key));
  return out;
}

std::vector<bool> json_bool_list(const Json& v, const char* key, int64_t max_len,
                                 const std::string& src) {
  FLOWKV_CHECK(v.is_array() && static_cast<int64_t>(v.size()) <= max_len, src, ": ", key,
               " must be a list of at most ", max_len, " booleans");
  std::vector<bool> out;
  for (const Json& x : v) {
    FLOWKV_CHECK(x.is_boolean(), src, ": ", key, " entries must be true or false");
    out.push_back(x.get<bool>());
  }
  return out;
}

std::vector<float> json_float_list(const Json& v, const char* key, const std::string& src) {
  FLOWKV_CHECK(v.is_array() && static_cast<int64_t>(v.size()) <= limits::kMaxWidth, src, ": ", key,
               " must be a list of numbers");
  std::vector<float> out;
  for (const Json& x : v) {
    FLOWKV_CHECK(x.is_number(), src, ": ", key, " holds a value that is not a number");
    const double d = x.get<double>();
    FLOWKV_CHECK(std::isfinite(d) && std::fabs(d) < 1e30, src, ": ", key, " holds ", d,
                 ", not a finite f32");
    out.push_back(static_cast<float>(d));  // torch.tensor(list) makes f32, rounding to nearest
  }
  return out;
}

void WeightTable::conv2d(const std::string& p, int64_t cout, int64_t cin, int64_t k) {
  add(p + ".weight", {cout, cin, k, k});
  add(p + ".bias", {cout});
}

void WeightTable::time_conv(const std::string& p, int64_t cout, int64_t cin, int64_t kt) {
  add(p + ".weight", {cout, cin, kt, 1, 1});
  add(p + ".bias", {cout});
}

void WeightTable::conv(const std::string& p, int64_t cout, int64_t cin, int64_t k) {
  if (!causal3d) return conv2d(p, cout, cin, k);
  add(p + ".weight", {cout, cin, k, k, k});
  add(p + ".bias", {cout});
}

void WeightTable::norm(const std::string& p, int64_t c, bool images) {
  add(p + ".gamma", images ? Shape{c, 1, 1} : Shape{c, 1, 1, 1});
}

void WeightTable::resnet(const std::string& p, int64_t cin, int64_t cout) {
  norm(p + ".norm1", cin);
  conv(p + ".conv1", cout, cin, 3);
  norm(p + ".norm2", cout);
  conv(p + ".conv2", cout, cout, 3);
  if (cin != cout) conv(p + ".conv_shortcut", cout, cin, 1);
}

void WeightTable::mid(const std::string& p, int64_t c) {
  resnet(p + ".resnets.0", c, c);
  const std::string a = p + ".attentions.0";
  norm(a + ".norm", c, true);
  conv2d(a + ".to_qkv", 3 * c, c, 1);
  conv2d(a + ".proj", c, c, 1);
  resnet(p + ".resnets.1", c, c);
}

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
static Tensor rows(const Tensor& t, int64_t i, int64_t c) {
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

Act Act::make(int64_t h, int64_t w, int64_t c) {
  Act a;
  a.d.reset(new float[static_cast<size_t>(checked_numel({h, w, c}, "VAE activation"))]);
  a.h = h;
  a.w = w;
  a.c = c;
  return a;
}

void BatchTrace::add(const std::string& name, const Act& a, int64_t b) {
  if (!tracer_ || !tracer_->wants(name)) return;
  Tensor& t = got_[name];
  if (!t.defined()) t = Tensor::zeros({batch_, a.c, a.h, a.w});
  ops::to_channels_first(a.p(), a.hw(), a.c, t.f32() + b * a.c * a.hw());
}

void BatchTrace::flush() {
  for (auto& [name, t] : got_) tracer_->record(name, t);
  got_.clear();
}

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

// The residual block: shortcut(x) + conv2(SiLU(norm2(conv1(SiLU(norm1(x)))))).
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

// The attention block: RMS norm, one head of width C over the h*w pixels (SDPA's scale
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

Act channels_last(const float* chw, int64_t c, int64_t h, int64_t w) {
  Act a = Act::make(h, w, c);
  ops::to_channels_last(chw, c, h * w, a.p());
  return a;
}

Act copy_of(const Act& x) {
  Act y = Act::make(x.h, x.w, x.c);
  std::memcpy(y.p(), x.p(), size_t(x.hw() * x.c) * 4);
  return y;
}

Act upsample_conv(const ExecContext& ctx, const Conv2d& cv, const Act& x) {
  Act y = Act::make(2 * x.h, 2 * x.w, cv.shape().out_channels);
  cv.forward(ctx, x.p(), x.h, x.w, y.p(), /*upsample2x=*/true);
  return y;
}

namespace {

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

using EncodeOne = std::function<Act(const ExecContext& ctx, const float* image, int64_t h,
                                    int64_t w, BatchTrace& tr, int64_t b)>;
using DecodeOne = std::function<Act(const ExecContext& ctx, Act z, BatchTrace& tr, int64_t b)>;

void check_image(const Geometry& g, const Tensor& img, const std::string& what,
                 const std::string& hint) {
  const int64_t m = g.factor;
  FLOWKV_CHECK(img.ndim() == 4 && img.dtype() == DType::kF32 && img.dim(1) == g.in_channels, what,
               ": expected an f32 image batch [B, ", g.in_channels, ", H, W], got ",
               shape_str(img.shape()), hint);
  const int64_t h = img.dim(2), w = img.dim(3);
  FLOWKV_CHECK(img.dim(0) >= 1 && h > 0 && w > 0, what, ": empty image batch ",
               shape_str(img.shape()));
  FLOWKV_CHECK(h <= limits::kMaxImageSide && w <= limits::kMaxImageSide, what, ": ", w, "x", h,
               " is larger than the limit of ", limits::kMaxImageSide, " pixels per side");
  FLOWKV_CHECK(h % m == 0 && w % m == 0, what, ": ", w, "x", h, " is not a multiple of ", m,
               " pixels per side (the VAE's /", m, "); resize or crop it first");
}

void check_latents(const Geometry& g, const Tensor& z, const std::string& what) {
  const int64_t c = g.z_dim, f = g.factor;
  FLOWKV_CHECK(z.ndim() == 4 && z.dtype() == DType::kF32 && z.dim(1) == c && z.dim(0) >= 1 &&
                   z.dim(2) >= 1 && z.dim(3) >= 1,
               what, ": expected f32 latents [B, ", c, ", h, w], got ", shape_str(z.shape()));
  FLOWKV_CHECK(z.dim(2) <= limits::kMaxImageSide / f && z.dim(3) <= limits::kMaxImageSide / f, what,
               ": a ", z.dim(3) * f, "x", z.dim(2) * f, " image is larger than the limit of ",
               limits::kMaxImageSide, " pixels per side");
}

Tensor encode_moments(const ExecContext& ctx0, const Geometry& g, const Tensor& img,
                      const EncodeOne& one) {
  const int64_t bsz = img.dim(0), h = img.dim(2), w = img.dim(3), f = g.factor;
  check_memory(activation_bytes(g.encoder_by_res, h, w),
               "VAE encode of a " + std::to_string(w) + "x" + std::to_string(h) + " image",
               "use a smaller image");
  Arena arena;
  ExecContext ctx = ctx0;
  if (!ctx.arena) ctx.arena = &arena;
  BatchTrace tr(ctx.tracer, bsz);
  const int64_t c2 = 2 * g.z_dim, hw = (h / f) * (w / f);
  Tensor out = Tensor::empty({bsz, c2, h / f, w / f});
  for (int64_t b = 0; b < bsz; ++b) {
    Act m = one(ctx, img.f32() + b * g.in_channels * h * w, h, w, tr, b);
    ops::to_channels_first(m.p(), hw, c2, out.f32() + b * c2 * hw);
  }
  tr.flush();
  return out;
}

template <class F>
void per_channel(Tensor& x, const std::vector<float>& mean, const std::vector<float>& sd, F&& f) {
  const int64_t c = static_cast<int64_t>(mean.size()), hw = x.dim(2) * x.dim(3);
  for (int64_t n = 0; n < x.dim(0) * c; ++n) {
    const float m = mean[size_t(n % c)], s = sd[size_t(n % c)];
    float* p = x.f32() + n * hw;
    for (int64_t i = 0; i < hw; ++i) p[i] = f(p[i], m, s);
  }
}

void normalize(Tensor& x, const std::vector<float>& mean, const std::vector<float>& sd) {
  per_channel(x, mean, sd, [](float v, float m, float s) { return (v - m) / s; });
}

void denormalize(Tensor& x, const std::vector<float>& mean, const std::vector<float>& sd) {
  per_channel(x, mean, sd, [](float v, float m, float s) { return v * s + m; });
}

Tensor mode_normalized(const ExecContext& ctx, const Tensor& moments,
                       const std::vector<float>& mean, const std::vector<float>& sd) {
  const int64_t bsz = moments.dim(0), z = moments.dim(1) / 2, hw = moments.dim(2) * moments.dim(3);
  Tensor x = Tensor::empty({bsz, z, moments.dim(2), moments.dim(3)});
  for (int64_t b = 0; b < bsz; ++b) {
    std::memcpy(x.f32() + b * z * hw, moments.f32() + b * 2 * z * hw, size_t(z * hw) * 4);
  }
  if (ctx.tracer) {
    ctx.tracer->record("moments", moments);
    ctx.tracer->record("mode", x.clone());
  }
  normalize(x, mean, sd);
  if (ctx.tracer) ctx.tracer->record("normalized", x);
  return x;
}

Tensor decode_z(const ExecContext& ctx0, const Geometry& g, const Tensor& z, const DecodeOptions& o,
                const DecodeOne& one) {
  check_latents(g, z, "VAE decode");
  const int64_t l = g.z_dim, f = g.factor, co = g.out_channels;
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
  const int64_t sh = tiled ? std::min(h, tlh) : h, sw = tiled ? std::min(w, tlw) : w;
  check_memory(checked_add(activation_bytes(g.decoder_by_res, sh * f, sw * f),
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
      Act img = one(ctx, channels_last(zb, l, h, w), tr, b);
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
        Act d = one(ctx, std::move(zt), none, 0);
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

Tensor decode_normalized(const ExecContext& ctx, const Geometry& g, const Tensor& latents,
                         const DecodeOptions& o, const std::vector<float>& mean,
                         const std::vector<float>& sd, const DecodeOne& one) {
  check_latents(g, latents, "VAE decode input");
  Tensor x = latents.clone();
  denormalize(x, mean, sd);
  if (ctx.tracer) ctx.tracer->record("denormalized", x);
  Tensor img = decode_z(ctx, g, x, o, one);
  if (ctx.tracer) ctx.tracer->record("image", img);
  return img;
}

}  // namespace

VaeBase::VaeBase(Geometry g, std::vector<float> latents_mean, std::vector<float> latents_std)
    : g_(std::move(g)), mean_(std::move(latents_mean)), sd_(std::move(latents_std)) {}
VaeBase::VaeBase(VaeBase&&) noexcept = default;
VaeBase& VaeBase::operator=(VaeBase&&) noexcept = default;
VaeBase::~VaeBase() = default;

void VaeBase::check_image(const Tensor& img, const std::string& what) const {
  wan_vae::check_image(g_, img, what, image_hint(img));
}

void VaeBase::check_latents(const Tensor& z, const std::string& what) const {
  wan_vae::check_latents(g_, z, what);
}

Tensor VaeBase::encode_moments(const ExecContext& ctx, const Tensor& img) const {
  check_image(img, "VAE encode input");
  return wan_vae::encode_moments(
      ctx, g_, img,
      [this](const ExecContext& c, const float* x, int64_t h, int64_t w, BatchTrace& tr,
             int64_t b) { return encode_one(c, x, h, w, tr, b); });
}

void VaeBase::normalize(Tensor& x) const {
  check_latents(x, "VAE latents");
  wan_vae::normalize(x, mean_, sd_);
}

void VaeBase::denormalize(Tensor& x) const {
  check_latents(x, "VAE latents");
  wan_vae::denormalize(x, mean_, sd_);
}

Tensor VaeBase::encode(const ExecContext& ctx, const Tensor& img) const {
  return mode_normalized(ctx, encode_moments(ctx, img), mean_, sd_);
}

Tensor VaeBase::decode(const ExecContext& ctx, const Tensor& latents,
                       const DecodeOptions& o) const {
  return decode_normalized(ctx, g_, latents, o, mean_, sd_,
                           [this](const ExecContext& c, Act x, BatchTrace& tr, int64_t b) {
                             return decode_one(c, std::move(x), tr, b);
                           });
}

Tensor VaeBase::decode_z(const ExecContext& ctx, const Tensor& z, const DecodeOptions& o) const {
  return wan_vae::decode_z(ctx, g_, z, o,
                           [this](const ExecContext& c, Act x, BatchTrace& tr, int64_t b) {
                             return decode_one(c, std::move(x), tr, b);
                           });
}

}  // namespace flowkv::wan_vae
