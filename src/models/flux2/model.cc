// The FLUX.2 forward pass (diffusers transformer_flux2.py, Flux2Transformer2DModel.forward).
// Shapes in PyTorch order; activations are [B*S, C] matrices (core/mat.h).
#include "models/flux2/model.h"

#include <cstring>
#include <string>

#include "cache/hooks.h"
#include "flowkv/error.h"
#include "models/common/blocks.h"
#include "models/common/embeddings.h"
#include "models/flux2/model_weights.h"
#include "ops/attention.h"
#include "ops/ops.h"

namespace flowkv::flux2 {

namespace {

// One segment's residual stream. x holds batch element b's tokens at rows [b*seq, (b+1)*seq).
struct Stream {
  Mat x;                       // [B*seq, D]
  int64_t seq = 0;             // tokens per batch element
  const float* cos = nullptr;  // RoPE rows of these tokens: [seq, hd]
  const float* sin = nullptr;
  const float* mod = nullptr;  // this segment's modulation table [B, mod_width]
  int64_t mod_width = 0;
};

// Everything one forward shares.
struct Run {
  const ExecContext& ec;
  const Model::Weights& w;
  const ForwardArgs& a;
  Arena& ws;
  int64_t B, D, H, hd, F;
  float eps;
  bool bf16;
};

Mat alloc(Arena& a, int64_t rows, int64_t cols) {
  return alloc_mat(a, rows, cols);
}

// Chunk k of a stream's [B, n*D] modulation table, broadcast over each batch element's rows.
ops::ModRows chunk(const Stream& s, int k, int64_t d) {
  return {s.mod + k * d, s.mod_width, s.seq};
}

void attend(const Run& r, Mat q, int64_t seq, const std::vector<ops::KVSource>& sources, Mat out) {
  ops::attention(r.ec, {r.B, r.H, r.hd, seq}, q, sources, out);
}

// temb = TE(t*1000) [+ GE(g*1000)]: [B, D]. With bf16 weights diffusers rounds t, t*1000 and
// the sinusoid to bf16 (spec §3.9).
void embed_time(const Run& r, const float* t, const float* g, float* temb) {
  const int64_t ch = r.w.cfg.timestep_guidance_channels;
  Mat sinus = alloc(r.ws, r.B, ch), hidden = alloc(r.ws, r.B, r.D), act = alloc(r.ws, r.B, r.D);
  auto embed = [&](const float* v, const ops::Linear& l1, const ops::Linear& l2, Mat out) {
    for (int64_t b = 0; b < r.B; ++b) {
      const float scaled = r.bf16 ? round_bf16(round_bf16(v[b]) * 1000.0f) : v[b] * 1000.0f;
      timestep_sinusoid(scaled, ch, sinus.row(b));
    }
    if (r.bf16) ops::round_bf16(r.ec, sinus);
    l1.forward(r.ec, sinus, hidden);
    ops::silu(r.ec, hidden.data, act.data, r.B * r.D);
    l2.forward(r.ec, act, out);
  };
  embed(t, r.w.time_1, r.w.time_2, make_mat(temb, r.B, r.D));
  if (g && !r.w.guidance_1.empty()) {
    Mat ge = alloc(r.ws, r.B, r.D);
    embed(g, r.w.guidance_1, r.w.guidance_2, ge);
    for (int64_t i = 0; i < r.B * r.D; ++i) temb[i] += ge.data[i];
  }
}

// The shared modulation tables: SiLU(temb) through each modulation linear (T:1036-1047).
struct Mods {
  float* act;     // SiLU(temb) [B, D]
  float* img;     // [B, 6D]
  float* txt;     // [B, 6D]
  float* single;  // [B, 3D]
};
Mods modulations(const Run& r, const float* temb) {
  const int64_t b = r.B, d = r.D;
  Mods m{r.ws.floats(b * d), r.ws.floats(b * 6 * d), r.ws.floats(b * 6 * d),
         r.ws.floats(b * 3 * d)};
  ops::silu(r.ec, temb, m.act, b * d);
  const Mat act = make_mat(m.act, b, d);
  r.w.mod_img.forward(r.ec, act, make_mat(m.img, b, 6 * d));
  r.w.mod_txt.forward(r.ec, act, make_mat(m.txt, b, 6 * d));
  r.w.mod_single.forward(r.ec, act, make_mat(m.single, b, 3 * d));
  return m;
}

// q and k of a fused projection: per-head RMSNorm with weight, then RoPE.
void norm_rope_qk(const Run& r, Mat qkv, const Stream& s, const std::vector<float>& nq,
                  const std::vector<float>& nk) {
  const ops::RopeRows rope{s.cos, s.sin, s.seq};
  ops::rms_norm_rope(r.ec, qkv.cols_slice(0, r.D), r.hd, nq.data(), r.eps, rope);
  ops::rms_norm_rope(r.ec, qkv.cols_slice(r.D, r.D), r.hd, nk.data(), r.eps, rope);
  round_kv(r.ec, qkv, r.D, r.bf16);
}

// ---------------------------------------------------------------- double-stream block

struct DoublePrep {
  Mat norm, qkv, attn;  // modulated input [rows, D], q|k|v [rows, 3D], attention out [rows, D]
};

DoublePrep prepare_double(const Run& r, const Stream& s, const ops::Linear& proj,
                          const std::vector<float>& nq, const std::vector<float>& nk) {
  const int64_t rows = s.x.rows;
  DoublePrep p{alloc(r.ws, rows, r.D), alloc(r.ws, rows, 3 * r.D), alloc(r.ws, rows, r.D)};
  ops::layer_norm_modulate(r.ec, s.x, p.norm, chunk(s, 1, r.D), chunk(s, 0, r.D), r.eps);
  proj.forward(r.ec, p.norm, p.qkv);
  norm_rope_qk(r, p.qkv, s, nq, nk);
  return p;
}

// The MLP sublayer's output: SwiGLU MLP of the modulated LayerNorm (T:951-953).
void mlp_output(const Run& r, const Stream& s, const ops::Linear& ff_in, const ops::Linear& ff_out,
                Mat y) {
  ArenaScope scope(r.ws);
  const int64_t rows = s.x.rows;
  Mat n = alloc(r.ws, rows, r.D), h = alloc(r.ws, rows, 2 * r.F), u = alloc(r.ws, rows, r.F);
  ops::layer_norm_modulate(r.ec, s.x, n, chunk(s, 4, r.D), chunk(s, 3, r.D), r.eps);
  ff_in.forward(r.ec, n, h);
  ops::swiglu(r.ec, h, u);
  ff_out.forward(r.ec, u, y);
}

// Gated attention output, then the gated SwiGLU MLP (T:947-964).
void finish_double(const Run& r, Stream& s, Mat attn, const ops::Linear& out,
                   const ops::Linear& ff_in, const ops::Linear& ff_out) {
  ArenaScope scope(r.ws);
  Mat y = alloc(r.ws, s.x.rows, r.D);
  out.forward(r.ec, attn, y);
  ops::gated_add(r.ec, s.x, y, chunk(s, 2, r.D));
  mlp_output(r, s, ff_in, ff_out, y);
  ops::gated_add(r.ec, s.x, y, chunk(s, 5, r.D));
}

// A sublayer's outputs for the hooks, laid out as the residual streams: [text,] target.
cache::Streams outputs(const Run& r, Mat txt, int64_t txt_seq, Mat img, int64_t img_seq,
                       int64_t batch_rows = 0) {
  cache::Streams o;
  o.batch = r.B;
  if (txt_seq > 0) o.s.push_back({"text", txt, txt_seq, batch_rows});
  o.s.push_back({"target", img, img_seq, batch_rows});
  return o;
}

// Sources text and target queries read, in diffusers' order: [txt, refs, img]. Text and refs
// come from this forward when live, else from their memories.
std::vector<ops::KVSource> joint_sources(const Run& r, int64_t layer, const ops::KVSource* txt,
                                         const ops::KVSource* ref, const ops::KVSource& img) {
  std::vector<ops::KVSource> s;
  s.push_back(txt ? *txt : r.a.txt_kv.memory->source(layer));
  if (ref) {
    s.push_back(*ref);
  } else if (r.a.ref_kv.memory) {
    s.push_back(r.a.ref_kv.memory->source(layer));
  }
  s.push_back(img);
  return s;
}

TracePart part(const Stream* s, Mat m) {
  return {m, s ? s->seq : 0};
}

// `dynamic`: run the text and target streams (false when a step cache skips this block; the
// references, cached exactly, always run).
void double_block(const Run& r, int64_t i, Stream* txt, Stream& img, Stream* ref, bool dynamic) {
  const DoubleBlockWeights& w = r.w.doubles[static_cast<size_t>(i)];
  const ExecContext& ec = r.ec;
  cache::BlockHooks* hooks = r.a.hooks;
  const TraceBlock p{"transformer_blocks.", i};
  ArenaScope scope(r.ws);
  const bool reuse_attn =
      dynamic && hooks && hooks->reuse(static_cast<int>(i), cache::Sublayer::kAttention);
  const bool attend_dyn = dynamic && !reuse_attn;
  FLOWKV_CHECK(attend_dyn || !(txt && r.a.txt_kv.store), "a step cache skipped ", p,
               "attn while the text K/V were being stored: the prefill call must compute");
  trace_parts(ec, p + "in_img", r.B, {part(ref, ref ? ref->x : Mat{}), part(&img, img.x)});
  if (txt) trace_parts(ec, p + "in_txt", r.B, {part(txt, txt->x)});

  DoublePrep pt, pi, pr;
  if (attend_dyn && txt) pt = prepare_double(r, *txt, w.qkv_txt, w.norm_added_q, w.norm_added_k);
  if (attend_dyn) pi = prepare_double(r, img, w.qkv, w.norm_q, w.norm_k);
  if (ref) pr = prepare_double(r, *ref, w.qkv, w.norm_q, w.norm_k);
  if (ec.tracer && attend_dyn) {
    trace_parts(ec, p + "norm1", r.B, {part(ref, pr.norm), part(&img, pi.norm)});
    if (txt) trace_parts(ec, p + "norm1_context", r.B, {part(txt, pt.norm)});
    const char* names[] = {"attn.q", "attn.k", "attn.v"};
    for (int k = 0; k < 3; ++k) {
      auto cols = [&](Mat m) { return m.cols_slice(k * r.D, r.D); };
      trace_parts(ec, p + names[k], r.B,
                  {part(txt, txt ? cols(pt.qkv) : Mat{}), part(ref, ref ? cols(pr.qkv) : Mat{}),
                   part(&img, cols(pi.qkv))},
                  r.H);
    }
  }
  if (attend_dyn && txt) store_kv(r.a.txt_kv.store, i, pt.qkv, r.D);
  if (ref) store_kv(r.a.ref_kv.store, i, pr.qkv, r.D);

  ops::KVSource kv_txt, kv_ref;
  if (ref) kv_ref = live_kv(pr.qkv, r.D, ref->seq);
  if (attend_dyn) {
    const ops::KVSource kv_img = live_kv(pi.qkv, r.D, img.seq);
    if (txt) kv_txt = live_kv(pt.qkv, r.D, txt->seq);
    const auto sources =
        joint_sources(r, i, txt ? &kv_txt : nullptr, ref ? &kv_ref : nullptr, kv_img);
    if (txt) attend(r, pt.qkv.cols_slice(0, r.D), txt->seq, sources, pt.attn);
    attend(r, pi.qkv.cols_slice(0, r.D), img.seq, sources, pi.attn);
  }
  if (ref) attend(r, pr.qkv.cols_slice(0, r.D), ref->seq, {kv_ref}, pr.attn);  // refs see refs
  if (attend_dyn) {
    trace_parts(
        ec, p + "attn.out", r.B,
        {part(txt, txt ? pt.attn : Mat{}), part(ref, ref ? pr.attn : Mat{}), part(&img, pi.attn)});
  }

  if (dynamic) {
    // Attention sublayer (after its output projection), then the MLP sublayer; a step cache
    // may provide either.
    const int64_t L = txt ? txt->seq : 0;
    Mat yt = alloc(r.ws, r.B * L, r.D), yi = alloc(r.ws, img.x.rows, r.D);
    cache::Streams y = outputs(r, yt, L, yi, img.seq);
    if (reuse_attn) {
      hooks->fetch(static_cast<int>(i), cache::Sublayer::kAttention, y);
    } else {
      if (txt) w.out_txt.forward(ec, pt.attn, yt);
      w.out.forward(ec, pi.attn, yi);
      if (hooks) hooks->store(static_cast<int>(i), cache::Sublayer::kAttention, y);
    }
    if (txt) ops::gated_add(ec, txt->x, yt, chunk(*txt, 2, r.D));
    ops::gated_add(ec, img.x, yi, chunk(img, 2, r.D));
    if (hooks && hooks->reuse(static_cast<int>(i), cache::Sublayer::kMlp)) {
      hooks->fetch(static_cast<int>(i), cache::Sublayer::kMlp, y);
    } else {
      if (txt) mlp_output(r, *txt, w.ff_txt_in, w.ff_txt_out, yt);
      mlp_output(r, img, w.ff_in, w.ff_out, yi);
      if (hooks) hooks->store(static_cast<int>(i), cache::Sublayer::kMlp, y);
    }
    if (txt) ops::gated_add(ec, txt->x, yt, chunk(*txt, 5, r.D));
    ops::gated_add(ec, img.x, yi, chunk(img, 5, r.D));
  }
  if (ref) finish_double(r, *ref, pr.attn, w.out, w.ff_in, w.ff_out);
  trace_parts(ec, p + "out_img", r.B, {part(ref, ref ? ref->x : Mat{}), part(&img, img.x)});
  if (txt) trace_parts(ec, p + "out_txt", r.B, {part(txt, txt->x)});
}

// ---------------------------------------------------------------- single-stream block

struct SinglePrep {
  Mat norm, h, cat;  // modulated input [rows, D]; q|k|v|gate|value [rows, 3D+2F];
                     // [attention | MLP] [rows, D+F], the input of to_out
};

SinglePrep prepare_single(const Run& r, const Stream& s, const SingleBlockWeights& w) {
  const int64_t rows = s.x.rows;
  SinglePrep p{alloc(r.ws, rows, r.D), alloc(r.ws, rows, 3 * r.D + 2 * r.F),
               alloc(r.ws, rows, r.D + r.F)};
  ops::layer_norm_modulate(r.ec, s.x, p.norm, chunk(s, 1, r.D), chunk(s, 0, r.D), r.eps);
  w.qkv_mlp.forward(r.ec, p.norm, p.h);
  norm_rope_qk(r, p.h, s, w.norm_q, w.norm_k);
  ops::swiglu(r.ec, p.h.cols_slice(3 * r.D, 2 * r.F), p.cat.cols_slice(r.D, r.F));
  return p;
}

void finish_single(const Run& r, Stream& s, const SinglePrep& p, const SingleBlockWeights& w) {
  ArenaScope scope(r.ws);
  Mat y = alloc(r.ws, s.x.rows, r.D);
  w.out.forward(r.ec, p.cat, y);
  ops::gated_add(r.ec, s.x, y, chunk(s, 2, r.D));
}

// live: the joint [txt; img] stream (txt_rows = 0 when text comes from memory). `dynamic` as
// for the double block; the fused to_out output is this block's one hookable sublayer.
void single_block(const Run& r, int64_t j, Stream& live, int64_t txt_rows, Stream* ref,
                  bool dynamic) {
  const SingleBlockWeights& w = r.w.singles[static_cast<size_t>(j)];
  const ExecContext& ec = r.ec;
  cache::BlockHooks* hooks = r.a.hooks;
  const int64_t layer = r.w.cfg.num_layers + j, S = live.seq, N = S - txt_rows;
  const int block = static_cast<int>(layer);
  const TraceBlock p{"single_transformer_blocks.", j};
  ArenaScope scope(r.ws);
  const bool reuse = dynamic && hooks && hooks->reuse(block, cache::Sublayer::kAttention);
  const bool compute_dyn = dynamic && !reuse;
  FLOWKV_CHECK(compute_dyn || !(txt_rows > 0 && r.a.txt_kv.store), "a step cache skipped ", p,
               "attn while the text K/V were being stored: the prefill call must compute");
  // Traces in diffusers' order [txt, ref, img]: the live stream's text rows, the references,
  // the live stream's image rows.
  auto trace3 = [&](const TraceName& name, Mat live_m, Mat ref_m, int64_t heads = 0) {
    if (!ec.tracer || !compute_dyn) return;
    trace_parts(ec, name, r.B,
                {TracePart{live_m, txt_rows, S}, TracePart{ref_m, ref ? ref->seq : 0},
                 TracePart{live_m.rows_slice(txt_rows, live_m.rows - txt_rows), N, S}},
                heads);
  };
  trace3(p + "in", live.x, ref ? ref->x : Mat{});

  SinglePrep pl, pr;
  if (compute_dyn) pl = prepare_single(r, live, w);
  if (ref) pr = prepare_single(r, *ref, w);
  trace3(p + "norm", pl.norm, pr.norm);
  trace3(p + "attn.q", pl.h.cols_slice(0, r.D), pr.h.cols_slice(0, r.D), r.H);
  trace3(p + "attn.k", pl.h.cols_slice(r.D, r.D), pr.h.cols_slice(r.D, r.D), r.H);
  trace3(p + "attn.v", pl.h.cols_slice(2 * r.D, r.D), pr.h.cols_slice(2 * r.D, r.D), r.H);
  if (compute_dyn && txt_rows > 0) store_kv(r.a.txt_kv.store, layer, pl.h, r.D, S);
  if (ref) store_kv(r.a.ref_kv.store, layer, pr.h, r.D);

  ops::KVSource kv_txt, kv_ref;
  if (ref) kv_ref = live_kv(pr.h, r.D, ref->seq);
  if (compute_dyn) {
    const Mat img_rows = pl.h.rows_slice(txt_rows, pl.h.rows - txt_rows);
    const ops::KVSource kv_img = live_kv(img_rows, r.D, N, S);
    if (txt_rows > 0) kv_txt = live_kv(pl.h, r.D, txt_rows, S);
    const auto sources =
        joint_sources(r, layer, txt_rows > 0 ? &kv_txt : nullptr, ref ? &kv_ref : nullptr, kv_img);
    attend(r, pl.h.cols_slice(0, r.D), S, sources, pl.cat.cols_slice(0, r.D));
  }
  if (ref) attend(r, pr.h.cols_slice(0, r.D), ref->seq, {kv_ref}, pr.cat.cols_slice(0, r.D));
  trace3(p + "attn.out", pl.cat.cols_slice(0, r.D), pr.cat.cols_slice(0, r.D));

  if (dynamic) {
    Mat y = alloc(r.ws, live.x.rows, r.D);
    cache::Streams ys = outputs(r, y, txt_rows, y.rows_slice(txt_rows, y.rows - txt_rows), N, S);
    if (reuse) {
      hooks->fetch(block, cache::Sublayer::kAttention, ys);
    } else {
      w.out.forward(ec, pl.cat, y);
      if (hooks) hooks->store(block, cache::Sublayer::kAttention, ys);
    }
    ops::gated_add(ec, live.x, y, chunk(live, 2, r.D));
  }
  if (ref) finish_single(r, *ref, pr, w);
  trace3(p + "out", live.x, ref ? ref->x : Mat{});
}

// ---------------------------------------------------------------- arguments

void check_memory(const KVMemory& m, const Run& r, int64_t tokens, const char* what) {
  FLOWKV_CHECK(m.layers() == r.w.cfg.num_blocks() && m.width() == r.D && m.batch() == r.B, what,
               " KV memory has ", m.layers(), " layers x batch ", m.batch(), " x width ", m.width(),
               "; this model needs ", r.w.cfg.num_blocks(), " x ", r.B, " x ", r.D);
  if (tokens >= 0) {
    FLOWKV_CHECK(m.tokens() == tokens, what, " KV memory holds ", m.tokens(), " tokens, the ", what,
                 " segment has ", tokens);
  }
}

void check_args(const Run& r) {
  const ForwardArgs& a = r.a;
  FLOWKV_CHECK(a.batch > 0, "forward: batch must be positive");
  FLOWKV_CHECK(a.img && a.img_tokens > 0 && a.img_ids && a.timestep && a.out,
               "forward: target tokens, their ids, the timestep and the output are required");
  if (a.txt_kv.memory) {
    FLOWKV_CHECK(!a.txt_kv.store, "forward: text cannot be both stored and read from memory");
    check_memory(*a.txt_kv.memory, r, -1, "text");
    FLOWKV_CHECK(a.txt_kv.memory->complete(), "forward: the text KV memory is not filled yet");
  } else {
    FLOWKV_CHECK(a.txt && a.txt_tokens > 0 && a.txt_ids,
                 "forward: text features and ids are required");
    if (a.txt_kv.store) check_memory(*a.txt_kv.store, r, a.txt_tokens, "text");
  }
  if (a.ref_tokens > 0) {
    FLOWKV_CHECK(a.ref && a.ref_ids, "forward: reference tokens need their latents and ids");
    FLOWKV_CHECK(!a.ref_kv.memory,
                 "forward: references are given as tokens and as a memory; pass one");
    if (a.ref_kv.store) check_memory(*a.ref_kv.store, r, a.ref_tokens, "reference");
  } else {
    FLOWKV_CHECK(!a.ref_kv.store, "forward: nothing to store: no reference tokens given");
    if (a.ref_kv.memory) {
      check_memory(*a.ref_kv.memory, r, -1, "reference");
      FLOWKV_CHECK(a.ref_kv.memory->complete(),
                   "forward: the reference KV memory is not filled yet (run the prefill first)");
    }
  }
}

void trace_rope(const ExecContext& ec, const char* name, int64_t hd,
                std::initializer_list<std::pair<const float*, int64_t>> parts) {
  if (!ec.tracer || !ec.tracer->wants(name)) return;
  int64_t rows = 0;
  for (const auto& p : parts) rows += p.second;
  Tensor t = Tensor::empty({rows, hd});
  float* o = t.f32();
  for (const auto& p : parts) {
    std::memcpy(o, p.first, static_cast<size_t>(p.second * hd) * 4);
    o += p.second * hd;
  }
  ec.tracer->record(name, t);
}

}  // namespace

void Model::forward(const ExecContext& ec, const ForwardArgs& a) const {
  FLOWKV_CHECK(ec.arena, "forward: the execution context needs a workspace arena");
  const Weights& w = *w_;
  const Config& c = w.cfg;
  Run r{ec,
        w,
        a,
        *ec.arena,
        a.batch,
        c.dim(),
        c.num_attention_heads,
        c.attention_head_dim,
        c.mlp_hidden(),
        static_cast<float>(c.eps),
        w.compute == DType::kBF16};
  check_args(r);
  ArenaScope scope(r.ws);
  const int64_t B = r.B, D = r.D, hd = r.hd;
  const bool txt_live = a.txt_kv.memory == nullptr;
  const int64_t L = txt_live ? a.txt_tokens : 0, N = a.img_tokens, R = a.ref_tokens;

  // 1. Time embedding and the shared modulations; references modulate from ref_timestep.
  float* temb = r.ws.floats(B * D);
  embed_time(r, a.timestep, a.guidance, temb);
  const Mods mods = modulations(r, temb);
  trace_tensor(ec, "temb", temb, {B, D});
  trace_tensor(ec, "double_stream_mod_img", mods.img, {B, 6 * D});
  trace_tensor(ec, "double_stream_mod_txt", mods.txt, {B, 6 * D});
  trace_tensor(ec, "single_stream_mod", mods.single, {B, 3 * D});
  Mods ref_mods{};
  if (R > 0) {
    std::vector<float> ref_t(static_cast<size_t>(B), a.ref_timestep);
    float* ref_temb = r.ws.floats(B * D);
    embed_time(r, ref_t.data(), a.guidance, ref_temb);
    ref_mods = modulations(r, ref_temb);
    trace_tensor(ec, "ref_temb", ref_temb, {B, D});
    trace_tensor(ec, "ref_double_stream_mod_img", ref_mods.img, {B, 6 * D});
    trace_tensor(ec, "ref_single_stream_mod", ref_mods.single, {B, 3 * D});
  }

  // 2. Input projections.
  Stream img{alloc(r.ws, B * N, D), N}, txt{alloc(r.ws, B * L, D), L},
      ref{alloc(r.ws, B * R, D), R};
  w.x_embedder.forward(ec, {const_cast<float*>(a.img), B * N, c.in_channels, c.in_channels}, img.x);
  if (L > 0) {
    w.context_embedder.forward(
        ec, {const_cast<float*>(a.txt), B * L, c.joint_attention_dim, c.joint_attention_dim},
        txt.x);
  }
  if (R > 0) {
    w.x_embedder.forward(ec, {const_cast<float*>(a.ref), B * R, c.in_channels, c.in_channels},
                         ref.x);
  }
  trace_parts(ec, "x_embedder", B, {{ref.x, R}, {img.x, N}});
  if (L > 0) trace_parts(ec, "context_embedder", B, {{txt.x, L}});

  // 3. RoPE tables. The joint [txt; img] table serves the double blocks (split) and the
  // single blocks (whole); references have their own.
  float* cos = r.ws.floats((L + N) * hd);
  float* sin = r.ws.floats((L + N) * hd);
  float* ref_cos = r.ws.floats(R * hd);
  float* ref_sin = r.ws.floats(R * hd);
  if (L > 0) rope_tables(a.txt_ids, L, 4, c.axes_dims_rope, c.rope_theta, cos, sin);
  rope_tables(a.img_ids, N, 4, c.axes_dims_rope, c.rope_theta, cos + L * hd, sin + L * hd);
  if (R > 0) rope_tables(a.ref_ids, R, 4, c.axes_dims_rope, c.rope_theta, ref_cos, ref_sin);
  trace_rope(ec, "rope_cos", hd, {{cos, L}, {ref_cos, R}, {cos + L * hd, N}});
  trace_rope(ec, "rope_sin", hd, {{sin, L}, {ref_sin, R}, {sin + L * hd, N}});

  // 4. Double-stream blocks.
  txt.cos = cos, txt.sin = sin, txt.mod = mods.txt, txt.mod_width = 6 * D;
  img.cos = cos + L * hd, img.sin = sin + L * hd, img.mod = mods.img, img.mod_width = 6 * D;
  ref.cos = ref_cos, ref.sin = ref_sin, ref.mod = ref_mods.img, ref.mod_width = 6 * D;
  // Step-cache hooks see the dynamic streams: text (when live) and target.
  cache::BlockHooks* hooks = a.hooks;
  cache::Streams streams = outputs(r, txt.x, L, img.x, N);
  if (hooks) {
    Mat probe{};
    if (hooks->wants_probe()) {  // block 0's modulated target input
      probe = alloc(r.ws, B * N, D);
      ops::layer_norm_modulate(ec, img.x, probe, chunk(img, 1, D), chunk(img, 0, D), r.eps);
    }
    hooks->begin(streams, probe);
  }
  auto run_block = [&](int64_t blk) {
    return !hooks ||
           hooks->before_block(static_cast<int>(blk), streams) == cache::BlockAction::kRun;
  };
  for (int64_t i = 0; i < c.num_layers; ++i) {
    const bool run = run_block(i);
    double_block(r, i, L > 0 ? &txt : nullptr, img, R > 0 ? &ref : nullptr, run);
    if (hooks) hooks->after_block(static_cast<int>(i), streams);
  }

  // 5. Single-stream blocks over the joint [txt; img] stream (references stay apart).
  const int64_t S = L + N;
  Stream live{alloc(r.ws, B * S, D), S, cos, sin, mods.single, 3 * D};
  for (int64_t b = 0; b < B; ++b) {
    copy_rows(txt.x.rows_slice(b * L, L), live.x.rows_slice(b * S, L));
    copy_rows(img.x.rows_slice(b * N, N), live.x.rows_slice(b * S + L, N));
  }
  ref.mod = ref_mods.single, ref.mod_width = 3 * D;
  streams = outputs(r, live.x, L, live.x.rows_slice(L, live.x.rows - L), N, S);
  for (int64_t j = 0; j < c.num_single_layers; ++j) {
    const bool run = run_block(c.num_layers + j);
    single_block(r, j, live, L, R > 0 ? &ref : nullptr, run);
    if (hooks) hooks->after_block(static_cast<int>(c.num_layers + j), streams);
  }
  if (hooks) hooks->end(streams);

  // 6. Output: the target rows, norm_out (scale, shift from the normal temb), proj_out.
  Mat fin = alloc(r.ws, B * N, D), normed = alloc(r.ws, B * N, D), emb = alloc(r.ws, B, 2 * D);
  for (int64_t b = 0; b < B; ++b)
    copy_rows(live.x.rows_slice(b * S + L, N), fin.rows_slice(b * N, N));
  w.norm_out.forward(ec, make_mat(mods.act, B, D), emb);
  ops::layer_norm_modulate(ec, fin, normed, {emb.data, 2 * D, N}, {emb.data + D, 2 * D, N}, r.eps);
  const Mat out = make_mat(a.out, B * N, c.out_features());
  w.proj_out.forward(ec, normed, out);
  trace_parts(ec, "norm_out", B, {{normed, N}});
  trace_parts(ec, "output", B, {{out, N}});
}

cache::Topology Model::topology() const {
  cache::Topology t;
  t.model = "flux2";
  const Config& c = config();
  for (int64_t i = 0; i < c.num_layers; ++i)
    t.blocks.push_back({"transformer_blocks." + std::to_string(i), "double", true});
  // A single block's fused attention+MLP output (diffusers' Flux2ParallelSelfAttention) is its
  // one reusable sublayer.
  for (int64_t j = 0; j < c.num_single_layers; ++j)
    t.blocks.push_back({"single_transformer_blocks." + std::to_string(j), "single", false});
  return t;
}

}  // namespace flowkv::flux2
