// The Qwen-Image forward pass (diffusers transformer_qwenimage.py).
#include "models/qwen_image/model_qwen.h"

#include <cstring>
#include <functional>
#include <map>

#include "flowkv/error.h"
#include "models/common/block_loop.h"
#include "models/common/blocks.h"
#include "models/common/embeddings.h"
#include "models/common/held_bytes.h"
#include "models/qwen_image/weights.h"

namespace flowkv::qwen {

struct StreamWeights {
  ops::Linear mod;  // [6D, D]: (shift, scale, gate) for attention, then for the MLP
  ops::Linear qkv, out, mlp_in, mlp_out;
  std::vector<float> norm_q, norm_k;
};

struct ModelQwenImage::Weights {
  ConfigQwenImage cfg;
  DType compute = DType::kF32;
  ops::Linear time_1, time_2, img_in, txt_in, norm_out, proj_out;
  std::vector<float> txt_norm;
  std::vector<std::pair<StreamWeights, StreamWeights>> blocks;  // (image, text)
};

namespace {

using Getter = std::function<Tensor(const std::string&)>;

std::vector<float> vec(const Tensor& t) {
  const Tensor f = t.to_f32();
  return std::vector<float>(f.f32(), f.f32() + f.numel());
}

ops::Linear linear(const Getter& get, const std::string& base, ops::Compute dt) {
  ops::Linear l(get(base + ".weight"), dt);
  l.set_bias(get(base + ".bias"));
  return l;
}

ops::Linear stacked(const Getter& get, std::vector<std::string> bases, ops::Compute dt) {
  std::vector<Tensor> ws;
  std::vector<float> bias;
  for (const auto& b : bases) {
    ws.push_back(get(b + ".weight"));
    const auto v = vec(get(b + ".bias"));
    bias.insert(bias.end(), v.begin(), v.end());
  }
  ops::Linear l = ops::Linear::stacked(ws, dt, false);
  l.set_bias(Tensor::from_vector(bias, {static_cast<int64_t>(bias.size())}));
  return l;
}

std::shared_ptr<ModelQwenImage::Weights> build(const Getter& get,
                                               const std::map<std::string, TensorInfo>& stored,
                                               const ConfigQwenImage& c, ops::Compute dt) {
  check_weights_fit(weight_table(c), held_bytes(stored, dt.type), "a Qwen-Image transformer");
  auto w = std::make_shared<ModelQwenImage::Weights>();
  w->cfg = c;
  w->compute = dt.type;
  using namespace wqi;
  w->time_1 = linear(get, kTime1, dt);
  w->time_2 = linear(get, kTime2, dt);
  w->txt_norm = vec(get(kTxtNorm));
  w->img_in = linear(get, kImgIn, dt);
  w->txt_in = linear(get, kTxtIn, dt);
  w->norm_out = linear(get, kNormOut, dt);
  w->proj_out = linear(get, kProjOut, dt);
  for (int64_t i = 0; i < c.num_layers; ++i) {
    auto n = [&](const char* leaf) { return block_name(i, leaf); };
    StreamWeights img, txt;
    img.mod = linear(get, n(kImgMod), dt);
    txt.mod = linear(get, n(kTxtMod), dt);
    img.qkv = stacked(get, {n(kToQ), n(kToK), n(kToV)}, dt);
    txt.qkv = stacked(get, {n(kAddQ), n(kAddK), n(kAddV)}, dt);
    img.out = linear(get, n(kToOut), dt);
    txt.out = linear(get, n(kToAddOut), dt);
    img.mlp_in = linear(get, n(kImgMlpIn), dt);
    img.mlp_out = linear(get, n(kImgMlpOut), dt);
    txt.mlp_in = linear(get, n(kTxtMlpIn), dt);
    txt.mlp_out = linear(get, n(kTxtMlpOut), dt);
    img.norm_q = vec(get(n(kNormQ)));
    img.norm_k = vec(get(n(kNormK)));
    txt.norm_q = vec(get(n(kNormAddedQ)));
    txt.norm_k = vec(get(n(kNormAddedK)));
    w->blocks.push_back({std::move(img), std::move(txt)});
  }
  return w;
}

struct Run {
  const ExecContext& ec;
  const ModelQwenImage::Weights& w;
  Arena& ws;
  int64_t B, D, H, hd, F;
  float eps;
  BlockLoop loop;
};

// A residual stream and its modulation. Every row of batch element b is modulated by row b of
// the stream's [B, 6D] modulation, except under zero_cond_t, where the image stream's rows after
// the target's first `split` of each element use row B + b (the t = 0 embedding).
struct Stream {
  Mat x;
  int64_t seq = 0;
  const float* cos = nullptr;
  const float* sin = nullptr;
  Mat mod{};          // this block's [B, 6D] modulation ([2B, 6D] under zero_cond_t)
  int64_t split = 0;  // zero_cond_t: target rows per element (0: every row uses row b)
};

// y = LN(x) * (1 + scale_k) + shift_j, group by group.
void modulate(const Run& r, const Stream& s, Mat y, int scale, int shift) {
  if (s.split == 0) {
    ops::layer_norm_modulate(r.ec, s.x, y, {s.mod.data + scale * r.D, s.mod.stride, s.seq},
                             {s.mod.data + shift * r.D, s.mod.stride, s.seq}, r.eps);
    return;
  }
  const int64_t B = s.mod.rows / 2;
  for (int64_t b = 0; b < B; ++b) {
    for (const auto& [r0, n, m] : {std::tuple{b * s.seq, s.split, b},
                                   std::tuple{b * s.seq + s.split, s.seq - s.split, B + b}}) {
      if (n == 0) continue;
      ops::layer_norm_modulate(r.ec, s.x.rows_slice(r0, n), y.rows_slice(r0, n),
                               {s.mod.row(m) + scale * r.D, 0, n},
                               {s.mod.row(m) + shift * r.D, 0, n}, r.eps);
    }
  }
}

// x += gate_k * y, group by group.
void gated(const Run& r, Stream& s, Mat y, int gate) {
  if (s.split == 0) {
    ops::gated_add(r.ec, s.x, y, {s.mod.data + gate * r.D, s.mod.stride, s.seq});
    return;
  }
  const int64_t B = s.mod.rows / 2;
  for (int64_t b = 0; b < B; ++b) {
    for (const auto& [r0, n, m] : {std::tuple{b * s.seq, s.split, b},
                                   std::tuple{b * s.seq + s.split, s.seq - s.split, B + b}}) {
      if (n == 0) continue;
      ops::gated_add(r.ec, s.x.rows_slice(r0, n), y.rows_slice(r0, n),
                     {s.mod.row(m) + gate * r.D, 0, n});
    }
  }
}

// The streams as step-cache hooks see them: text, then the image stream.
cache::Streams streams_of(int64_t batch, Mat txt, int64_t txt_seq, Mat img, int64_t img_seq) {
  cache::Streams o;
  o.batch = batch;
  o.s.push_back({"text", txt, txt_seq, 0});
  o.s.push_back({"target", img, img_seq, 0});
  return o;
}

struct Prep {
  Mat norm, qkv, attn;
};

// The stream's modulation for this block (from the timestep embedding's SiLU, [B or 2B, D]).
void modulation(const Run& r, Stream& s, const StreamWeights& w, const Mat& temb_act) {
  s.mod = alloc_mat(r.ws, temb_act.rows, 6 * r.D);
  w.mod.forward(r.ec, temb_act, s.mod);
}

Prep prepare(const Run& r, Stream& s, const StreamWeights& w) {
  const int64_t rows = s.x.rows;
  Prep p{alloc_mat(r.ws, rows, r.D), alloc_mat(r.ws, rows, 3 * r.D), alloc_mat(r.ws, rows, r.D)};
  modulate(r, s, p.norm, 1, 0);
  w.qkv.forward(r.ec, p.norm, p.qkv);
  const ops::RopeRows rope{s.cos, s.sin, s.seq};
  ops::rms_norm_rope(r.ec, p.qkv.cols_slice(0, r.D), r.hd, w.norm_q.data(), r.eps, rope);
  ops::rms_norm_rope(r.ec, p.qkv.cols_slice(r.D, r.D), r.hd, w.norm_k.data(), r.eps, rope);
  return p;
}

// The stream's MLP sublayer output (before its gate): the GELU MLP of the modulated LayerNorm.
void mlp_output(const Run& r, const Stream& s, const StreamWeights& w, Mat y) {
  ArenaScope scope(r.ws);
  const int64_t rows = s.x.rows;
  Mat n = alloc_mat(r.ws, rows, r.D), h = alloc_mat(r.ws, rows, r.F);
  modulate(r, s, n, 4, 3);
  w.mlp_in.forward(r.ec, n, h);
  ops::gelu_tanh(r.ec, h);
  w.mlp_out.forward(r.ec, h, y);
}

// `run`: false when a step cache skips the block (its streams stay as they are).
// `img_act` / `txt_act`: the SiLU of the timestep embedding each stream is modulated from
// ([2B, D] for the image stream under zero_cond_t, else [B, D]).
void block(const Run& r, int64_t i, Stream& txt, Stream& img, const Mat& img_act,
           const Mat& txt_act, const uint8_t* key_valid, bool run) {
  // Named references, not structured bindings: the lambdas below capture them.
  const StreamWeights& wi = r.w.blocks[static_cast<size_t>(i)].first;
  const StreamWeights& wt = r.w.blocks[static_cast<size_t>(i)].second;
  const ExecContext& ec = r.ec;
  const TraceBlock n{"transformer_blocks.", i};
  ArenaScope scope(r.ws);
  trace_parts(ec, n + "in_img", r.B, {{img.x, img.seq}});
  trace_parts(ec, n + "in_txt", r.B, {{txt.x, txt.seq}});
  if (!run) return;
  const bool reuse_attn = r.loop.reuse(i, cache::Sublayer::kAttention);
  modulation(r, img, wi, img_act);
  modulation(r, txt, wt, txt_act);
  Prep pi, pt;
  if (!reuse_attn) {
    pi = prepare(r, img, wi), pt = prepare(r, txt, wt);
    if (ec.tracer) {
      trace_parts(ec, n + "norm1", r.B, {{pi.norm, img.seq}});
      trace_parts(ec, n + "norm1_context", r.B, {{pt.norm, txt.seq}});
      const char* names[] = {"attn.q", "attn.k", "attn.v"};
      for (int k = 0; k < 3; ++k) {
        trace_parts(ec, n + names[k], r.B,
                    {{pt.qkv.cols_slice(k * r.D, r.D), txt.seq},
                     {pi.qkv.cols_slice(k * r.D, r.D), img.seq}},
                    r.H);
      }
    }
    ops::KVSource kt = live_kv(pt.qkv, r.D, txt.seq), ki = live_kv(pi.qkv, r.D, img.seq);
    kt.valid = key_valid;  // padded prompt tokens are never attended to
    const std::vector<ops::KVSource> src{kt, ki};
    ops::attention(ec, {r.B, r.H, r.hd, txt.seq}, pt.qkv.cols_slice(0, r.D), src, pt.attn);
    ops::attention(ec, {r.B, r.H, r.hd, img.seq}, pi.qkv.cols_slice(0, r.D), src, pi.attn);
    trace_parts(ec, n + "attn.out", r.B, {{pt.attn, txt.seq}, {pi.attn, img.seq}});
  }
  Mat yt = alloc_mat(r.ws, txt.x.rows, r.D), yi = alloc_mat(r.ws, img.x.rows, r.D);
  cache::Streams y = streams_of(r.B, yt, txt.seq, yi, img.seq);
  r.loop.sublayer(i, cache::Sublayer::kAttention, reuse_attn, y, [&] {
    wt.out.forward(ec, pt.attn, yt);
    wi.out.forward(ec, pi.attn, yi);
  });
  gated(r, img, yi, 2);
  gated(r, txt, yt, 2);
  r.loop.sublayer(i, cache::Sublayer::kMlp, r.loop.reuse(i, cache::Sublayer::kMlp), y, [&] {
    mlp_output(r, img, wi, yi);
    mlp_output(r, txt, wt, yt);
  });
  gated(r, img, yi, 5);
  gated(r, txt, yt, 5);
  trace_parts(ec, n + "out_img", r.B, {{img.x, img.seq}});
  trace_parts(ec, n + "out_txt", r.B, {{txt.x, txt.seq}});
}

// QwenEmbedRope (scale_rope): image k has frame k and a centred grid; text token l sits at
// M + l on all three axes, M = max over images of max(h/2, w/2).
void rope(const ArgsQwenImage& a, const ConfigQwenImage& c, int64_t hd, float* img_cos,
          float* img_sin, float* txt_cos, float* txt_sin) {
  std::vector<std::array<int64_t, 3>> img_pos, txt_pos;
  int64_t m = 0;
  for (size_t k = 0; k < a.img_grids.size(); ++k) {
    const Grid g = a.img_grids[k];
    for (int64_t y = 0; y < g.h; ++y) {
      for (int64_t x = 0; x < g.w; ++x) {
        img_pos.push_back({static_cast<int64_t>(k), y - (g.h - g.h / 2), x - (g.w - g.w / 2)});
      }
    }
    m = std::max({m, g.h / 2, g.w / 2});
  }
  for (int64_t l = 0; l < a.text_len; ++l) txt_pos.push_back({m + l, m + l, m + l});
  rope_tables21(img_pos, 0, static_cast<int64_t>(img_pos.size()), c.axes_dims_rope, img_cos,
                img_sin);
  rope_tables21(txt_pos, 0, a.text_len, c.axes_dims_rope, txt_cos, txt_sin);
  (void)hd;
}

}  // namespace

ModelQwenImage ModelQwenImage::load(const std::string& path, const LoadOptions21& opts) {
  const CheckpointScan scan = scan_checkpoint(path);
  const ConfigQwenImage c = config_qwen_image_of(scan);
  const auto problems = check_against_table(scan.tensors, weight_table(c));
  FLOWKV_CHECK(problems.empty(),
               format_problems(scan.path + " does not hold a Qwen-Image transformer of its config",
                               problems));
  bool all_bf16 = !scan.tensors.empty();
  for (const auto& [n, t] : scan.tensors) all_bf16 &= t.dtype_known && t.dtype == DType::kBF16;
  const DType dt = opts.auto_dtype ? (all_bf16 ? DType::kBF16 : DType::kF32) : opts.compute;
  CheckpointReader reader(scan);
  ModelQwenImage m;
  m.w_ = build([&](const std::string& n) { return reader.get(n); }, scan.tensors, c,
               ops::Compute{dt, opts.int8});
  return m;
}

ModelQwenImage ModelQwenImage::from_tensors(const std::map<std::string, Tensor>& tensors,
                                            const ConfigQwenImage& c, const LoadOptions21& opts) {
  std::map<std::string, TensorInfo> infos;
  bool all_bf16 = !tensors.empty();
  for (const auto& [n, t] : tensors) {
    infos[n] = {n, std::string(dtype_name(t.dtype())), true, t.dtype(), t.shape()};
    all_bf16 &= t.dtype() == DType::kBF16;
  }
  const auto problems = check_against_table(infos, weight_table(c));
  FLOWKV_CHECK(
      problems.empty(),
      format_problems("the tensors are not a Qwen-Image transformer of its config", problems));
  const DType dt = opts.auto_dtype ? (all_bf16 ? DType::kBF16 : DType::kF32) : opts.compute;
  ModelQwenImage m;
  m.w_ = build([&](const std::string& n) { return tensors.at(n); }, infos, c,
               ops::Compute{dt, opts.int8});
  return m;
}

const ConfigQwenImage& ModelQwenImage::config() const {
  return w_->cfg;
}

DType ModelQwenImage::compute_dtype() const {
  return w_->compute;
}

cache::Topology ModelQwenImage::topology() const {
  cache::Topology t;
  t.model = "qwen-image";
  for (int64_t i = 0; i < config().num_layers; ++i)
    t.blocks.push_back({"transformer_blocks." + std::to_string(i), "double", true});
  return t;
}

void ModelQwenImage::forward(const ExecContext& ec, const ArgsQwenImage& a) const {
  FLOWKV_CHECK(ec.arena, "forward: the execution context needs a workspace arena");
  const Weights& w = *w_;
  const ConfigQwenImage& c = w.cfg;
  FLOWKV_CHECK(a.batch > 0 && a.img && a.text && a.timestep && a.out && !a.img_grids.empty(),
               "forward: images, text, timestep and output are required");
  Run r{ec,
        w,
        *ec.arena,
        a.batch,
        c.dim(),
        c.num_attention_heads,
        c.attention_head_dim,
        c.mlp_hidden(),
        static_cast<float>(c.eps),
        BlockLoop(a.hooks)};
  ArenaScope scope(r.ws);
  const int64_t B = r.B, D = r.D, hd = r.hd, L = a.text_len;
  int64_t N = 0;
  for (const Grid& g : a.img_grids) N += g.tokens();
  // Input projections: img_in; RMSNorm then txt_in for the text.
  Stream img, txt;
  img.x = alloc_mat(r.ws, B * N, D), img.seq = N;
  txt.x = alloc_mat(r.ws, B * L, D), txt.seq = L;
  w.img_in.forward(ec, {const_cast<float*>(a.img), B * N, c.in_channels, c.in_channels}, img.x);
  {
    ArenaScope s2(r.ws);
    Mat normed = alloc_mat(r.ws, B * L, c.joint_attention_dim);
    copy_rows({const_cast<float*>(a.text), B * L, c.joint_attention_dim, c.joint_attention_dim},
              normed);
    ops::rms_norm_rope(ec, normed, c.joint_attention_dim, w.txt_norm.data(), r.eps, {});
    w.txt_in.forward(ec, normed, txt.x);
  }
  trace_parts(ec, "img_in", B, {{img.x, N}});
  trace_parts(ec, "txt_in", B, {{txt.x, L}});
  // temb: Timesteps(256, flip_sin_to_cos, scale 1000) then the MLP (with biases). Under
  // zero_cond_t the timesteps are [t_0 .. t_{B-1}, 0 .. 0]: rows B.. modulate the references.
  const int64_t T = c.zero_cond_t ? 2 * B : B;
  Mat sinus = alloc_mat(r.ws, T, 256), hidden = alloc_mat(r.ws, T, D), temb = alloc_mat(r.ws, T, D),
      act = alloc_mat(r.ws, T, D);
  for (int64_t b = 0; b < T; ++b)
    timestep_sinusoid(b < B ? a.timestep[b] : 0.0f, 256, sinus.row(b), 1000.0f);
  w.time_1.forward(ec, sinus, hidden);
  ops::silu(ec, hidden.data, hidden.data, T * D);
  w.time_2.forward(ec, hidden, temb);
  ops::silu(ec, temb.data, act.data, T * D);
  trace_tensor(ec, "temb", temb.data, {T, D});
  if (c.zero_cond_t) img.split = a.img_grids[0].tokens();
  const Mat act_b = act.rows_slice(0, B);  // the text and the output use the step's rows
  // RoPE.
  float* ic = r.ws.floats(N * hd);
  float* is = r.ws.floats(N * hd);
  float* tc = r.ws.floats(L * hd);
  float* ts = r.ws.floats(L * hd);
  rope(a, c, hd, ic, is, tc, ts);
  img.cos = ic, img.sin = is, txt.cos = tc, txt.sin = ts;
  if (ec.tracer) {
    auto half = [&](const char* name, const float* t, int64_t n) {
      Tensor o = Tensor::empty({n, hd / 2});
      for (int64_t s = 0; s < n; ++s)
        for (int64_t j = 0; j < hd / 2; ++j) o.f32()[s * (hd / 2) + j] = t[s * hd + 2 * j];
      ec.tracer->record(name, o);
    };
    half("rope_img_cos", ic, N), half("rope_img_sin", is, N);
    half("rope_txt_cos", tc, L), half("rope_txt_sin", ts, L);
  }
  // The blocks; step-cache hooks see the text and image streams.
  cache::Streams streams = streams_of(B, txt.x, L, img.x, N);
  r.loop.begin(streams, [&] {  // block 0's modulated image input
    Stream probe_src = img;
    modulation(r, probe_src, w.blocks[0].first, act);
    Mat probe = alloc_mat(r.ws, B * N, D);
    modulate(r, probe_src, probe, 1, 0);
    return probe;
  });
  r.loop.run(0, c.num_layers, streams,
             [&](int64_t i, bool run) { block(r, i, txt, img, act, act_b, a.text_valid, run); });
  r.loop.end(streams);
  // norm_out (scale, shift from the temb; with bias) and proj_out.
  Mat emb = alloc_mat(r.ws, B, 2 * D), normed = alloc_mat(r.ws, B * N, D);
  w.norm_out.forward(ec, act_b, emb);
  ops::layer_norm_modulate(ec, img.x, normed, {emb.data, 2 * D, N}, {emb.data + D, 2 * D, N},
                           r.eps);
  const Mat out = make_mat(a.out, B * N, c.out_features());
  w.proj_out.forward(ec, normed, out);
  trace_parts(ec, "norm_out", B, {{normed, N}});
  trace_parts(ec, "output", B, {{out, N}});
}

}  // namespace flowkv::qwen
