// The FLUX.2 forward pass (diffusers transformer_flux2.py, Flux2Transformer2DModel.forward).
// Shapes in PyTorch order; activations are [B*S, C] matrices (core/mat.h).
#include "models/flux2/model.h"

#include <cstring>
#include <string>

#include "cache/hooks.h"
#include "flowkv/error.h"
#include "models/common/block_loop.h"
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

// The call's segments as this model runs them, resolved and checked once (check_plan).
struct Plan {
  const SegmentInput* target = nullptr;
  const SegmentInput* text = nullptr;
  std::vector<const SegmentInput*> refs;  // one reference stream, in the order given
  SegmentKV text_kv, ref_kv;              // the references' route is shared (checked)
  int64_t N = 0;                          // target tokens
  int64_t L = 0;                          // live text tokens (0 when spliced from memory)
  int64_t R = 0;                          // live reference tokens (0 when spliced or none)
  float ref_timestep = 0;
};

// Everything one forward shares.
struct Run {
  const ExecContext& ec;
  const Model::Weights& w;
  const ForwardArgs& a;
  const Plan& plan;
  Arena& ws;
  BlockLoop loop;
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
  ArenaScope scope(r.ws);
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
  float* txt;     // [B, 6D] (not for the references, which have no text stream)
  float* single;  // [B, 3D]
};
Mods alloc_mods(const Run& r, bool with_txt) {
  const int64_t b = r.B, d = r.D;
  return {r.ws.floats(b * d), r.ws.floats(b * 6 * d), with_txt ? r.ws.floats(b * 6 * d) : nullptr,
          r.ws.floats(b * 3 * d)};
}
void modulations(const Run& r, const float* temb, const Mods& m) {
  const int64_t b = r.B, d = r.D;
  ops::silu(r.ec, temb, m.act, b * d);
  const Mat act = make_mat(m.act, b, d);
  r.w.mod_img.forward(r.ec, act, make_mat(m.img, b, 6 * d));
  if (m.txt) r.w.mod_txt.forward(r.ec, act, make_mat(m.txt, b, 6 * d));
  r.w.mod_single.forward(r.ec, act, make_mat(m.single, b, 3 * d));
}

// q and k of a fused projection: per-head RMSNorm with weight, then RoPE.
void norm_rope_qk(const Run& r, Mat qkv, const Stream& s, const std::vector<float>& nq,
                  const std::vector<float>& nk) {
  const ops::RopeRows rope{s.cos, s.sin, s.seq};
  ops::rms_norm_rope(r.ec, qkv.cols_slice(0, r.D), r.hd, nq.data(), r.eps, rope);
  ops::rms_norm_rope(r.ec, qkv.cols_slice(r.D, r.D), r.hd, nk.data(), r.eps, rope);
  round_kv(r.ec, qkv, r.D, r.bf16);
}

TracePart part(const Stream* s, Mat m) {
  return {s ? m : Mat{}, s ? s->seq : 0};
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

// ---------------------------------------------------------------- block pieces

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

// ---------------------------------------------------------------- the reference stream

// The references under the Klein KV rules: one stream that attends to itself only and is
// modulated from a fixed time, so nothing the text or target compute feeds it. It advances
// lazily (LazySegment): eager when its K/V are stored or when every block runs anyway.
struct RefStream {
  Stream s;
  Mods mods;
  float* cos = nullptr;  // [R, hd]
  float* sin = nullptr;
  LazySegment lazy{true};
};

// Buffers for the whole call; nothing is computed yet.
RefStream alloc_refs(const Run& r) {
  RefStream ref;
  const int64_t R = r.plan.R;
  ref.s = {alloc(r.ws, r.B * R, r.D), R};
  ref.mods = alloc_mods(r, false);
  ref.cos = r.ws.floats(R * r.hd);
  ref.sin = r.ws.floats(R * r.hd);
  ref.s.cos = ref.cos, ref.s.sin = ref.sin;
  ref.lazy = LazySegment(r.plan.ref_kv.route == KVRoute::kComputeAndStore || !r.a.hooks);
  return ref;
}

// The references' time embedding and modulations (from their fixed time), input projection
// and RoPE tables.
void start_refs(const Run& r, RefStream& ref) {
  ArenaScope scope(r.ws);
  const Config& c = r.w.cfg;
  const int64_t B = r.B, D = r.D, R = r.plan.R;
  std::vector<float> ref_t(static_cast<size_t>(B), r.plan.ref_timestep);
  float* temb = r.ws.floats(B * D);
  embed_time(r, ref_t.data(), r.a.guidance, temb);
  modulations(r, temb, ref.mods);
  trace_tensor(r.ec, "ref_temb", temb, {B, D});
  trace_tensor(r.ec, "ref_double_stream_mod_img", ref.mods.img, {B, 6 * D});
  trace_tensor(r.ec, "ref_single_stream_mod", ref.mods.single, {B, 3 * D});
  r.w.x_embedder.forward(r.ec, gather_rows(r.ws, B, r.plan.refs, c.in_channels), ref.s.x);
  float* ids = r.ws.floats(R * 4);  // [R, 4]: the references' ids, in order
  for (int64_t row = 0; const SegmentInput* s : r.plan.refs) {
    std::memcpy(ids + row * 4, s->ids, static_cast<size_t>(s->tokens * 4) * sizeof(float));
    row += s->tokens;
  }
  rope_tables(ids, R, 4, c.axes_dims_rope, c.rope_theta, ref.cos, ref.sin);
}

// Block i (a double block) of the references, in the caller's arena scope: q|k|v (stored when
// asked), attention over the references only, the gated updates.
DoublePrep ref_double(const Run& r, RefStream& ref, int64_t i) {
  const DoubleBlockWeights& w = r.w.doubles[static_cast<size_t>(i)];
  Stream& s = ref.s;
  s.mod = ref.mods.img, s.mod_width = 6 * r.D;
  DoublePrep p = prepare_double(r, s, w.qkv, w.norm_q, w.norm_k);
  store_kv(r.plan.ref_kv.store, i, p.qkv, r.D);
  attend(r, p.qkv.cols_slice(0, r.D), s.seq, {live_kv(p.qkv, r.D, s.seq)}, p.attn);
  finish_double(r, s, p.attn, w.out, w.ff_in, w.ff_out);
  return p;
}

// Single block j of the references, likewise.
SinglePrep ref_single(const Run& r, RefStream& ref, int64_t j) {
  const SingleBlockWeights& w = r.w.singles[static_cast<size_t>(j)];
  Stream& s = ref.s;
  s.mod = ref.mods.single, s.mod_width = 3 * r.D;
  SinglePrep p = prepare_single(r, s, w);
  store_kv(r.plan.ref_kv.store, r.w.cfg.num_layers + j, p.h, r.D);
  attend(r, p.h.cols_slice(0, r.D), s.seq, {live_kv(p.h, r.D, s.seq)}, p.cat.cols_slice(0, r.D));
  finish_single(r, s, p, w);
  return p;
}

// Brings the references to the input of K/V layer `layer` (double blocks, then single blocks).
void refs_to(const Run& r, RefStream& ref, int64_t layer) {
  const int64_t doubles = r.w.cfg.num_layers;
  ref.lazy.catch_up(
      layer, r.ws, [&] { start_refs(r, ref); },
      [&](int64_t l) {
        if (l < doubles) {
          ref_double(r, ref, l);
        } else {
          ref_single(r, ref, l - doubles);
        }
      });
}

// ---------------------------------------------------------------- double-stream block

// Sources text and target queries read, in diffusers' order: [txt, refs, img]. Text and refs
// come from this forward when live, else from their memories.
std::vector<ops::KVSource> joint_sources(const Run& r, int64_t layer, const ops::KVSource* txt,
                                         const ops::KVSource* ref, const ops::KVSource& img) {
  std::vector<ops::KVSource> s;
  s.push_back(txt ? *txt : r.plan.text_kv.memory->source(layer));
  if (ref) {
    s.push_back(*ref);
  } else if (r.plan.ref_kv.memory) {
    s.push_back(r.plan.ref_kv.memory->source(layer));
  }
  s.push_back(img);
  return s;
}

struct DoubleAttn {
  DoublePrep txt, img;
};

// The text (when live) and target streams' attention at double block i over [text, refs,
// target]; `ref`, `pr`: the references' stream and block (null when spliced or absent).
DoubleAttn attend_double(const Run& r, int64_t i, const Stream* txt, const Stream& img,
                         const Stream* ref, const DoublePrep& pr) {
  const DoubleBlockWeights& w = r.w.doubles[static_cast<size_t>(i)];
  const ExecContext& ec = r.ec;
  const TraceBlock p{"transformer_blocks.", i};
  DoubleAttn d;
  if (txt) d.txt = prepare_double(r, *txt, w.qkv_txt, w.norm_added_q, w.norm_added_k);
  d.img = prepare_double(r, img, w.qkv, w.norm_q, w.norm_k);
  if (ec.tracer) {
    trace_parts(ec, p + "norm1", r.B, {part(ref, pr.norm), part(&img, d.img.norm)});
    if (txt) trace_parts(ec, p + "norm1_context", r.B, {part(txt, d.txt.norm)});
    const char* names[] = {"attn.q", "attn.k", "attn.v"};
    for (int k = 0; k < 3; ++k) {
      auto cols = [&](const Stream* s, Mat m) {
        return part(s, s ? m.cols_slice(k * r.D, r.D) : Mat{});
      };
      trace_parts(ec, p + names[k], r.B,
                  {cols(txt, d.txt.qkv), cols(ref, pr.qkv), cols(&img, d.img.qkv)}, r.H);
    }
  }
  if (txt) store_kv(r.plan.text_kv.store, i, d.txt.qkv, r.D);
  const ops::KVSource kv_img = live_kv(d.img.qkv, r.D, img.seq);
  ops::KVSource kv_txt, kv_ref;
  if (txt) kv_txt = live_kv(d.txt.qkv, r.D, txt->seq);
  if (ref) kv_ref = live_kv(pr.qkv, r.D, ref->seq);
  const auto sources =
      joint_sources(r, i, txt ? &kv_txt : nullptr, ref ? &kv_ref : nullptr, kv_img);
  if (txt) attend(r, d.txt.qkv.cols_slice(0, r.D), txt->seq, sources, d.txt.attn);
  attend(r, d.img.qkv.cols_slice(0, r.D), img.seq, sources, d.img.attn);
  trace_parts(ec, p + "attn.out", r.B,
              {part(txt, d.txt.attn), part(ref, pr.attn), part(&img, d.img.attn)});
  return d;
}

// The text and target streams' gated attention output (after its projection) and gated MLP;
// a step cache may provide either sublayer's output.
void update_double(const Run& r, int64_t i, Stream* txt, Stream& img, const DoubleAttn& d,
                   bool reuse_attn) {
  const DoubleBlockWeights& w = r.w.doubles[static_cast<size_t>(i)];
  const ExecContext& ec = r.ec;
  const int64_t L = txt ? txt->seq : 0;
  Mat yt = alloc(r.ws, r.B * L, r.D), yi = alloc(r.ws, img.x.rows, r.D);
  cache::Streams y = outputs(r, yt, L, yi, img.seq);
  r.loop.sublayer(i, cache::Sublayer::kAttention, reuse_attn, y, [&] {
    if (txt) w.out_txt.forward(ec, d.txt.attn, yt);
    w.out.forward(ec, d.img.attn, yi);
  });
  if (txt) ops::gated_add(ec, txt->x, yt, chunk(*txt, 2, r.D));
  ops::gated_add(ec, img.x, yi, chunk(img, 2, r.D));
  r.loop.sublayer(i, cache::Sublayer::kMlp, r.loop.reuse(i, cache::Sublayer::kMlp), y, [&] {
    if (txt) mlp_output(r, *txt, w.ff_txt_in, w.ff_txt_out, yt);
    mlp_output(r, img, w.ff_in, w.ff_out, yi);
  });
  if (txt) ops::gated_add(ec, txt->x, yt, chunk(*txt, 5, r.D));
  ops::gated_add(ec, img.x, yi, chunk(img, 5, r.D));
}

// `run`: run the text and target streams (false when a step cache skips this block). The
// references run when this block reads their K/V or stores them.
void double_block(const Run& r, int64_t i, Stream* txt, Stream& img, RefStream* ref, bool run) {
  const ExecContext& ec = r.ec;
  const TraceBlock p{"transformer_blocks.", i};
  ArenaScope scope(r.ws);
  const bool reuse_attn = run && r.loop.reuse(i, cache::Sublayer::kAttention);
  const bool attend_dyn = run && !reuse_attn;
  FLOWKV_CHECK(attend_dyn || !(txt && r.plan.text_kv.store), "a step cache skipped ", p,
               "attn while the text K/V were being stored: the prefill call must compute");
  const bool with_ref = ref && ref->lazy.needed(attend_dyn);
  if (with_ref) refs_to(r, *ref, i);
  const Stream* rs = with_ref ? &ref->s : nullptr;
  trace_parts(ec, p + "in_img", r.B, {part(rs, rs ? rs->x : Mat{}), part(&img, img.x)});
  if (txt) trace_parts(ec, p + "in_txt", r.B, {part(txt, txt->x)});
  DoublePrep pr;
  if (with_ref) {
    pr = ref_double(r, *ref, i);
    ref->lazy.ran(i);
  }
  DoubleAttn d;
  if (attend_dyn) d = attend_double(r, i, txt, img, rs, pr);
  if (run) update_double(r, i, txt, img, d, reuse_attn);
  trace_parts(ec, p + "out_img", r.B, {part(rs, rs ? rs->x : Mat{}), part(&img, img.x)});
  if (txt) trace_parts(ec, p + "out_txt", r.B, {part(txt, txt->x)});
}

// ---------------------------------------------------------------- single-stream block

// live: the joint [txt; img] stream (txt_rows = 0 when text comes from memory). `run` as for
// the double block; the fused to_out output is this block's one hookable sublayer.
void single_block(const Run& r, int64_t j, Stream& live, int64_t txt_rows, RefStream* ref,
                  bool run) {
  const SingleBlockWeights& w = r.w.singles[static_cast<size_t>(j)];
  const ExecContext& ec = r.ec;
  const int64_t layer = r.w.cfg.num_layers + j, S = live.seq, N = S - txt_rows;
  const TraceBlock p{"single_transformer_blocks.", j};
  ArenaScope scope(r.ws);
  const bool reuse = run && r.loop.reuse(layer, cache::Sublayer::kAttention);
  const bool compute_dyn = run && !reuse;
  FLOWKV_CHECK(compute_dyn || !(txt_rows > 0 && r.plan.text_kv.store), "a step cache skipped ", p,
               "attn while the text K/V were being stored: the prefill call must compute");
  const bool with_ref = ref && ref->lazy.needed(compute_dyn);
  if (with_ref) refs_to(r, *ref, layer);
  const Stream* rs = with_ref ? &ref->s : nullptr;
  // Traces in diffusers' order [txt, ref, img]: the live stream's text rows, the references,
  // the live stream's image rows.
  auto trace3 = [&](const TraceName& name, Mat live_m, Mat ref_m, int64_t heads = 0) {
    if (!ec.tracer || !compute_dyn) return;
    trace_parts(ec, name, r.B,
                {TracePart{live_m, txt_rows, S}, part(rs, ref_m),
                 TracePart{live_m.rows_slice(txt_rows, live_m.rows - txt_rows), N, S}},
                heads);
  };
  trace3(p + "in", live.x, rs ? rs->x : Mat{});
  SinglePrep pl, pr;
  if (with_ref) {
    pr = ref_single(r, *ref, j);
    ref->lazy.ran(layer);
  }
  if (compute_dyn) {
    pl = prepare_single(r, live, w);
    if (txt_rows > 0) store_kv(r.plan.text_kv.store, layer, pl.h, r.D, S);
    const Mat img_rows = pl.h.rows_slice(txt_rows, pl.h.rows - txt_rows);
    ops::KVSource kv_txt, kv_ref;
    if (txt_rows > 0) kv_txt = live_kv(pl.h, r.D, txt_rows, S);
    if (rs) kv_ref = live_kv(pr.h, r.D, rs->seq);
    const auto sources = joint_sources(r, layer, txt_rows > 0 ? &kv_txt : nullptr,
                                       rs ? &kv_ref : nullptr, live_kv(img_rows, r.D, N, S));
    attend(r, pl.h.cols_slice(0, r.D), S, sources, pl.cat.cols_slice(0, r.D));
  }
  trace3(p + "norm", pl.norm, pr.norm);
  trace3(p + "attn.q", pl.h.cols_slice(0, r.D), pr.h.cols_slice(0, r.D), r.H);
  trace3(p + "attn.k", pl.h.cols_slice(r.D, r.D), pr.h.cols_slice(r.D, r.D), r.H);
  trace3(p + "attn.v", pl.h.cols_slice(2 * r.D, r.D), pr.h.cols_slice(2 * r.D, r.D), r.H);
  trace3(p + "attn.out", pl.cat.cols_slice(0, r.D), pr.cat.cols_slice(0, r.D));
  if (run) {
    Mat y = alloc(r.ws, live.x.rows, r.D);
    cache::Streams ys = outputs(r, y, txt_rows, y.rows_slice(txt_rows, y.rows - txt_rows), N, S);
    r.loop.sublayer(layer, cache::Sublayer::kAttention, reuse, ys,
                    [&] { w.out.forward(ec, pl.cat, y); });
    ops::gated_add(ec, live.x, y, chunk(live, 2, r.D));
  }
  trace3(p + "out", live.x, rs ? rs->x : Mat{});
}

// ---------------------------------------------------------------- arguments

void check_memory(const KVMemory& m, const Model::Weights& w, int64_t batch, int64_t tokens,
                  const std::string& what) {
  FLOWKV_CHECK(m.layers() == w.cfg.num_blocks() && m.width() == w.cfg.dim() && m.batch() == batch,
               what, " KV memory has ", m.layers(), " layers x batch ", m.batch(), " x width ",
               m.width(), "; this model needs ", w.cfg.num_blocks(), " x ", batch, " x ",
               w.cfg.dim());
  FLOWKV_CHECK(m.tokens() == tokens, what, " KV memory holds ", m.tokens(), " tokens, the ", what,
               " segment has ", tokens);
}

// One segment's route: its memories where the route needs them and nowhere else.
void check_route(const SegmentInput& s, const Model::Weights& w, int64_t batch, int64_t tokens) {
  const SegmentKV& kv = s.kv;
  FLOWKV_CHECK((kv.route == KVRoute::kComputeAndStore) == (kv.store != nullptr),
               "forward: segment '", s.name,
               "': a store memory goes with the route compute-and-store, and only with it");
  FLOWKV_CHECK((kv.route == KVRoute::kSplice) == (kv.memory != nullptr), "forward: segment '",
               s.name, "': a memory to splice from goes with the route splice, and only with it");
  if (kv.store) check_memory(*kv.store, w, batch, tokens, s.name);
  if (kv.memory) {
    check_memory(*kv.memory, w, batch, tokens, s.name);
    FLOWKV_CHECK(kv.memory->complete(), "forward: the KV memory of segment '", s.name,
                 "' is not filled yet (run the prefill first)");
  }
}

// A computed segment's inputs; spliced segments need none.
void check_inputs(const SegmentInput& s) {
  FLOWKV_CHECK(s.tokens > 0, "forward: segment '", s.name, "' has no tokens");
  if (s.kv.route == KVRoute::kSplice) return;
  FLOWKV_CHECK(s.rows && s.ids, "forward: segment '", s.name,
               "' needs its rows and its position ids");
}

// The references form one stream: one route, one memory over all of them, one fixed time.
void check_refs(Plan& p, const Model::Weights& w, int64_t batch) {
  if (p.refs.empty()) return;
  const SegmentInput& first = *p.refs[0];
  int64_t tokens = 0;
  for (const SegmentInput* s : p.refs) {
    check_inputs(*s);
    FLOWKV_CHECK(s->kv.route == first.kv.route && s->kv.store == first.kv.store &&
                     s->kv.memory == first.kv.memory,
                 "forward: references '", first.name, "' and '", s->name,
                 "' travel differently; FLUX.2 references form one stream with one route and one "
                 "KV memory over all of them");
    FLOWKV_CHECK(s->time.fixed && s->time.timestep == first.time.timestep, "forward: reference '",
                 s->name, "' must be modulated from the references' one fixed timestep (Klein KV)");
    tokens += s->tokens;
  }
  check_route(first, w, batch, tokens);
  p.ref_kv = first.kv;
  p.ref_timestep = first.time.timestep;
  p.R = first.kv.route == KVRoute::kSplice ? 0 : tokens;
}

Plan plan_of(const Model::Weights& w, const ForwardArgs& a) {
  FLOWKV_CHECK(a.batch > 0, "forward: batch must be positive");
  FLOWKV_CHECK(a.timestep && a.out, "forward: the timestep and the output are required");
  Plan p;
  for (const SegmentInput& s : a.segments) {
    const SegmentInput** slot = s.kind == SegmentKind::kTarget ? &p.target
                                : s.kind == SegmentKind::kText ? &p.text
                                                               : nullptr;
    if (!slot) {
      p.refs.push_back(&s);
      continue;
    }
    FLOWKV_CHECK(!*slot, "forward: two segments of the kind of '", s.name,
                 "'; FLUX.2 takes one text and one target segment");
    *slot = &s;
  }
  FLOWKV_CHECK(p.target && p.text, "forward: a target and a text segment are required");
  for (const SegmentInput* s : {p.target, p.text}) {
    check_inputs(*s);
    FLOWKV_CHECK(!s->time.fixed, "forward: segment '", s->name,
                 "' is modulated by the step's timestep in FLUX.2, not a fixed one");
    check_route(*s, w, a.batch, s->tokens);
  }
  FLOWKV_CHECK(p.target->kv.route == KVRoute::kCompute,
               "forward: the target is computed every call (route compute)");
  p.text_kv = p.text->kv;
  p.N = p.target->tokens;
  p.L = p.text_kv.route == KVRoute::kSplice ? 0 : p.text->tokens;
  check_refs(p, w, a.batch);
  return p;
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
  const Plan plan = plan_of(w, a);
  Run r{ec,
        w,
        a,
        plan,
        *ec.arena,
        BlockLoop(a.hooks),
        a.batch,
        c.dim(),
        c.num_attention_heads,
        c.attention_head_dim,
        c.mlp_hidden(),
        static_cast<float>(c.eps),
        w.compute == DType::kBF16};
  ArenaScope scope(r.ws);
  const int64_t B = r.B, D = r.D, hd = r.hd, L = plan.L, N = plan.N, R = plan.R;

  // 1. Time embedding and the shared modulations (the references have their own, from their
  // fixed time, made when they start).
  float* temb = r.ws.floats(B * D);
  embed_time(r, a.timestep, a.guidance, temb);
  const Mods mods = alloc_mods(r, true);
  modulations(r, temb, mods);
  trace_tensor(ec, "temb", temb, {B, D});
  trace_tensor(ec, "double_stream_mod_img", mods.img, {B, 6 * D});
  trace_tensor(ec, "double_stream_mod_txt", mods.txt, {B, 6 * D});
  trace_tensor(ec, "single_stream_mod", mods.single, {B, 3 * D});

  // 2. Input projections. Live references start here when every block will read them (or
  // store them); otherwise at the first block that does.
  Stream img{alloc(r.ws, B * N, D), N}, txt{alloc(r.ws, B * L, D), L};
  RefStream ref = alloc_refs(r);
  w.x_embedder.forward(ec, gather_rows(r.ws, B, {plan.target}, c.in_channels), img.x);
  if (L > 0) {
    w.context_embedder.forward(ec, gather_rows(r.ws, B, {plan.text}, c.joint_attention_dim), txt.x);
  }
  if (R > 0 && ref.lazy.eager()) refs_to(r, ref, 0);
  const int64_t R0 = ref.lazy.started() ? R : 0;  // references computed so far
  trace_parts(ec, "x_embedder", B, {{ref.s.x, R0}, {img.x, N}});
  if (L > 0) trace_parts(ec, "context_embedder", B, {{txt.x, L}});

  // 3. RoPE tables. The joint [txt; img] table serves the double blocks (split) and the
  // single blocks (whole); references have their own.
  float* cos = r.ws.floats((L + N) * hd);
  float* sin = r.ws.floats((L + N) * hd);
  if (L > 0) rope_tables(plan.text->ids, L, 4, c.axes_dims_rope, c.rope_theta, cos, sin);
  rope_tables(plan.target->ids, N, 4, c.axes_dims_rope, c.rope_theta, cos + L * hd, sin + L * hd);
  trace_rope(ec, "rope_cos", hd, {{cos, L}, {ref.cos, R0}, {cos + L * hd, N}});
  trace_rope(ec, "rope_sin", hd, {{sin, L}, {ref.sin, R0}, {sin + L * hd, N}});

  // 4. Double-stream blocks. Step-cache hooks see the dynamic streams: text (when live) and
  // target.
  txt.cos = cos, txt.sin = sin, txt.mod = mods.txt, txt.mod_width = 6 * D;
  img.cos = cos + L * hd, img.sin = sin + L * hd, img.mod = mods.img, img.mod_width = 6 * D;
  RefStream* refs = R > 0 ? &ref : nullptr;
  cache::Streams streams = outputs(r, txt.x, L, img.x, N);
  r.loop.begin(streams, [&] {  // block 0's modulated target input
    Mat probe = alloc(r.ws, B * N, D);
    ops::layer_norm_modulate(ec, img.x, probe, chunk(img, 1, D), chunk(img, 0, D), r.eps);
    return probe;
  });
  r.loop.run(0, c.num_layers, streams, [&](int64_t i, bool run) {
    double_block(r, i, L > 0 ? &txt : nullptr, img, refs, run);
  });

  // 5. Single-stream blocks over the joint [txt; img] stream (references stay apart).
  const int64_t S = L + N;
  Stream live{alloc(r.ws, B * S, D), S, cos, sin, mods.single, 3 * D};
  for (int64_t b = 0; b < B; ++b) {
    copy_rows(txt.x.rows_slice(b * L, L), live.x.rows_slice(b * S, L));
    copy_rows(img.x.rows_slice(b * N, N), live.x.rows_slice(b * S + L, N));
  }
  streams = outputs(r, live.x, L, live.x.rows_slice(L, live.x.rows - L), N, S);
  r.loop.run(c.num_layers, c.num_blocks(), streams, [&](int64_t layer, bool run) {
    single_block(r, layer - c.num_layers, live, L, refs, run);
  });
  r.loop.end(streams);

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
