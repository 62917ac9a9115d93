// The Qwen-Image-2.1 forward pass (diffusers transformer_qwenimage21.py).
#include "models/qwen_image/model21.h"

#include <cmath>
#include <functional>

#include "cache/hooks.h"
#include "flowkv/error.h"
#include "models/common/blocks.h"
#include "models/common/embeddings.h"
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

std::shared_ptr<Model21::Weights> build(const Getter& get, const Config21& c, DType dt,
                                        bool plain) {
  check_weights_fit(weight_table(c), "a Qwen-Image-2.1 transformer");
  auto w = std::make_shared<Model21::Weights>();
  w->cfg = c;
  w->compute = dt;
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

// One forward's shared state.
struct Run {
  const ExecContext& ec;
  const Model21::Weights& w;
  const Args21& a;
  Arena& ws;
  const Layout21& lay;
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
  ops::ModRows scale1, gate1, scale2, gate2;  // tanh already applied to the gates
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

// Zero-centred RMSNorm (in float32), in_layer, GELU(tanh), out_layer.
void text_projection(const Run& r, Mat out) {
  ArenaScope scope(r.ws);
  const int64_t rows = r.B * r.a.text_len, C = r.w.cfg.context_in_dim;
  Mat normed = alloc_mat(r.ws, rows, C), hidden = alloc_mat(r.ws, rows, r.D);
  copy_rows({const_cast<float*>(r.a.text), rows, C, C}, normed);
  ops::rms_norm_rope(r.ec, normed, C, r.w.text_scale.data(), r.eps, {});
  r.w.text_in.forward(r.ec, normed, hidden);
  ops::gelu_tanh(r.ec, hidden);
  r.w.text_out.forward(r.ec, hidden, out);
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
// sublayer's output (`hooks` null for the prefix, which is never approximated).
// `reuse_attn`: the hooks' answer for this block's attention, asked once per call (policies
// count the calls).
void finish(const Run& r, Seg& s, Mat attn, const Block21Weights& w, int block,
            cache::BlockHooks* hooks, bool reuse_attn) {
  ArenaScope scope(r.ws);
  Mat y = alloc_mat(r.ws, s.x.rows, r.D);
  cache::Streams ys = target_streams(r.B, y, s.seq);
  if (reuse_attn) {
    hooks->fetch(block, cache::Sublayer::kAttention, ys);
  } else {
    w.out.forward(r.ec, attn, y);
    if (hooks) hooks->store(block, cache::Sublayer::kAttention, ys);
  }
  ops::gated_add(r.ec, s.x, y, s.gate1);
  if (hooks && hooks->reuse(block, cache::Sublayer::kMlp)) {
    hooks->fetch(block, cache::Sublayer::kMlp, ys);
  } else {
    mlp_output(r, s, w, y);
    if (hooks) hooks->store(block, cache::Sublayer::kMlp, ys);
  }
  ops::gated_add(r.ec, s.x, y, s.gate2);
}

void attend(const Run& r, Mat q, int64_t seq, int64_t q_batch_rows,
            const std::vector<ops::KVSource>& src, Mat out) {
  ops::AttnShape shape{r.B, r.H, r.hd, seq};
  shape.q_batch_rows = q_batch_rows;
  ops::attention(r.ec, shape, q, src, out);
}

// `dynamic`: run the target (false when a step cache skips this block; the prefix, cached
// exactly, always runs).
void block(const Run& r, int64_t i, Seg* prefix, Seg& target, const uint8_t* key_valid,
           bool dynamic) {
  const Block21Weights& w = r.w.blocks[static_cast<size_t>(i)];
  cache::BlockHooks* hooks = r.a.hooks;
  const int blk = static_cast<int>(i);
  // Whether the target computes its attention (the hooks may reuse it).
  const bool reuse_attn = dynamic && hooks && hooks->reuse(blk, cache::Sublayer::kAttention);
  const bool attend_target = dynamic && !reuse_attn;
  const ExecContext& ec = r.ec;
  const int64_t P = r.lay.P, T = r.lay.T;
  const TraceBlock n{"transformer_blocks.", i};
  ArenaScope scope(r.ws);
  auto trace2 = [&](const TraceName& name, Mat pm, Mat tm, int64_t heads = 0) {
    trace_parts(ec, name, r.B, {{pm, prefix ? P : 0}, {tm, T}}, heads);
  };
  trace2(n + "in", prefix ? prefix->x : Mat{}, target.x);
  Prep pp, pt;
  if (attend_target) pt = prepare(r, target, w);
  if (prefix) pp = prepare(r, *prefix, w);
  if (ec.tracer && attend_target) {
    trace2(n + "norm1", pp.norm, pt.norm);
    const char* names[] = {"attn.q", "attn.k", "attn.v"};
    for (int k = 0; k < 3; ++k) {
      trace2(n + names[k], prefix ? pp.qkv.cols_slice(k * r.D, r.D) : Mat{},
             pt.qkv.cols_slice(k * r.D, r.D), r.H);
    }
  }
  // The prefix's keys and values: live (one source over all P, as in decode), or the memory.
  ops::KVSource prefix_kv;
  if (prefix) {
    store_kv(r.a.prefix_kv.store, i, pp.qkv, r.D);
    prefix_kv = live_kv(pp.qkv, r.D, P);
  } else if (P > 0) {
    prefix_kv = r.a.prefix_kv.memory->source(i);
  }
  prefix_kv.valid = key_valid;
  // Prefix queries, run by run: keys before the run in full, the run itself causal (text) or
  // full (an image block).
  if (prefix) {
    for (const auto& run : r.lay.runs) {
      std::vector<ops::KVSource> src;
      if (run.start > 0) {
        ops::KVSource before = live_kv(pp.qkv, r.D, run.start, P);
        before.valid = key_valid, before.valid_batch = P;
        src.push_back(before);
      }
      ops::KVSource own = live_kv(pp.qkv.rows_slice(run.start, pp.qkv.rows - run.start), r.D,
                                  run.end - run.start, P);
      own.causal = run.text;
      own.valid = key_valid ? key_valid + run.start : nullptr, own.valid_batch = P;
      src.push_back(own);
      const int64_t len = run.end - run.start;
      attend(r, pp.qkv.rows_slice(run.start, pp.qkv.rows - run.start).cols_slice(0, r.D), len, P,
             src, pp.attn.rows_slice(run.start, pp.attn.rows - run.start));
    }
  }
  // Target queries see everything: [prefix, target].
  if (attend_target) {
    std::vector<ops::KVSource> src;
    if (P > 0) src.push_back(prefix_kv);
    src.push_back(live_kv(pt.qkv, r.D, T));
    attend(r, pt.qkv.cols_slice(0, r.D), T, 0, src, pt.attn);
    trace2(n + "attn.out", pp.attn, pt.attn);
  }
  if (prefix) finish(r, *prefix, pp.attn, w, blk, nullptr, false);
  if (dynamic) finish(r, target, pt.attn, w, blk, hooks, reuse_attn);
  trace2(n + "out", prefix ? prefix->x : Mat{}, target.x);
}

void check(const Run& r) {
  const Args21& a = r.a;
  FLOWKV_CHECK(a.batch > 0 && a.target && a.timestep && a.out,
               "forward: target, timestep and output are required");
  FLOWKV_CHECK(a.text_len >= 0 && (a.text || a.text_len == 0), "forward: text rows missing");
  if (a.prefix_kv.store || a.prefix_kv.memory) {
    FLOWKV_CHECK(
        r.causal,
        "this Qwen-Image-2.1 checkpoint has causal_condition = false: its text and condition "
        "tokens are modulated by the current timestep, so their K/V change every step and "
        "cannot be cached");
  }
  FLOWKV_CHECK(!(a.prefix_kv.store && a.prefix_kv.memory),
               "forward: store the prefix or read it, not both");
  for (const KVMemory* m : {static_cast<const KVMemory*>(a.prefix_kv.store), a.prefix_kv.memory}) {
    if (!m) continue;
    FLOWKV_CHECK(m->layers() == r.w.cfg.num_layers && m->width() == r.D && m->batch() == r.B &&
                     m->tokens() == r.lay.P,
                 "prefix KV memory is ", m->layers(), " layers x batch ", m->batch(), " x ",
                 m->tokens(), " tokens x ", m->width(), "; this call needs ", r.w.cfg.num_layers,
                 " x ", r.B, " x ", r.lay.P, " x ", r.D);
  }
  if (a.prefix_kv.memory) {
    FLOWKV_CHECK(a.prefix_kv.memory->complete(), "forward: the prefix KV memory is not filled yet");
  }
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
  m.w_ = build([&](const std::string& n) { return tensors.at(n); }, c, dt, opts.keep_plain);
  return m;
}

Model21 Model21::load(const std::string& path, const LoadOptions21& opts) {
  const CheckpointScan scan = scan_checkpoint(path);
  FLOWKV_CHECK(scan.config, path, ": a Qwen-Image-2.1 checkpoint needs its config.json");
  const Config21 c = Config21::from_json(*scan.config, scan.path + "/config.json");
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
  m.w_ = build([&](const std::string& n) { return reader.get(n); }, c, dt, opts.keep_plain);
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
  const Layout21 lay = build_layout21(a.text_len, a.slots, a.cond_grids, a.target_grid);
  Run r{ec,
        w,
        a,
        *ec.arena,
        lay,
        a.batch,
        c.dim(),
        c.num_attention_heads,
        c.attention_head_dim,
        c.mlp_hidden(),
        static_cast<float>(c.eps),
        w.compute == DType::kBF16,
        c.causal_condition};
  check(r);
  ArenaScope scope(r.ws);
  const int64_t B = r.B, D = r.D, hd = r.hd, P = lay.P, T = lay.T,
                C = c.in_channels * c.patch_size * c.patch_size;
  const bool prefix_live = a.prefix_kv.memory == nullptr;

  // Timestep embedding and the shared modulation [scale1 | gate1 | scale2 | gate2]; under
  // causal_condition row B is the t = 0 row every prefix token reads.
  const int64_t rows = B + (r.causal ? 1 : 0);
  const Mat temb = time_embedding(r, rows);
  Mat act = alloc_mat(r.ws, rows, D), mod = alloc_mat(r.ws, rows, 4 * D);
  ops::silu(ec, temb.data, act.data, rows * D);
  w.modulation.forward(ec, act, mod);
  trace_tensor(ec, "temb", temb.data, {rows, D});
  trace_tensor(ec, "modulation", mod.data, {rows, 4 * D});
  Mat gates = alloc_mat(r.ws, rows, 4 * D);  // tanh of the gate chunks (scales kept as they are)
  copy_rows(mod, gates);
  for (int64_t i = 0; i < rows; ++i) {
    for (int k : {1, 3}) {
      float* g = gates.row(i) + k * D;
      for (int64_t j = 0; j < D; ++j) g[j] = std::tanh(g[j]);
    }
  }
  auto mods = [&](int64_t seq, bool prefix) {
    // Target rows read their sample's row; prefix rows read row B (one vector for all).
    const bool shared = prefix && r.causal;
    const int64_t stride = shared ? 0 : 4 * D, base = shared ? B * 4 * D : 0;
    auto at = [&](const Mat& m, int k) { return ops::ModRows{m.data + base + k * D, stride, seq}; };
    return std::array<ops::ModRows, 4>{at(mod, 0), at(gates, 1), at(mod, 2), at(gates, 3)};
  };

  // Input projections: the target, and (when live) the prefix: projected text rows and the
  // condition latents placed at their positions.
  Seg target{alloc_mat(r.ws, B * T, D), T}, prefix{alloc_mat(r.ws, B * P, D), P};
  w.img_in.forward(ec, {const_cast<float*>(a.target), B * T, C, C}, target.x);
  if (prefix_live && P > 0) {
    int64_t n_cond = 0;
    for (const Grid& g : a.cond_grids) n_cond += g.tokens();
    Mat txt = alloc_mat(r.ws, B * a.text_len, D), cond = alloc_mat(r.ws, B * n_cond, D);
    if (a.text_len > 0) text_projection(r, txt);
    if (n_cond > 0) w.img_in.forward(ec, {const_cast<float*>(a.cond), B * n_cond, C, C}, cond);
    trace_parts(ec, "txt_in", B, {{txt, a.text_len}});
    trace_parts(ec, "img_in", B, {{cond, n_cond}, {target.x, T}});
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t p = 0; p < P; ++p) {
        const float* src = lay.text_row[p] >= 0 ? txt.row(b * a.text_len + lay.text_row[p])
                                                : cond.row(b * n_cond + lay.image_token[p]);
        std::memcpy(prefix.x.row(b * P + p), src, static_cast<size_t>(D) * 4);
      }
    }
  }
  // RoPE tables and per-segment modulation views.
  float* cos = r.ws.floats((P + T) * hd);
  float* sin = r.ws.floats((P + T) * hd);
  rope_tables21(lay.pos, 0, P + T, c.axes_dims_rope, cos, sin);
  prefix.cos = cos, prefix.sin = sin;
  target.cos = cos + P * hd, target.sin = sin + P * hd;
  {
    const auto mp = mods(P, true), mt = mods(T, false);
    prefix.scale1 = mp[0], prefix.gate1 = mp[1], prefix.scale2 = mp[2], prefix.gate2 = mp[3];
    target.scale1 = mt[0], target.gate1 = mt[1], target.scale2 = mt[2], target.gate2 = mt[3];
  }
  if (ec.tracer) {
    const int64_t first = prefix_live ? 0 : P, n = P + T - first, half = hd / 2;
    Tensor tc = Tensor::empty({n, half}), ts = Tensor::empty({n, half});
    for (int64_t s = 0; s < n; ++s) {
      for (int64_t j = 0; j < half; ++j) {
        tc.f32()[s * half + j] = cos[(first + s) * hd + 2 * j];
        ts.f32()[s * half + j] = sin[(first + s) * hd + 2 * j];
      }
    }
    ec.tracer->record("rope_cos", tc);
    ec.tracer->record("rope_sin", ts);
  }
  // Key validity of the prefix (padded prompt rows are never attended to); image tokens valid.
  const uint8_t* key_valid = nullptr;
  std::vector<uint8_t> valid;
  if (a.text_valid && P > 0) {
    valid.assign(static_cast<size_t>(B * P), 1);
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t p = 0; p < P; ++p) {
        if (lay.text_row[p] >= 0) valid[b * P + p] = a.text_valid[b * a.text_len + lay.text_row[p]];
      }
    }
    key_valid = valid.data();
  }
  if (ec.tracer && prefix_live) {  // build_token_metadata's result, as diffusers derives it
    std::vector<float> ids, tmask;
    for (int64_t p = 0; p < P; ++p)
      ids.push_back(static_cast<float>(lay.block[p])), tmask.push_back(0);
    for (int64_t t = 0; t < T; ++t)
      ids.push_back(static_cast<float>(a.cond_grids.size())), tmask.push_back(1);
    trace_tensor(ec, "image_ids", ids.data(), {P + T});
    trace_tensor(ec, "target_token_mask", tmask.data(), {P + T});
  }
  trace_parts(ec, "joint_in", B, {{prefix.x, prefix_live ? P : 0}, {target.x, T}});
  // Step-cache hooks see the target stream; the prefix is never approximated.
  cache::BlockHooks* hooks = a.hooks;
  cache::Streams streams = target_streams(B, target.x, T);
  if (hooks) {
    Mat probe{};
    if (hooks->wants_probe()) {  // block 0's modulated target input
      probe = alloc_mat(r.ws, B * T, D);
      ops::layer_norm_modulate(ec, target.x, probe, target.scale1, {}, r.eps);
    }
    hooks->begin(streams, probe);
  }
  for (int64_t i = 0; i < c.num_layers; ++i) {
    const bool run =
        !hooks || hooks->before_block(static_cast<int>(i), streams) == cache::BlockAction::kRun;
    block(r, i, prefix_live && P > 0 ? &prefix : nullptr, target, key_valid, run);
    if (hooks) hooks->after_block(static_cast<int>(i), streams);
  }
  if (hooks) hooks->end(streams);

  // norm_out (scale only, rows selected as for the blocks) and proj_out.
  Mat scale = alloc_mat(r.ws, rows, D), normed = alloc_mat(r.ws, B * T, D);
  w.norm_out.forward(ec, act, scale);
  ops::layer_norm_modulate(ec, target.x, normed, {scale.data, D, T}, {}, r.eps);
  const Mat out = make_mat(a.out, B * T, c.out_features());
  w.proj_out.forward(ec, normed, out);
  Mat prefix_normed{}, prefix_out{};
  if (prefix_live && P > 0 && (a.prefix_out || ec.tracer)) {
    prefix_normed = alloc_mat(r.ws, B * P, D);
    prefix_out = a.prefix_out ? make_mat(a.prefix_out, B * P, c.out_features())
                              : alloc_mat(r.ws, B * P, c.out_features());
    const ops::ModRows ps =
        r.causal ? ops::ModRows{scale.data + B * D, 0, P} : ops::ModRows{scale.data, D, P};
    ops::layer_norm_modulate(ec, prefix.x, prefix_normed, ps, {}, r.eps);
    w.proj_out.forward(ec, prefix_normed, prefix_out);
  }
  const int64_t tp = prefix_out.data ? P : 0;
  trace_parts(ec, "norm_out", B, {{prefix_normed, tp}, {normed, T}});
  trace_parts(ec, "output", B, {{prefix_out, tp}, {out, T}});
}

}  // namespace flowkv::qwen
