// The NucleusMoE-Image forward pass (diffusers transformer_nucleusmoe_image.py).
#include "models/nucleus/model.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <functional>

#include "cache/kv_memory.h"
#include "core/parallel.h"
#include "flowkv/error.h"
#include "io/checkpoint.h"
#include "models/common/block_loop.h"
#include "models/common/blocks.h"
#include "models/common/embeddings.h"
#include "models/nucleus/moe.h"
#include "models/nucleus/weights.h"
#include "models/qwen_image/layout21.h"
#include "ops/linear.h"
#include "ops/ops.h"

namespace flowkv::nucleus {

struct BlockWeights {
  ops::Linear mod;     // img_mod.1 [4D, D] + bias: [scale1, gate1, scale2, gate2]
  ops::Linear enc;     // encoder_proj [D, C] + bias
  ops::Linear qkv;     // to_q|to_k|to_v [D + 2KV, D]
  ops::Linear txt_kv;  // add_k_proj|add_v_proj [2KV, D]
  ops::Linear out;     // to_out.0
  std::vector<float> norm_q, norm_k, norm_added_k;
  bool moe = false;
  ops::Linear mlp_gate, mlp_val, mlp_out;  // dense: net.0.proj's gate rows, its value rows; net.2
  MoELayer experts;                        // MoE blocks
};

struct Model::Weights {
  Config cfg;
  DType compute = DType::kF32;
  ops::Linear time_1, time_2, img_in, norm_out, proj_out;
  std::vector<float> time_norm, txt_norm;
  std::vector<BlockWeights> blocks;
};

namespace {

using Getter = std::function<Tensor(const std::string&)>;

// RoPE positions index diffusers' tables of 4096 positions (NucleusMoEEmbedRope).
constexpr int64_t kRopePositions = 4096;

std::vector<float> vec(const Tensor& t) {
  const Tensor f = t.to_f32();
  return std::vector<float>(f.f32(), f.f32() + f.numel());
}

// Bytes a weight occupies once loaded; the experts' 3-D tensors count as their matrices do.
std::function<int64_t(const ExpectedTensor&)> held(const std::map<std::string, TensorInfo>& stored,
                                                   DType compute) {
  return [&stored, compute](const ExpectedTensor& e) {
    const auto it = stored.find(e.name);
    const DType t = it != stored.end() && it->second.dtype_known ? it->second.dtype : DType::kF32;
    Shape s = e.shape;
    if (s.size() == 3) s = {s[0] * s[1], s[2]};
    return ops::held_weight_bytes(t, s, compute);
  };
}

std::shared_ptr<Model::Weights> build(const Getter& get,
                                      const std::map<std::string, TensorInfo>& stored,
                                      const Config& c, ops::Compute dt, bool plain,
                                      ExpertLayout layout) {
  check_weights_fit(weight_table(c, layout == ExpertLayout::kOutputMajor), held(stored, dt.type),
                    "a NucleusMoE-Image transformer");
  auto w = std::make_shared<Model::Weights>();
  w->cfg = c;
  w->compute = dt.type;
  using namespace wn;
  auto lin = [&](const std::string& n) { return ops::Linear(get(n), dt, plain); };
  auto biased = [&](const std::string& base) {
    ops::Linear l = lin(base + ".weight");
    l.set_bias(get(base + ".bias"));
    return l;
  };
  auto stack = [&](std::vector<std::string> names) {
    std::vector<Tensor> ts;
    for (const auto& n : names) ts.push_back(get(n));
    return ops::Linear::stacked(ts, dt, plain);
  };
  w->time_1 = biased(kTime1);
  w->time_2 = biased(kTime2);
  w->time_norm = vec(get(kTimeNorm));
  w->txt_norm = vec(get(kTxtNorm));
  w->img_in = biased(kImgIn);
  w->norm_out = biased(kNormOut);
  w->proj_out = lin(kProjOut);
  const int64_t f = c.dense_inner();
  for (int64_t i = 0; i < c.num_layers; ++i) {
    auto n = [&](const char* leaf) { return block_name(i, leaf); };
    BlockWeights b;
    b.mod = biased(n(kImgMod));
    b.enc = biased(n(kEncoderProj));
    b.qkv = stack({n(kToQ), n(kToK), n(kToV)});
    b.txt_kv = stack({n(kAddK), n(kAddV)});
    b.out = lin(n(kToOut));
    b.norm_q = vec(get(n(kNormQ)));
    b.norm_k = vec(get(n(kNormK)));
    b.norm_added_k = vec(get(n(kNormAddedK)));
    b.moe = c.is_moe(i);
    if (!b.moe) {
      // diffusers' SwiGLU: value = first half of the projection, gate = second half.
      const Tensor in = get(n(kMlpIn));
      b.mlp_val = ops::Linear::rows_of(in, 0, f, dt, plain);
      b.mlp_gate = ops::Linear::rows_of(in, f, f, dt, plain);
      b.mlp_out = lin(n(kMlpOut));
    } else {
      const std::string prefix = block_name(i, kMoE);
      const MoEConfig mc{.dim = c.dim(),
                         .inner = c.moe_intermediate_dim,
                         .experts = c.num_experts,
                         .capacity_factor = c.capacity_factor(i),
                         .use_sigmoid = c.use_sigmoid,
                         .route_scale = c.route_scale};
      b.experts =
          MoELayer::from_tensors([&](const std::string& leaf) { return get(prefix + leaf); }, mc,
                                 layout, dt, plain, prefix);
    }
    w->blocks.push_back(std::move(b));
  }
  return w;
}

// The files against the weight table. check_against_table takes block-quantized types on 2-D
// weights only; the experts' 3-D tensors (output-major in a GGUF file: rows of whole blocks)
// are checked here for presence, shape and a known type, and by MoELayer for which types.
std::vector<std::string> table_problems(const std::map<std::string, TensorInfo>& tensors,
                                        const std::vector<ExpectedTensor>& table) {
  std::map<std::string, TensorInfo> rest = tensors;
  std::vector<ExpectedTensor> plain;
  std::vector<std::string> problems;
  for (const ExpectedTensor& e : table) {
    if (e.shape.size() != 3) {
      plain.push_back(e);
      continue;
    }
    const auto it = rest.find(e.name);
    if (it == rest.end()) {
      problems.push_back("missing tensor " + e.name + " " + shape_str(e.shape));
      continue;
    }
    if (it->second.shape != e.shape) {
      problems.push_back(e.name + ": shape " + shape_str(it->second.shape) + ", expected " +
                         shape_str(e.shape));
    } else if (!it->second.dtype_known) {
      problems.push_back(e.name + ": dtype " + it->second.dtype_name + " cannot be read");
    }
    rest.erase(it);
  }
  const auto more = check_against_table(rest, plain);
  problems.insert(problems.end(), more.begin(), more.end());
  return problems;
}

DType compute_of(bool all_bf16, const LoadOptions& o) {
  return o.auto_dtype ? (all_bf16 ? DType::kBF16 : DType::kF32) : o.compute;
}

// The call's two segments, checked.
struct Plan {
  const SegmentInput* text = nullptr;
  const SegmentInput* target = nullptr;
  int64_t L = 0, N = 0;
  ImageGrid grid{};
};

Plan plan_of(const Args& a, const Config& c, DType kv_dtype) {
  FLOWKV_CHECK(a.batch > 0 && a.timestep && a.out,
               "forward: batch, timestep and output are required");
  Plan p;
  for (const SegmentInput& s : a.segments) {
    FLOWKV_CHECK(s.kind == SegmentKind::kText || s.kind == SegmentKind::kTarget,
                 "forward: segment '", s.name,
                 "' is neither text nor target; NucleusMoE-Image takes one of each");
    const SegmentInput*& slot = s.kind == SegmentKind::kText ? p.text : p.target;
    FLOWKV_CHECK(!slot, "forward: two segments of the kind of '", s.name,
                 "'; NucleusMoE-Image takes one text and one target segment");
    slot = &s;
  }
  FLOWKV_CHECK(p.text && p.target, "forward: NucleusMoE-Image needs a text and a target segment");
  const SegmentInput& t = *p.target;
  p.grid = t.grid, p.N = t.tokens, p.L = p.text->tokens;
  // Image rows/columns index the reference's 4096-position RoPE tables from -(h - h/2).
  FLOWKV_CHECK(t.grid.h > 0 && t.grid.w > 0 && t.grid.h <= 2 * kRopePositions &&
                   t.grid.w <= 2 * kRopePositions,
               "forward: segment '", t.name, "' has a ", t.grid.h, " x ", t.grid.w,
               " grid; each side must be 1 to ", 2 * kRopePositions, " tokens");
  FLOWKV_CHECK(t.rows && t.tokens > 0 && t.grid.tokens() == t.tokens, "forward: segment '", t.name,
               "' has ", t.tokens, " tokens for a ", t.grid.h, " x ", t.grid.w, " grid");
  FLOWKV_CHECK(t.kv.route == KVRoute::kCompute,
               "forward: the target is computed every call (route compute)");
  FLOWKV_CHECK(!t.time.fixed && !p.text->time.fixed,
               "forward: NucleusMoE-Image modulates only the image tokens, by the step's time");
  const SegmentKV& kv = p.text->kv;
  FLOWKV_CHECK(p.L > 0 && p.L <= kRopePositions, "forward: segment '", p.text->name, "' has ", p.L,
               " tokens (1 to ", kRopePositions, ")");
  FLOWKV_CHECK(p.text->rows || kv.route == KVRoute::kSplice, "forward: segment '", p.text->name,
               "' has no rows");
  // Text positions M + l index the same tables.
  const int64_t M = std::max(p.grid.h / 2, p.grid.w / 2);
  FLOWKV_CHECK(M + p.L <= kRopePositions, "forward: a ", p.grid.h, " x ", p.grid.w, " grid with ",
               p.L, " text tokens needs RoPE positions past the reference's ", kRopePositions);
  FLOWKV_CHECK((kv.route == KVRoute::kComputeAndStore) == (kv.store != nullptr),
               "forward: a text store memory goes with the route compute-and-store, and only "
               "with it");
  FLOWKV_CHECK((kv.route == KVRoute::kSplice) == (kv.memory != nullptr),
               "forward: a text memory to splice from goes with the route splice, and only with "
               "it");
  for (const KVMemory* m : {static_cast<const KVMemory*>(kv.store), kv.memory}) {
    if (!m) continue;
    FLOWKV_CHECK(m->layers() == c.num_layers && m->batch() == a.batch && m->tokens() == p.L &&
                     m->width() == c.kv_dim() && m->dtype() == kv_dtype,
                 "text KV memory is ", m->layers(), " layers x batch ", m->batch(), " x ",
                 m->tokens(), " tokens x ", m->width(), " ", dtype_name(m->dtype()),
                 "; this call needs ", c.num_layers, " x ", a.batch, " x ", p.L, " x ", c.kv_dim(),
                 " ", dtype_name(kv_dtype));
  }
  if (kv.memory) {
    FLOWKV_CHECK(kv.memory->complete(), "forward: the text KV memory is not filled yet");
  }
  return p;
}

// One forward's shared state.
struct Run {
  const ExecContext& ec;
  const Model::Weights& w;
  const Plan& plan;
  Arena& ws;
  BlockLoop loop;
  int64_t B, D, KV, H, Hkv, hd, N, L;
  float eps;
  bool bf16;
  Mat temb, act;  // [B, D]: the timestep embedding (after its RMSNorm) and its SiLU
  Mat text;       // [B*L, C] after txt_norm (empty when spliced)
  const float *img_cos, *img_sin, *txt_cos, *txt_sin;
  KVMemory* scratch;  // the live text K/V of one block (route compute)
};

// Under BF16 compute diffusers holds every activation as a bf16 tensor: round where a value
// becomes one that later ops read (the residual stream, embeddings, modulation).
void round_if(const Run& r, Mat m) {
  if (r.bf16) ops::round_bf16(r.ec, m);
}

// diffusers' RMSNorm without RoPE (txt_norm, the timestep norm); under BF16 compute x * rsqrt
// is rounded to bf16 before the weight multiplies it, and the product again.
void rms_norm(const Run& r, Mat m, const std::vector<float>& weight) {
  if (!r.bf16) {
    ops::rms_norm_rope(r.ec, m, m.cols, weight.data(), r.eps, {});
    return;
  }
  ops::rms_norm_rope(r.ec, m, m.cols, nullptr, r.eps, {});
  ops::round_bf16(r.ec, m);
  parallel_for(m.rows, [&](int64_t i) {
    float* row = m.row(i);
    for (int64_t j = 0; j < m.cols; ++j) row[j] *= weight[static_cast<size_t>(j)];
  });
  ops::round_bf16(r.ec, m);
}

// y = LN(x) * (1 + scale) [+ shift] (scale absent: LN(x)); under BF16 compute LN(x), 1 + scale,
// the product and the sum are each rounded to bf16, as diffusers' bf16 tensors are.
void modulate(const Run& r, Mat x, Mat y, ops::ModRows scale, ops::ModRows shift = {}) {
  if (!r.bf16 || !scale.data) {
    ops::layer_norm_modulate(r.ec, x, y, scale, shift, r.eps);
    round_if(r, y);
    return;
  }
  ops::layer_norm_modulate(r.ec, x, y, {}, {}, r.eps);
  ops::round_bf16(r.ec, y);
  parallel_for(y.rows, [&](int64_t i) {
    float* row = y.row(i);
    const float *s = scale.at(i), *b = shift.at(i);
    for (int64_t j = 0; j < y.cols; ++j) {
      row[j] = round_bf16(row[j] * round_bf16(1.0f + s[j]));
      if (b) row[j] = round_bf16(row[j] + b[j]);
    }
  });
}

// x += gate * y; under BF16 compute gate * y and the sum are each rounded to bf16.
void gated_add(const Run& r, Mat x, Mat y, ops::ModRows gate) {
  if (!r.bf16) {
    ops::gated_add(r.ec, x, y, gate);
    return;
  }
  parallel_for(x.rows, [&](int64_t i) {
    float* xr = x.row(i);
    const float *yr = y.row(i), *g = gate.at(i);
    for (int64_t j = 0; j < x.cols; ++j) xr[j] = round_bf16(xr[j] + round_bf16(g[j] * yr[j]));
  });
}

// out = SiLU(gate) * value over h = [gate | value]; under BF16 compute SiLU(gate) and the
// product are each rounded to bf16 (diffusers' SwiGLU on bf16 tensors).
void swiglu(const Run& r, Mat h, Mat out) {
  if (!r.bf16) {
    ops::swiglu(r.ec, h, out);
    return;
  }
  const int64_t f = out.cols;
  parallel_for(h.rows, [&](int64_t i) {
    const float *g = h.row(i), *v = h.row(i) + f;
    float* o = out.row(i);
    for (int64_t j = 0; j < f; ++j) {
      o[j] = round_bf16(v[j] * round_bf16(g[j] / (1.0f + std::exp(-g[j]))));
    }
  });
}

// Per head: RMSNorm then RoPE. Under BF16 compute the normalised value, its product with the
// weight and the rotated value are each rounded to bf16 (diffusers' RMSNorm and
// _apply_rotary_emb_nucleus on bf16 tensors; the rotation itself runs in f32).
void qk_norm_rope(const Run& r, Mat m, const std::vector<float>& weight, ops::RopeRows rope) {
  if (!r.bf16) {
    ops::rms_norm_rope(r.ec, m, r.hd, weight.data(), r.eps, rope);
    return;
  }
  ops::rms_norm_rope(r.ec, m, r.hd, nullptr, r.eps, {});
  ops::round_bf16(r.ec, m);
  parallel_for(m.rows, [&](int64_t i) {
    float* row = m.row(i);
    const float* c = rope.cos + (i % rope.seq) * r.hd;
    const float* sn = rope.sin + (i % rope.seq) * r.hd;
    for (int64_t h = 0; h < m.cols / r.hd; ++h) {
      float* v = row + h * r.hd;
      for (int64_t j = 0; j < r.hd; ++j) v[j] = round_bf16(v[j] * weight[static_cast<size_t>(j)]);
      for (int64_t j = 0; j < r.hd; j += 2) {
        const float a = v[j], b = v[j + 1];
        v[j] = round_bf16(a * c[j] - b * sn[j]);
        v[j + 1] = round_bf16(b * c[j + 1] + a * sn[j + 1]);
      }
    }
  });
}

cache::Streams image_streams(int64_t batch, Mat x, int64_t seq) {
  cache::Streams s;
  s.batch = batch;
  s.s.push_back({"target", x, seq, 0});
  return s;
}

// temb = RMSNorm(linear_2(SiLU(linear_1(sinusoid_D(1000 t))))), [B, D]; act = SiLU(temb).
void time_embedding(Run& r, const float* timestep) {
  const Model::Weights& w = r.w;
  Mat sinus = alloc_mat(r.ws, r.B, r.D), hidden = alloc_mat(r.ws, r.B, 4 * r.D);
  r.temb = alloc_mat(r.ws, r.B, r.D), r.act = alloc_mat(r.ws, r.B, r.D);
  for (int64_t b = 0; b < r.B; ++b) {
    const float t = r.bf16 ? round_bf16(timestep[b]) : timestep[b];  // timestep.to(dtype)
    timestep_sinusoid(t, r.D, sinus.row(b), 1000.0f);
  }
  if (r.bf16) ops::round_bf16(r.ec, sinus);  // timesteps_proj.to(hidden_states.dtype)
  w.time_1.forward(r.ec, sinus, hidden);
  round_if(r, hidden);
  ops::silu(r.ec, hidden.data, hidden.data, r.B * 4 * r.D);
  w.time_2.forward(r.ec, hidden, r.temb);
  round_if(r, r.temb);
  rms_norm(r, r.temb, w.time_norm);
  ops::silu(r.ec, r.temb.data, r.act.data, r.B * r.D);
  trace_tensor(r.ec, "temb", r.temb.data, {r.B, r.D});
}

// RoPE tables (NucleusMoEEmbedRope, scale_rope): the image at frame 0 with a centred grid, text
// token l at M + l on all three axes, M = max(h/2, w/2).
void rope_tables(const Run& r, const Config& c, float* ic, float* is, float* tc, float* ts) {
  const ImageGrid g = r.plan.grid;
  std::vector<std::array<int64_t, 3>> img, txt;
  for (int64_t y = 0; y < g.h; ++y) {
    for (int64_t x = 0; x < g.w; ++x) img.push_back({0, y - (g.h - g.h / 2), x - (g.w - g.w / 2)});
  }
  const int64_t m = std::max(g.h / 2, g.w / 2);
  for (int64_t l = 0; l < r.L; ++l) txt.push_back({m + l, m + l, m + l});
  qwen::rope_tables21(img, 0, r.N, c.axes_dims_rope, ic, is);
  qwen::rope_tables21(txt, 0, r.L, c.axes_dims_rope, tc, ts);
}

// Block i's text keys and values as attention reads them: from the splice memory, or computed
// (encoder_proj, add_k|add_v, norm_added_k, RoPE) into the store memory or the scratch one.
ops::KVSource text_kv(const Run& r, int64_t i, const SegmentKV& route) {
  if (route.route == KVRoute::kSplice) return route.memory->source(i);
  const BlockWeights& w = r.w.blocks[static_cast<size_t>(i)];
  ArenaScope scope(r.ws);
  const int64_t rows = r.B * r.L;
  Mat context = alloc_mat(r.ws, rows, r.D), kv = alloc_mat(r.ws, rows, 2 * r.KV);
  w.enc.forward(r.ec, r.text, context);
  w.txt_kv.forward(r.ec, context, kv);
  round_if(r, kv);
  qk_norm_rope(r, kv.cols_slice(0, r.KV), w.norm_added_k, {r.txt_cos, r.txt_sin, r.L});
  const TraceBlock n{"transformer_blocks.", i};
  // The memory rounds to its dtype: the live path reads the very values a splice reads.
  KVMemory* mem = route.route == KVRoute::kComputeAndStore ? route.store : r.scratch;
  const int64_t layer = mem == r.scratch ? 0 : i;
  mem->store(layer, kv.cols_slice(0, r.KV), kv.cols_slice(r.KV, r.KV));
  if (r.ec.tracer) {
    const Tensor k = mem->keys(layer), v = mem->values(layer);
    trace_tensor(r.ec, n + "attn.txt_k", k.f32(), {r.B, r.L, r.Hkv, r.hd});
    trace_tensor(r.ec, n + "attn.txt_v", v.f32(), {r.B, r.L, r.Hkv, r.hd});
  }
  return mem->source(layer);
}

// The MLP sublayer's output y (before its gate) from the residual x.
void mlp_output(const Run& r, const BlockWeights& w, Mat x, ops::ModRows scale2, Mat y) {
  ArenaScope scope(r.ws);
  const int64_t rows = x.rows;
  Mat xn = alloc_mat(r.ws, rows, r.D), xm = alloc_mat(r.ws, rows, r.D);
  modulate(r, x, xn, {});
  modulate(r, x, xm, scale2);
  if (w.moe) {
    w.experts.forward(r.ec, r.B, r.N, r.temb.data, xn.data, xm.data, y.data);
    return;
  }
  const int64_t f = w.mlp_out.in_features();
  Mat h = alloc_mat(r.ws, rows, 2 * f), u = alloc_mat(r.ws, rows, f);
  w.mlp_gate.forward(r.ec, xm, h.cols_slice(0, f));
  w.mlp_val.forward(r.ec, xm, h.cols_slice(f, f));
  round_if(r, h);
  swiglu(r, h, u);
  w.mlp_out.forward(r.ec, u, y);
}

// Block i over the image stream x. `run`: false when a step cache skips it (x stays; the text
// K/V are still stored when the call stores them).
void block(const Run& r, int64_t i, Mat x, const SegmentKV& route, const uint8_t* valid, bool run) {
  const BlockWeights& w = r.w.blocks[static_cast<size_t>(i)];
  const ExecContext& ec = r.ec;
  const TraceBlock n{"transformer_blocks.", i};
  ArenaScope scope(r.ws);
  trace_parts(ec, n + "in", r.B, {{x, r.N}});
  const bool reuse_attn = run && r.loop.reuse(i, cache::Sublayer::kAttention);
  const bool attends = run && !reuse_attn;
  ops::KVSource txt{};
  if (attends || route.route == KVRoute::kComputeAndStore) txt = text_kv(r, i, route);
  if (!run) return;
  // Modulation [scale1 | gate1 | scale2 | gate2]; gates clamped to [-2, 2], then tanh.
  const int64_t D = r.D;
  Mat mod = alloc_mat(r.ws, r.B, 4 * D);
  w.mod.forward(ec, r.act, mod);
  round_if(r, mod);
  for (int64_t b = 0; b < r.B; ++b) {
    for (int k : {1, 3}) {
      float* g = mod.row(b) + k * D;
      for (int64_t j = 0; j < D; ++j) g[j] = std::tanh(std::clamp(g[j], -2.0f, 2.0f));
    }
  }
  round_if(r, mod);
  auto part = [&](int k) { return ops::ModRows{mod.data + k * D, 4 * D, r.N}; };
  Mat attn = alloc_mat(r.ws, x.rows, D);
  if (attends) {
    ArenaScope s2(r.ws);
    const int64_t qkv_cols = D + 2 * r.KV;
    Mat norm = alloc_mat(r.ws, x.rows, D), qkv = alloc_mat(r.ws, x.rows, qkv_cols);
    modulate(r, x, norm, part(0));
    w.qkv.forward(ec, norm, qkv);
    round_if(r, qkv);
    const ops::RopeRows rope{r.img_cos, r.img_sin, r.N};
    qk_norm_rope(r, qkv.cols_slice(0, D), w.norm_q, rope);
    qk_norm_rope(r, qkv.cols_slice(D, r.KV), w.norm_k, rope);
    if (ec.tracer) {
      trace_parts(ec, n + "norm1", r.B, {{norm, r.N}});
      trace_parts(ec, n + "attn.q", r.B, {{qkv.cols_slice(0, D), r.N}}, r.H);
      trace_parts(ec, n + "attn.k", r.B, {{qkv.cols_slice(D, r.KV), r.N}}, r.Hkv);
      trace_parts(ec, n + "attn.v", r.B, {{qkv.cols_slice(D + r.KV, r.KV), r.N}}, r.Hkv);
    }
    // Keys: [image | text], the text keys masked where the prompt is padding.
    txt.valid = valid, txt.valid_batch = r.L;
    const std::vector<ops::KVSource> src{
        ops::KVSource::f32(qkv.cols_slice(D, r.KV), qkv.cols_slice(D + r.KV, r.KV), r.N), txt};
    ops::AttnShape shape{r.B, r.H, r.hd, r.N};
    shape.kv_heads = r.Hkv;
    ops::attention(ec, shape, qkv.cols_slice(0, D), src, attn);
    trace_parts(ec, n + "attn.out", r.B, {{attn, r.N}});
  }
  Mat y = alloc_mat(r.ws, x.rows, D);
  cache::Streams ys = image_streams(r.B, y, r.N);
  r.loop.sublayer(i, cache::Sublayer::kAttention, reuse_attn, ys,
                  [&] { w.out.forward(ec, attn, y); });
  round_if(r, y);
  gated_add(r, x, y, part(1));
  r.loop.sublayer(i, cache::Sublayer::kMlp, r.loop.reuse(i, cache::Sublayer::kMlp), ys,
                  [&] { mlp_output(r, w, x, part(2), y); });
  round_if(r, y);
  trace_parts(ec, n + "mlp", r.B, {{y, r.N}});
  gated_add(r, x, y, part(3));
  trace_parts(ec, n + "out", r.B, {{x, r.N}});
}

}  // namespace

Model Model::from_tensors(const std::map<std::string, Tensor>& tensors, const Config& c,
                          const LoadOptions& opts) {
  c.validate("NucleusMoE config");
  std::map<std::string, TensorInfo> infos;
  bool all_bf16 = !tensors.empty();
  for (const auto& [n, t] : tensors) {
    TensorInfo& info = infos[n];
    info.name = n, info.dtype_name = dtype_name(t.dtype()), info.dtype_known = true;
    info.dtype = t.dtype(), info.shape = t.shape();
    all_bf16 &= t.dtype() == DType::kBF16;
  }
  const auto problems = table_problems(infos, weight_table(c));
  FLOWKV_CHECK(problems.empty(),
               format_problems("the tensors are not a NucleusMoE-Image transformer of its config",
                               problems));
  Model m;
  m.w_ = build([&](const std::string& n) { return tensors.at(n); }, infos, c,
               ops::Compute{compute_of(all_bf16, opts), opts.int8}, opts.keep_plain,
               ExpertLayout::kInputMajor);
  return m;
}

Model Model::load(const std::string& path, const LoadOptions& opts) {
  const CheckpointScan scan = scan_checkpoint(path);
  const bool gguf = scan.gguf != nullptr;
  FLOWKV_CHECK(scan.config, scan.path,
               gguf ? ": the GGUF file has no flowkv.config metadata; NucleusMoE-Image needs its "
                      "config (write the file with `flowkv quantize`)"
                    : ": no config.json beside the NucleusMoE-Image weights");
  const Config c =
      Config::from_json(*scan.config, scan.path + (gguf ? " (flowkv.config)" : "/config.json"));
  // `flowkv quantize` writes the experts output-major (rows of whole blocks); diffusers'
  // safetensors hold them pre-transposed for x @ W.
  const ExpertLayout layout = gguf ? ExpertLayout::kOutputMajor : ExpertLayout::kInputMajor;
  const auto problems = table_problems(scan.tensors, weight_table(c, gguf));
  FLOWKV_CHECK(problems.empty(),
               format_problems(scan.path + " does not hold a NucleusMoE-Image transformer of its "
                                           "config",
                               problems));
  bool all_bf16 = !scan.tensors.empty();
  for (const auto& [n, t] : scan.tensors) all_bf16 &= t.dtype_known && t.dtype == DType::kBF16;
  CheckpointReader reader(scan);
  Model m;
  m.w_ = build([&](const std::string& n) { return reader.get(n); }, scan.tensors, c,
               ops::Compute{compute_of(all_bf16, opts), opts.int8}, opts.keep_plain, layout);
  return m;
}

const Config& Model::config() const {
  return w_->cfg;
}

DType Model::compute_dtype() const {
  return w_->compute;
}

int64_t Model::weight_bytes() const {
  const Weights& w = *w_;
  int64_t n = 0;
  for (const ops::Linear* l : {&w.time_1, &w.time_2, &w.img_in, &w.norm_out, &w.proj_out})
    n += l->packed_bytes();
  n += static_cast<int64_t>(w.time_norm.size() + w.txt_norm.size()) * 4;
  for (const BlockWeights& b : w.blocks) {
    for (const ops::Linear* l :
         {&b.mod, &b.enc, &b.qkv, &b.txt_kv, &b.out, &b.mlp_gate, &b.mlp_val, &b.mlp_out})
      n += l->packed_bytes();
    n += static_cast<int64_t>(b.norm_q.size() + b.norm_k.size() + b.norm_added_k.size()) * 4;
    if (b.moe) n += b.experts.bytes();
  }
  return n;
}

cache::Topology Model::topology() const {
  cache::Topology t;
  t.model = "nucleus";
  for (int64_t i = 0; i < config().num_layers; ++i)
    t.blocks.push_back({"transformer_blocks." + std::to_string(i), "single", true});
  return t;
}

void Model::forward(const ExecContext& ec, const Args& a) const {
  FLOWKV_CHECK(ec.arena, "forward: the execution context needs a workspace arena");
  const Weights& w = *w_;
  const Config& c = w.cfg;
  const Plan plan = plan_of(a, c, kv_dtype());
  const SegmentKV& route = plan.text->kv;
  // The live text K/V of one block pass through a memory of the stored dtype (see model.h).
  std::unique_ptr<KVMemory> scratch;
  if (route.route == KVRoute::kCompute) {
    scratch = std::make_unique<KVMemory>(1, a.batch, plan.L, c.kv_dim(), kv_dtype());
  }
  Run r{ec,
        w,
        plan,
        *ec.arena,
        BlockLoop(a.hooks),
        a.batch,
        c.dim(),
        c.kv_dim(),
        c.num_attention_heads,
        c.num_key_value_heads,
        c.attention_head_dim,
        plan.N,
        plan.L,
        static_cast<float>(c.eps),
        w.compute == DType::kBF16,
        {},
        {},
        {},
        nullptr,
        nullptr,
        nullptr,
        nullptr,
        scratch.get()};
  ArenaScope scope(r.ws);
  const int64_t B = r.B, D = r.D, N = r.N, L = r.L, hd = r.hd;

  // 1. img_in, txt_norm (unless spliced), the timestep embedding.
  Mat x = alloc_mat(r.ws, B * N, D);
  w.img_in.forward(ec, gather_rows(r.ws, B, {plan.target}, c.in_channels), x);
  round_if(r, x);
  trace_parts(ec, "img_in", B, {{x, N}});
  if (route.route != KVRoute::kSplice) {
    const int64_t C = c.joint_attention_dim;
    r.text = alloc_mat(r.ws, B * L, C);
    copy_rows(gather_rows(r.ws, B, {plan.text}, C), r.text);
    rms_norm(r, r.text, w.txt_norm);
    trace_parts(ec, "txt_norm", B, {{r.text, L}});
  }
  time_embedding(r, a.timestep);

  // 2. RoPE tables.
  float* tables = r.ws.floats(2 * (N + L) * hd);
  r.img_cos = tables, r.img_sin = tables + N * hd;
  r.txt_cos = tables + 2 * N * hd, r.txt_sin = tables + (2 * N + L) * hd;
  rope_tables(r, c, tables, tables + N * hd, tables + 2 * N * hd, tables + (2 * N + L) * hd);

  // 3. The blocks; step caches see the image stream.
  cache::Streams streams = image_streams(B, x, N);
  r.loop.begin(streams, [&] {  // block 0's modulated input
    Mat mod = alloc_mat(r.ws, B, 4 * D), probe = alloc_mat(r.ws, B * N, D);
    if (c.num_layers > 0) w.blocks[0].mod.forward(ec, r.act, mod);
    round_if(r, mod);
    modulate(r, x, probe, {mod.data, 4 * D, N});
    return probe;
  });
  r.loop.run(0, c.num_layers, streams,
             [&](int64_t i, bool run) { block(r, i, x, route, plan.text->valid, run); });
  r.loop.end(streams);

  // 4. norm_out ([scale, shift] from SiLU(temb), with bias) and proj_out (no bias).
  Mat emb = alloc_mat(r.ws, B, 2 * D), normed = alloc_mat(r.ws, B * N, D);
  w.norm_out.forward(ec, r.act, emb);
  round_if(r, emb);
  modulate(r, x, normed, {emb.data, 2 * D, N}, {emb.data + D, 2 * D, N});
  const Mat out = make_mat(a.out, B * N, c.out_features());
  w.proj_out.forward(ec, normed, out);
  trace_parts(ec, "norm_out", B, {{normed, N}});
  trace_parts(ec, "output", B, {{out, N}});
}

}  // namespace flowkv::nucleus
