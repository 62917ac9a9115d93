// The Qwen-Image-2.1 forward pass (diffusers transformer_qwenimage21.py).
#include "models/qwen_image/model21.h"

#include <cmath>
#include <cstring>
#include <functional>

#include "cache/hooks.h"
#include "flowkv/error.h"
#include "models/common/block_loop.h"
#include "models/common/blocks.h"
#include "models/common/embeddings.h"
#include "models/common/held_bytes.h"
#include "models/qwen_image/weights.h"

namespace flowkv::qwen {

struct Block21Weights {
  ops::Linear qkv, out;  // to_q|to_k|to_v [3D, D]; to_out.0
  ops::Linear mlp_in;    // gate_layer|proj [2M, D]: SiLU(first half) * second half
  ops::Linear mlp_out;
  std::vector<float> norm_q, norm_k;
};

struct Model21::Weights {
  Config21 cfg;
  DType compute = DType::kF32;
  ops::Linear time_1, time_2, text_in, text_out, img_in, modulation, norm_out, proj_out;
  std::vector<float> text_scale;  // zero-centred RMSNorm: weight + 1
  std::vector<Block21Weights> blocks;
};

namespace {

using Getter = std::function<Tensor(const std::string&)>;

std::vector<float> vec(const Tensor& t, float add = 0.0f) {
  const Tensor f = t.to_f32();
  std::vector<float> v(f.f32(), f.f32() + f.numel());
  for (float& x : v) x += add;
  return v;
}

std::shared_ptr<Model21::Weights> build(const Getter& get,
                                        const std::map<std::string, TensorInfo>& stored,
                                        const Config21& c, ops::Compute dt, bool plain) {
  check_weights_fit(weight_table(c), held_bytes(stored, dt.type), "a Qwen-Image-2.1 transformer");
  auto w = std::make_shared<Model21::Weights>();
  w->cfg = c;
  w->compute = dt.type;
  auto lin = [&](const std::string& n) { return ops::Linear(get(n), dt, plain); };
  auto stack = [&](std::vector<std::string> names) {
    std::vector<Tensor> ts;
    for (const auto& n : names) ts.push_back(get(n));
    return ops::Linear::stacked(ts, dt, plain);
  };
  using namespace w21;
  w->time_1 = lin(kTime1);
  w->time_2 = lin(kTime2);
  w->text_scale = vec(get(kTextNorm), 1.0f);
  w->text_in = lin(kTextIn);
  w->text_out = lin(kTextOut);
  w->img_in = lin(kImgIn);
  w->modulation = lin(kModulation);
  w->norm_out = lin(kNormOut);
  w->proj_out = lin(kProjOut);
  for (int64_t i = 0; i < c.num_layers; ++i) {
    auto n = [&](const char* leaf) { return block_name(i, leaf); };
    Block21Weights b;
    b.qkv = stack({n(kToQ), n(kToK), n(kToV)});
    b.out = lin(n(kToOut));
    b.mlp_in = stack({n(kGate), n(kProj)});
    b.mlp_out = lin(n(kOut));
    b.norm_q = vec(get(n(kNormQ)));
    b.norm_k = vec(get(n(kNormK)));
    w->blocks.push_back(std::move(b));
  }
  return w;
}

// The call's segments as this model runs them, resolved and checked once (plan_of).
struct Plan21 {
  const SegmentInput* text = nullptr;  // may be absent (no prompt rows)
  std::vector<const SegmentInput*> conds;
  const SegmentInput* target = nullptr;
  std::vector<Grid> cond_grids;
  SegmentKV prefix_kv;  // the text's: the prefix is one memory
  int64_t L = 0;        // text rows
  int64_t n_cond = 0;   // condition tokens
};

// One forward's shared state.
struct Run {
  const ExecContext& ec;
  const Model21::Weights& w;
  const Args21& a;
  const Plan21& plan;
  Arena& ws;
  const Layout21& lay;
  BlockLoop loop;
  int64_t B, D, H, hd, M;
  float eps;
  bool bf16, causal;
};

// A segment's residual stream: rows of batch element b at [b*seq, (b+1)*seq).
struct Seg {
  Mat x;
  int64_t seq = 0;
  const float* cos = nullptr;
  const float* sin = nullptr;
  ops::ModRows scale1{}, gate1{}, scale2{}, gate2{};  // tanh already applied to the gates
};

// The prefix: buffers for the whole call, its work done lazily (LazySegment).
struct Prefix {
  Seg s;
  const uint8_t* key_valid = nullptr;  // [B, P] or nullptr
  LazySegment lazy{true};
};

// The target stream as step-cache hooks see it.
cache::Streams target_streams(int64_t batch, Mat x, int64_t seq) {
  cache::Streams s;
  s.batch = batch;
  s.s.push_back({"target", x, seq, 0});
  return s;
}

// temb for the batch's timesteps (+ a t = 0 row under causal_condition): [rows, D].
// QwenImage21TemporalTimesteps: args = (1000 * t) * f_i in float32, [cos | sin].
Mat time_embedding(const Run& r, int64_t rows) {
  Mat sinus = alloc_mat(r.ws, rows, 256), hidden = alloc_mat(r.ws, rows, r.D),
      act = alloc_mat(r.ws, rows, r.D), temb = alloc_mat(r.ws, rows, r.D);
  for (int64_t b = 0; b < rows; ++b) {
    float t = b < r.B ? r.a.timestep[b] : 0.0f;
    if (r.bf16) t = round_bf16(t);  // timestep.to(hidden_states.dtype)
    timestep_sinusoid(1000.0f * t, 256, sinus.row(b));
  }
  if (r.bf16) ops::round_bf16(r.ec, sinus);
  r.w.time_1.forward(r.ec, sinus, hidden);
  ops::silu(r.ec, hidden.data, act.data, rows * r.D);
  r.w.time_2.forward(r.ec, act, temb);
  return temb;
}

// The shared modulation [scale1 | gate1 | scale2 | gate2] of every batch timestep; under
// causal_condition row B is the t = 0 row every prefix token reads.
struct Modulation {
  int64_t rows = 0;
  Mat act;    // SiLU(temb) [rows, D]
  Mat mod;    // [rows, 4D]
  Mat gates;  // mod with tanh applied to the gate chunks
};

Modulation modulation(const Run& r) {
  Modulation m;
  m.rows = r.B + (r.causal ? 1 : 0);
  const int64_t D = r.D;
  const Mat temb = time_embedding(r, m.rows);
  m.act = alloc_mat(r.ws, m.rows, D), m.mod = alloc_mat(r.ws, m.rows, 4 * D);
  ops::silu(r.ec, temb.data, m.act.data, m.rows * D);
  r.w.modulation.forward(r.ec, m.act, m.mod);
  trace_tensor(r.ec, "temb", temb.data, {m.rows, D});
  trace_tensor(r.ec, "modulation", m.mod.data, {m.rows, 4 * D});
  m.gates = alloc_mat(r.ws, m.rows, 4 * D);  // the scales are kept as they are
  copy_rows(m.mod, m.gates);
  for (int64_t i = 0; i < m.rows; ++i) {
    for (int k : {1, 3}) {
      float* g = m.gates.row(i) + k * D;
      for (int64_t j = 0; j < D; ++j) g[j] = std::tanh(g[j]);
    }
  }
  return m;
}

// A segment's modulation views: target rows read their sample's row; prefix rows read row B
// under causal_condition (one vector for all).
void set_modulation(const Run& r, const Modulation& m, Seg& s, bool prefix) {
  const bool shared = prefix && r.causal;
  const int64_t stride = shared ? 0 : 4 * r.D, base = shared ? r.B * 4 * r.D : 0;
  auto at = [&](const Mat& t, int k) {
    return ops::ModRows{t.data + base + k * r.D, stride, s.seq};
  };
  s.scale1 = at(m.mod, 0), s.gate1 = at(m.gates, 1), s.scale2 = at(m.mod, 2),
  s.gate2 = at(m.gates, 3);
}

// Zero-centred RMSNorm (in float32), in_layer, GELU(tanh), out_layer.
void text_projection(const Run& r, Mat out) {
  ArenaScope scope(r.ws);
  const int64_t rows = r.B * r.plan.L, C = r.w.cfg.context_in_dim;
  Mat normed = alloc_mat(r.ws, rows, C), hidden = alloc_mat(r.ws, rows, r.D);
  copy_rows(gather_rows(r.ws, r.B, {r.plan.text}, C), normed);
  ops::rms_norm_rope(r.ec, normed, C, r.w.text_scale.data(), r.eps, {});
  r.w.text_in.forward(r.ec, normed, hidden);
  ops::gelu_tanh(r.ec, hidden);
  r.w.text_out.forward(r.ec, hidden, out);
}

// The prefix's input: projected text rows and the condition latents placed at their positions.
// `target_in`: the target's projected rows for the img_in trace (empty when started late).
void start_prefix(const Run& r, Prefix& prefix, Mat target_in) {
  ArenaScope scope(r.ws);
  const Layout21& lay = r.lay;
  const int64_t B = r.B, D = r.D, L = r.plan.L, n_cond = r.plan.n_cond,
                C = r.w.cfg.in_channels * r.w.cfg.patch_size * r.w.cfg.patch_size;
  Mat txt = alloc_mat(r.ws, B * L, D), cond = alloc_mat(r.ws, B * n_cond, D);
  if (L > 0) text_projection(r, txt);
  if (n_cond > 0) r.w.img_in.forward(r.ec, gather_rows(r.ws, B, r.plan.conds, C), cond);
  trace_parts(r.ec, "txt_in", B, {{txt, L}});
  trace_parts(r.ec, "img_in", B, {{cond, n_cond}, {target_in, target_in.data ? lay.T : 0}});
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t p = 0; p < lay.P; ++p) {
      const float* src = lay.text_row[p] >= 0 ? txt.row(b * L + lay.text_row[p])
                                              : cond.row(b * n_cond + lay.image_token[p]);
      std::memcpy(prefix.s.x.row(b * lay.P + p), src, static_cast<size_t>(D) * 4);
    }
  }
}

struct Prep {
  Mat norm, qkv, attn;
};

Prep prepare(const Run& r, const Seg& s, const Block21Weights& w) {
  const int64_t rows = s.x.rows;
  Prep p{alloc_mat(r.ws, rows, r.D), alloc_mat(r.ws, rows, 3 * r.D), alloc_mat(r.ws, rows, r.D)};
  ops::layer_norm_modulate(r.ec, s.x, p.norm, s.scale1, {}, r.eps);
  w.qkv.forward(r.ec, p.norm, p.qkv);
  const ops::RopeRows rope{s.cos, s.sin, s.seq};
  ops::rms_norm_rope(r.ec, p.qkv.cols_slice(0, r.D), r.hd, w.norm_q.data(), r.eps, rope);
  ops::rms_norm_rope(r.ec, p.qkv.cols_slice(r.D, r.D), r.hd, w.norm_k.data(), r.eps, rope);
  round_kv(r.ec, p.qkv, r.D, r.bf16);
  return p;
}

// The MLP sublayer's output: out(SiLU(gate(z)) * proj(z)), z = LN(x)(1+s2).
void mlp_output(const Run& r, const Seg& s, const Block21Weights& w, Mat y) {
  ArenaScope scope(r.ws);
  const int64_t rows = s.x.rows;
  Mat n = alloc_mat(r.ws, rows, r.D), h = alloc_mat(r.ws, rows, 2 * r.M),
      u = alloc_mat(r.ws, rows, r.M);
  ops::layer_norm_modulate(r.ec, s.x, n, s.scale2, {}, r.eps);
  w.mlp_in.forward(r.ec, n, h);
  ops::swiglu(r.ec, h, u);
  w.mlp_out.forward(r.ec, u, y);
}

// x += tanh(g1) * to_out(attn); x += tanh(g2) * mlp(x). A step cache may provide either
// sublayer's output (`loop` without hooks for the prefix, which is never approximated).
// `reuse_attn`: the hooks' answer for this block's attention, asked once per call.
void finish(const Run& r, Seg& s, Mat attn, const Block21Weights& w, const BlockLoop& loop,
            int64_t block, bool reuse_attn) {
  ArenaScope scope(r.ws);
  Mat y = alloc_mat(r.ws, s.x.rows, r.D);
  cache::Streams ys = target_streams(r.B, y, s.seq);
  loop.sublayer(block, cache::Sublayer::kAttention, reuse_attn, ys,
                [&] { w.out.forward(r.ec, attn, y); });
  ops::gated_add(r.ec, s.x, y, s.gate1);
  loop.sublayer(block, cache::Sublayer::kMlp, loop.reuse(block, cache::Sublayer::kMlp), ys,
                [&] { mlp_output(r, s, w, y); });
  ops::gated_add(r.ec, s.x, y, s.gate2);
}

void attend(const Run& r, Mat q, int64_t seq, int64_t q_batch_rows,
            const std::vector<ops::KVSource>& src, Mat out) {
  ops::AttnShape shape{r.B, r.H, r.hd, seq};
  shape.q_batch_rows = q_batch_rows;
  ops::attention(r.ec, shape, q, src, out);
}

// Block i of the prefix, in the caller's arena scope: q|k|v (stored when asked), its queries
// run by run (keys before the run in full, the run itself causal for text or full for an
// image block), the gated updates.
Prep prefix_block(const Run& r, Prefix& prefix, int64_t i) {
  const Block21Weights& w = r.w.blocks[static_cast<size_t>(i)];
  const int64_t P = r.lay.P;
  const uint8_t* valid = prefix.key_valid;
  Prep pp = prepare(r, prefix.s, w);
  store_kv(r.plan.prefix_kv.store, i, pp.qkv, r.D);
  for (const auto& run : r.lay.runs) {
    std::vector<ops::KVSource> src;
    if (run.start > 0) {
      ops::KVSource before = live_kv(pp.qkv, r.D, run.start, P);
      before.valid = valid, before.valid_batch = P;
      src.push_back(before);
    }
    ops::KVSource own =
        live_kv(pp.qkv.rows_slice(run.start, pp.qkv.rows - run.start), r.D, run.end - run.start, P);
    own.causal = run.text;
    own.valid = valid ? valid + run.start : nullptr, own.valid_batch = P;
    src.push_back(own);
    attend(r, pp.qkv.rows_slice(run.start, pp.qkv.rows - run.start).cols_slice(0, r.D),
           run.end - run.start, P, src, pp.attn.rows_slice(run.start, pp.attn.rows - run.start));
  }
  finish(r, prefix.s, pp.attn, w, BlockLoop(nullptr), i, false);
  return pp;
}

// Brings the prefix to block i's input (the blocks nothing read yet, in order).
void prefix_to(const Run& r, Prefix& prefix, int64_t i) {
  prefix.lazy.catch_up(
      i, r.ws, [&] { start_prefix(r, prefix, Mat{}); },
      [&](int64_t j) { prefix_block(r, prefix, j); });
}

// The target's attention at block i over [prefix, target]; `pp`: the prefix's block when live
// (null: its K/V come from the memory).
Prep attend_target(const Run& r, int64_t i, const Seg& target, const Prep* pp,
                   const uint8_t* key_valid) {
  const Block21Weights& w = r.w.blocks[static_cast<size_t>(i)];
  const int64_t P = r.lay.P, T = r.lay.T;
  const TraceBlock n{"transformer_blocks.", i};
  const Prep none;
  const Prep& pf = pp ? *pp : none;
  auto trace2 = [&](const TraceName& name, Mat pm, Mat tm, int64_t heads = 0) {
    trace_parts(r.ec, name, r.B, {{pm, pp ? P : 0}, {tm, T}}, heads);
  };
  Prep pt = prepare(r, target, w);
  if (r.ec.tracer) {
    trace2(n + "norm1", pf.norm, pt.norm);
    const char* names[] = {"attn.q", "attn.k", "attn.v"};
    for (int k = 0; k < 3; ++k) {
      trace2(n + names[k], pp ? pf.qkv.cols_slice(k * r.D, r.D) : Mat{},
             pt.qkv.cols_slice(k * r.D, r.D), r.H);
    }
  }
  // The prefix's keys and values: live (one source over all P, as in decode), or the memory.
  std::vector<ops::KVSource> src;
  if (P > 0) {
    ops::KVSource prefix_kv = pp ? live_kv(pf.qkv, r.D, P) : r.plan.prefix_kv.memory->source(i);
    prefix_kv.valid = key_valid;
    src.push_back(prefix_kv);
  }
  src.push_back(live_kv(pt.qkv, r.D, T));
  attend(r, pt.qkv.cols_slice(0, r.D), T, 0, src, pt.attn);
  trace2(n + "attn.out", pf.attn, pt.attn);
  return pt;
}

// `run`: run the target (false when a step cache skips this block). The prefix (when live)
// runs when this block reads its K/V or stores them.
void block(const Run& r, int64_t i, Prefix* prefix, Seg& target, const uint8_t* key_valid,
           bool run) {
  const int64_t P = r.lay.P, T = r.lay.T;
  const TraceBlock n{"transformer_blocks.", i};
  ArenaScope scope(r.ws);
  // Whether the target computes its attention (the hooks may reuse it).
  const bool reuse_attn = run && r.loop.reuse(i, cache::Sublayer::kAttention);
  const bool attends = run && !reuse_attn;
  const bool with_prefix = prefix && prefix->lazy.needed(attends);
  if (with_prefix) prefix_to(r, *prefix, i);
  Seg* ps = with_prefix ? &prefix->s : nullptr;
  auto trace_in_out = [&](const TraceName& name) {
    trace_parts(r.ec, name, r.B, {{ps ? ps->x : Mat{}, ps ? P : 0}, {target.x, T}});
  };
  trace_in_out(n + "in");
  Prep pp, pt;
  if (with_prefix) {
    pp = prefix_block(r, *prefix, i);
    prefix->lazy.ran(i);
  }
  if (attends) pt = attend_target(r, i, target, with_prefix ? &pp : nullptr, key_valid);
  if (run) finish(r, target, pt.attn, r.w.blocks[static_cast<size_t>(i)], r.loop, i, reuse_attn);
  trace_in_out(n + "out");
}

// The prefix's route and memory (one for text and conditions), against the layout.
void check_prefix_kv(const Run& r) {
  const SegmentKV& kv = r.plan.prefix_kv;
  if (kv.route != KVRoute::kCompute) {
    FLOWKV_CHECK(
        r.causal,
        "this Qwen-Image-2.1 checkpoint has causal_condition = false: its text and condition "
        "tokens are modulated by the current timestep, so their K/V change every step and "
        "cannot be cached");
  }
  FLOWKV_CHECK((kv.route == KVRoute::kComputeAndStore) == (kv.store != nullptr),
               "forward: a prefix store memory goes with the route compute-and-store, and only "
               "with it");
  FLOWKV_CHECK((kv.route == KVRoute::kSplice) == (kv.memory != nullptr),
               "forward: a prefix memory to splice from goes with the route splice, and only with "
               "it");
  for (const KVMemory* m : {static_cast<const KVMemory*>(kv.store), kv.memory}) {
    if (!m) continue;
    FLOWKV_CHECK(m->layers() == r.w.cfg.num_layers && m->width() == r.D && m->batch() == r.B &&
                     m->tokens() == r.lay.P,
                 "prefix KV memory is ", m->layers(), " layers x batch ", m->batch(), " x ",
                 m->tokens(), " tokens x ", m->width(), "; this call needs ", r.w.cfg.num_layers,
                 " x ", r.B, " x ", r.lay.P, " x ", r.D);
  }
  if (kv.memory) {
    FLOWKV_CHECK(kv.memory->complete(), "forward: the prefix KV memory is not filled yet");
  }
}

// One segment's inputs and time: rows unless spliced, a grid that matches for images.
void check_segment(const SegmentInput& s, bool prefix, bool causal) {
  FLOWKV_CHECK(s.tokens >= 0 && (s.rows || s.tokens == 0 || s.kv.route == KVRoute::kSplice),
               "forward: segment '", s.name, "' has no rows");
  if (s.kind != SegmentKind::kText) {
    FLOWKV_CHECK(s.tokens > 0 && s.grid.tokens() == s.tokens, "forward: segment '", s.name,
                 "' has ", s.tokens, " tokens for a ", s.grid.h, " x ", s.grid.w, " grid");
  }
  const bool fixed0 = prefix && causal;
  FLOWKV_CHECK(s.time.fixed == fixed0 && (!s.time.fixed || s.time.timestep == 0.0f),
               "forward: segment '", s.name, "' must be modulated ",
               fixed0 ? "from the fixed time 0 (causal_condition)" : "by the step's timestep");
}

Plan21 plan_of(const Args21& a, bool causal) {
  FLOWKV_CHECK(a.batch > 0 && a.timestep && a.out,
               "forward: batch, timestep and output are required");
  Plan21 p;
  for (const SegmentInput& s : a.segments) {
    if (s.kind == SegmentKind::kReference) {
      p.conds.push_back(&s);
      continue;
    }
    const SegmentInput*& slot = s.kind == SegmentKind::kTarget ? p.target : p.text;
    FLOWKV_CHECK(!slot, "forward: two segments of the kind of '", s.name,
                 "'; Qwen-Image-2.1 takes one text and one target segment");
    slot = &s;
  }
  FLOWKV_CHECK(p.target, "forward: a target segment is required");
  check_segment(*p.target, false, causal);
  FLOWKV_CHECK(p.target->kv.route == KVRoute::kCompute,
               "forward: the target is computed every call (route compute)");
  if (p.text) {
    check_segment(*p.text, true, causal);
    p.prefix_kv = p.text->kv;
    p.L = p.text->tokens;
  }
  for (const SegmentInput* s : p.conds) {
    check_segment(*s, true, causal);
    FLOWKV_CHECK(s->kv.route == p.prefix_kv.route &&
                     (!s->kv.store || s->kv.store == p.prefix_kv.store) &&
                     (!s->kv.memory || s->kv.memory == p.prefix_kv.memory),
                 "forward: condition '", s->name,
                 "' travels differently from the text: the prefix (text and conditions) is one "
                 "KV memory with the text segment's route");
    p.cond_grids.push_back(s->grid);
    p.n_cond += s->tokens;
  }
  return p;
}

// Key validity of the prefix [B, P] (padded prompt rows are never attended to; image tokens
// are valid), or empty when every row is valid.
std::vector<uint8_t> prefix_validity(const Run& r) {
  const SegmentInput* text = r.plan.text;
  if (!text || !text->valid || r.lay.P == 0) return {};
  const int64_t P = r.lay.P, L = r.plan.L;
  std::vector<uint8_t> valid(static_cast<size_t>(r.B * P), 1);
  for (int64_t b = 0; b < r.B; ++b) {
    for (int64_t p = 0; p < P; ++p) {
      if (r.lay.text_row[p] >= 0) valid[b * P + p] = text->valid[b * L + r.lay.text_row[p]];
    }
  }
  return valid;
}

// What the layout traces: the RoPE tables of the computed positions, and (when the prefix is
// live) build_token_metadata's result as diffusers derives it.
void trace_layout(const Run& r, const float* cos, const float* sin, bool prefix_live) {
  if (!r.ec.tracer) return;
  const int64_t P = r.lay.P, T = r.lay.T, hd = r.hd;
  const int64_t first = prefix_live ? 0 : P, n = P + T - first, half = hd / 2;
  Tensor tc = Tensor::empty({n, half}), ts = Tensor::empty({n, half});
  for (int64_t s = 0; s < n; ++s) {
    for (int64_t j = 0; j < half; ++j) {
      tc.f32()[s * half + j] = cos[(first + s) * hd + 2 * j];
      ts.f32()[s * half + j] = sin[(first + s) * hd + 2 * j];
    }
  }
  r.ec.tracer->record("rope_cos", tc);
  r.ec.tracer->record("rope_sin", ts);
  if (!prefix_live) return;
  std::vector<float> ids, tmask;
  for (int64_t p = 0; p < P; ++p)
    ids.push_back(static_cast<float>(r.lay.block[p])), tmask.push_back(0);
  for (int64_t t = 0; t < T; ++t)
    ids.push_back(static_cast<float>(r.plan.cond_grids.size())), tmask.push_back(1);
  trace_tensor(r.ec, "image_ids", ids.data(), {P + T});
  trace_tensor(r.ec, "target_token_mask", tmask.data(), {P + T});
}

// norm_out over the prefix rows and proj_out (diffusers returns them in prefill); traces.
void prefix_output(const Run& r, Prefix& prefix, Mat scale, Mat normed, Mat out) {
  const int64_t B = r.B, D = r.D, P = r.lay.P;
  const auto& c = r.w.cfg;
  Mat prefix_normed{}, prefix_out{};
  if (r.a.prefix_out || r.ec.tracer) {
    prefix_to(r, prefix, c.num_layers);  // every block of the prefix, when any was skipped
    prefix_normed = alloc_mat(r.ws, B * P, D);
    prefix_out = r.a.prefix_out ? make_mat(r.a.prefix_out, B * P, c.out_features())
                                : alloc_mat(r.ws, B * P, c.out_features());
    const ops::ModRows ps =
        r.causal ? ops::ModRows{scale.data + B * D, 0, P} : ops::ModRows{scale.data, D, P};
    ops::layer_norm_modulate(r.ec, prefix.s.x, prefix_normed, ps, {}, r.eps);
    r.w.proj_out.forward(r.ec, prefix_normed, prefix_out);
  }
  const int64_t tp = prefix_out.data ? P : 0;
  trace_parts(r.ec, "norm_out", B, {{prefix_normed, tp}, {normed, r.lay.T}});
  trace_parts(r.ec, "output", B, {{prefix_out, tp}, {out, r.lay.T}});
}

}  // namespace

Model21 Model21::from_tensors(const std::map<std::string, Tensor>& tensors, const Config21& c,
                              const LoadOptions21& opts) {
  std::map<std::string, TensorInfo> infos;
  bool all_bf16 = !tensors.empty();
  for (const auto& [n, t] : tensors) {
    infos[n] = {n, std::string(dtype_name(t.dtype())), true, t.dtype(), t.shape()};
    all_bf16 &= t.dtype() == DType::kBF16;
  }
  const auto problems = check_against_table(infos, weight_table(c));
  FLOWKV_CHECK(problems.empty(),
               format_problems("the weights do not fit this Qwen-Image-2.1 config", problems));
  const DType dt = opts.auto_dtype ? (all_bf16 ? DType::kBF16 : DType::kF32) : opts.compute;
  Model21 m;
  m.w_ = build([&](const std::string& n) { return tensors.at(n); }, infos, c,
               ops::Compute{dt, opts.int8}, opts.keep_plain);
  return m;
}

Model21 Model21::load(const std::string& path, const LoadOptions21& opts) {
  const CheckpointScan scan = scan_checkpoint(path);
  const Config21 c = config21_of(scan);
  const auto problems = check_against_table(scan.tensors, weight_table(c));
  FLOWKV_CHECK(
      problems.empty(),
      format_problems(scan.path + " does not hold a Qwen-Image-2.1 transformer of its config",
                      problems));
  bool all_bf16 = !scan.tensors.empty();
  for (const auto& [n, t] : scan.tensors) all_bf16 &= t.dtype_known && t.dtype == DType::kBF16;
  const DType dt = opts.auto_dtype ? (all_bf16 ? DType::kBF16 : DType::kF32) : opts.compute;
  CheckpointReader reader(scan);
  Model21 m;
  m.w_ = build([&](const std::string& n) { return reader.get(n); }, scan.tensors, c,
               ops::Compute{dt, opts.int8}, opts.keep_plain);
  return m;
}

cache::Topology Model21::topology() const {
  cache::Topology t;
  t.model = "qwen21";
  for (int64_t i = 0; i < config().num_layers; ++i)
    t.blocks.push_back({"transformer_blocks." + std::to_string(i), "joint", true});
  return t;
}

const Config21& Model21::config() const {
  return w_->cfg;
}
DType Model21::compute_dtype() const {
  return w_->compute;
}

void Model21::forward(const ExecContext& ec, const Args21& a) const {
  FLOWKV_CHECK(ec.arena, "forward: the execution context needs a workspace arena");
  const Weights& w = *w_;
  const Config21& c = w.cfg;
  const Plan21 plan = plan_of(a, c.causal_condition);
  const Layout21 lay = build_layout21(plan.L, plan.text ? plan.text->slots : nullptr,
                                      plan.cond_grids, plan.target->grid);
  Run r{ec,
        w,
        a,
        plan,
        *ec.arena,
        lay,
        BlockLoop(a.hooks),
        a.batch,
        c.dim(),
        c.num_attention_heads,
        c.attention_head_dim,
        c.mlp_hidden(),
        static_cast<float>(c.eps),
        w.compute == DType::kBF16,
        c.causal_condition};
  check_prefix_kv(r);
  ArenaScope scope(r.ws);
  const int64_t B = r.B, D = r.D, hd = r.hd, P = lay.P, T = lay.T,
                C = c.in_channels * c.patch_size * c.patch_size;
  const bool prefix_live = plan.prefix_kv.route != KVRoute::kSplice && P > 0;

  // 1. Timestep embedding and the shared modulation.
  const Modulation m = modulation(r);

  // 2. Input projections: the target, and the prefix when live - now when every block will
  // read it (or store it), else at the first block that does.
  Seg target{alloc_mat(r.ws, B * T, D), T};
  Prefix prefix{{alloc_mat(r.ws, B * (prefix_live ? P : 0), D), P}};
  prefix.lazy = LazySegment(plan.prefix_kv.route == KVRoute::kComputeAndStore || !a.hooks);
  w.img_in.forward(ec, gather_rows(r.ws, B, {plan.target}, C), target.x);
  if (prefix_live && prefix.lazy.eager()) {
    prefix.lazy.start([&] { start_prefix(r, prefix, target.x); });
  }

  // 3. RoPE tables, per-segment modulation views, the prefix's key validity.
  float* cos = r.ws.floats((P + T) * hd);
  float* sin = r.ws.floats((P + T) * hd);
  rope_tables21(lay.pos, 0, P + T, c.axes_dims_rope, cos, sin);
  prefix.s.cos = cos, prefix.s.sin = sin;
  target.cos = cos + P * hd, target.sin = sin + P * hd;
  set_modulation(r, m, prefix.s, true);
  set_modulation(r, m, target, false);
  trace_layout(r, cos, sin, plan.prefix_kv.route != KVRoute::kSplice);
  const std::vector<uint8_t> valid = prefix_validity(r);
  prefix.key_valid = valid.empty() ? nullptr : valid.data();
  trace_parts(ec, "joint_in", B, {{prefix.s.x, prefix.lazy.started() ? P : 0}, {target.x, T}});

  // 4. The blocks. Step-cache hooks see the target stream; the prefix is never approximated.
  cache::Streams streams = target_streams(B, target.x, T);
  r.loop.begin(streams, [&] {  // block 0's modulated target input
    Mat probe = alloc_mat(r.ws, B * T, D);
    ops::layer_norm_modulate(ec, target.x, probe, target.scale1, {}, r.eps);
    return probe;
  });
  r.loop.run(0, c.num_layers, streams, [&](int64_t i, bool run) {
    block(r, i, prefix_live ? &prefix : nullptr, target, prefix.key_valid, run);
  });
  r.loop.end(streams);

  // 5. norm_out (scale only, rows selected as for the blocks) and proj_out.
  Mat scale = alloc_mat(r.ws, m.rows, D), normed = alloc_mat(r.ws, B * T, D);
  w.norm_out.forward(ec, m.act, scale);
  ops::layer_norm_modulate(ec, target.x, normed, {scale.data, D, T}, {}, r.eps);
  const Mat out = make_mat(a.out, B * T, c.out_features());
  w.proj_out.forward(ec, normed, out);
  if (prefix_live) {
    prefix_output(r, prefix, scale, normed, out);
  } else {
    trace_parts(ec, "norm_out", B, {{Mat{}, 0}, {normed, T}});
    trace_parts(ec, "output", B, {{Mat{}, 0}, {out, T}});
  }
}

}  // namespace flowkv::qwen
