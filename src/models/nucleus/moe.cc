// NucleusMoE-Image's MoE layer (see moe.h). Rounding follows what diffusers 0.42.1 computes on
// CPU, measured with its torch (2.15):
// - torch.topk(k) on CPU fills a queue of (value, index) pairs and runs libstdc++'s
//   std::partial_sort (when k * 64 <= n) or std::nth_element then std::sort of the first k - 1
//   (otherwise) with the comparator "a > b, NaN first". Neither is stable: equal scores come out
//   in the order those algorithms leave them, not by index, and at the boundary they decide
//   which tokens are chosen. Running the same algorithms with the same comparator here
//   reproduces torch's indices, ties included (checked on thousands of tie-heavy rows and in the
//   golden dumps). That needs libstdc++ (GCC's, and clang's default on Linux): libc++'s
//   algorithms order ties differently, which the golden "ties" case would show.
// - scatter_add (token_score_sums, and the routed rows onto the shared expert's output)
//   accumulates in f32 in index order, starting from the destination's value, and rounds to the
//   destination dtype once at the end: under bf16 not one rounding per add.
#include "models/nucleus/moe.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

#include "core/arena.h"
#include "core/parallel.h"
#include "flowkv/error.h"
#include "ops/ops.h"

namespace flowkv::nucleus {

struct MoELayer::Weights {
  MoEConfig c;
  bool bf16 = false;                  // the reference's dtype is bfloat16: round where it rounds
  ops::Linear router;                 // [E, 2D]
  ops::Linear shared_in, shared_out;  // [2I, D] (value | gate), [D, I]
  std::vector<ops::Linear> gate_up, down;  // per expert: [2I, D] (gate | up), [D, I]
};

namespace {

constexpr int64_t kRouterRows = 64;  // router input rows built per task
constexpr int64_t kSwigluRows = 64;  // rows per task of the activation
constexpr int64_t kScatterCols = 64;

void check_shape(const Tensor& t, const std::string& prefix, const char* leaf, const Shape& want) {
  FLOWKV_CHECK(t.defined(), "NucleusMoE layer: tensor ", prefix, leaf, " is missing");
  FLOWKV_CHECK(t.shape() == want, "NucleusMoE layer: tensor ", prefix, leaf, " has shape ",
               shape_str(t.shape()), ", expected ", shape_str(want));
}

// Expert e of a stacked [E, R, K] tensor as an [R, K] view of the same storage (quantized rows
// stay as stored; the view keeps the whole tensor alive).
Tensor expert_view(const Tensor& w, int64_t e) {
  const int64_t r = w.dim(1), k = w.dim(2);
  auto* base = static_cast<std::byte*>(const_cast<void*>(w.raw()));
  return Tensor::wrap(base + e * dtype_bytes(w.dtype(), r * k), {r, k}, w.dtype(),
                      std::make_shared<Tensor>(w));
}

// src [k, r] -> dst [r, k], in 32 x 32 tiles (a plain loop strides through memory on every
// write: several times slower on real experts, 2048 x 2688).
template <class T>
void transpose_into(const T* src, T* dst, int64_t k, int64_t r) {
  constexpr int64_t kTile = 32;
  for (int64_t i0 = 0; i0 < k; i0 += kTile) {
    for (int64_t j0 = 0; j0 < r; j0 += kTile) {
      const int64_t i1 = std::min(k, i0 + kTile), j1 = std::min(r, j0 + kTile);
      for (int64_t j = j0; j < j1; ++j) {
        for (int64_t i = i0; i < i1; ++i) dst[j * k + i] = src[i * r + j];
      }
    }
  }
}

// Expert e of an input-major [E, K, R] tensor (x @ W) as an output-major [R, K] copy in the
// stored dtype.
Tensor transposed_expert(const Tensor& w, int64_t e) {
  const int64_t k = w.dim(1), r = w.dim(2);
  Tensor t = Tensor::empty({r, k}, w.dtype());
  if (w.dtype() == DType::kF32) {
    transpose_into(w.f32() + e * k * r, t.f32(), k, r);
  } else {
    transpose_into(w.u16() + e * k * r, t.u16(), k, r);
  }
  return t;
}

float maybe_round(float v, bool bf16) {
  return bf16 ? round_bf16(v) : v;
}

void round_mat(const ExecContext& ctx, Mat m, bool bf16) {
  if (bf16) ops::round_bf16(ctx, m);
}

// h [rows, 2I] -> h[:, :I] = SwiGLU, in place. Gate first (routed experts: silu(g) * u) or value
// first (diffusers' SwiGLU: v * silu(g)); under bf16 silu(g) and the product each round.
void swiglu_in_place(const ExecContext& ctx, Mat h, int64_t inner, bool gate_first, bool bf16) {
  const int64_t tasks = (h.rows + kSwigluRows - 1) / kSwigluRows;
  parallel_for(tasks, [&](int64_t task) {
    const int64_t r1 = std::min(h.rows, (task + 1) * kSwigluRows);
    for (int64_t r = task * kSwigluRows; r < r1; ++r) {
      float* a = h.row(r);  // gate first: a = gate, b = up; value first: a = value, b = gate
      float* b = a + inner;
      float* g = gate_first ? a : b;
      ops::silu(ctx, g, g, inner);
      for (int64_t i = 0; i < inner; ++i) {
        const float s = maybe_round(g[i], bf16);
        a[i] = maybe_round(gate_first ? s * b[i] : a[i] * s, bf16);
      }
    }
  });
}

// An element of torch.topk's queue; the comparator reads only the value.
struct Scored {
  float value;
  int64_t index;
};

bool before(const Scored& x, const Scored& y) {  // torch's "largest" comparator, NaN first
  return (std::isnan(x.value) && !std::isnan(y.value)) || x.value > y.value;
}

// torch.topk(values[0..n), k) on CPU, sorted: the first k of q (q has n elements).
void topk_like_torch(Scored* q, int64_t n, int64_t k) {
  if (k * 64 <= n) {
    std::partial_sort(q, q + k, q + n, before);
  } else {
    std::nth_element(q, q + k - 1, q + n, before);
    std::sort(q, q + k - 1, before);
  }
}

int64_t capacity_of(const MoEConfig& c, int64_t S) {
  // Python: max(1, math.ceil(capacity_factor * slen / num_experts)), in double.
  const double v =
      std::ceil(c.capacity_factor * static_cast<double>(S) / static_cast<double>(c.experts));
  return std::max<int64_t>(1, static_cast<int64_t>(v));
}

// The routing of B x S tokens into tokens / weights [B, E, C].
void route_into(const MoELayer::Weights& w, const ExecContext& ctx, Arena& a, int64_t B, int64_t S,
                const float* temb, const float* xn, int64_t C, int64_t* tokens, float* weights) {
  const int64_t D = w.c.dim, E = w.c.experts, rows = B * S;
  const bool bf16 = w.bf16;
  const int threads = std::max(1, num_threads());

  // logits [B*S, E] = router([temb broadcast | xn]), the input built kRouterRows rows at a time
  // in one buffer per thread.
  Mat logits = make_mat(a.floats(rows * E), rows, E);
  float* cat = a.floats(threads * kRouterRows * 2 * D);
  parallel_for_on(threads, (rows + kRouterRows - 1) / kRouterRows, [&](int64_t task) {
    const int64_t r0 = task * kRouterRows, n = std::min(kRouterRows, rows - r0);
    const int slot = std::min(thread_index(), threads - 1);
    Mat in = make_mat(cat + slot * kRouterRows * 2 * D, n, 2 * D);
    for (int64_t r = 0; r < n; ++r) {
      std::memcpy(in.row(r), temb + ((r0 + r) / S) * D, static_cast<size_t>(D) * sizeof(float));
      std::memcpy(in.row(r) + D, xn + (r0 + r) * D, static_cast<size_t>(D) * sizeof(float));
    }
    w.router.forward(ctx, in, logits.rows_slice(r0, n));
  });

  // scores = softmax or sigmoid of the logits (model dtype) in f32, cast to the model dtype.
  for (int64_t r = 0; r < rows; ++r) {
    float* l = logits.row(r);
    for (int64_t e = 0; e < E; ++e) l[e] = maybe_round(l[e], bf16);
    if (w.c.use_sigmoid) {
      for (int64_t e = 0; e < E; ++e) l[e] = maybe_round(1.0f / (1.0f + std::exp(-l[e])), bf16);
    } else {
      float mx = l[0];
      for (int64_t e = 1; e < E; ++e) mx = std::max(mx, l[e]);
      double sum = 0;
      for (int64_t e = 0; e < E; ++e) sum += (l[e] = std::exp(l[e] - mx));
      const float inv = 1.0f / static_cast<float>(sum);
      for (int64_t e = 0; e < E; ++e) l[e] = maybe_round(l[e] * inv, bf16);
    }
  }

  // Each (b, e) takes its top C tokens, as torch.topk orders them.
  auto* queues = static_cast<Scored*>(a.bytes(threads * S * static_cast<int64_t>(sizeof(Scored))));
  parallel_for_on(threads, B * E, [&](int64_t task) {
    const int64_t b = task / E, e = task % E;
    Scored* q = queues + std::min(thread_index(), threads - 1) * S;
    for (int64_t s = 0; s < S; ++s) q[s] = {logits.row(b * S + s)[e], s};
    topk_like_torch(q, S, C);
    for (int64_t c = 0; c < C; ++c) {
      tokens[task * C + c] = q[c].index;
      weights[task * C + c] = q[c].value;
    }
  });

  // token_score_sums: scatter_add in expert, batch, slot order (f32 accumulation, one rounding).
  float* sums = a.floats(rows);
  std::fill(sums, sums + rows, 0.0f);
  for (int64_t e = 0; e < E; ++e) {
    for (int64_t b = 0; b < B; ++b) {
      const int64_t at = (b * E + e) * C;
      for (int64_t c = 0; c < C; ++c) sums[b * S + tokens[at + c]] += weights[at + c];
    }
  }
  for (int64_t r = 0; r < rows; ++r) sums[r] = maybe_round(sums[r], bf16);
  // weight = g / (sum + 1e-12) * route_scale, each op in f32 and rounded to the model dtype.
  const float scale = static_cast<float>(w.c.route_scale);
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t i = 0; i < E * C; ++i) {
      float& g = weights[b * E * C + i];
      const float den = maybe_round(sums[b * S + tokens[b * E * C + i]] + 1e-12f, bf16);
      g = maybe_round(maybe_round(g / den, bf16) * scale, bf16);
    }
  }
}

void check_call(const MoEConfig& c, int64_t B, int64_t S) {
  FLOWKV_CHECK(B >= 1 && S >= 1, "NucleusMoE layer: ", B, " batch elements of ", S,
               " tokens; need at least one of each");
  const int64_t C = capacity_of(c, S);
  FLOWKV_CHECK(C <= S, "NucleusMoE layer: capacity ", C, " (capacity_factor ", c.capacity_factor,
               " x ", S, " tokens / ", c.experts, " experts) exceeds the ", S,
               " tokens (torch.topk would fail)");
}

}  // namespace

MoELayer MoELayer::from_tensors(const std::function<Tensor(const std::string&)>& get,
                                const MoEConfig& c, ExpertLayout layout, ops::Compute compute,
                                bool keep_plain) {
  return from_tensors(get, c, layout, compute, keep_plain, "");
}

MoELayer MoELayer::from_tensors(const std::function<Tensor(const std::string&)>& get,
                                const MoEConfig& c, ExpertLayout layout, ops::Compute compute,
                                bool keep_plain, const std::string& prefix) {
  FLOWKV_CHECK(c.dim > 0 && c.inner > 0 && c.experts > 0, "NucleusMoE layer ", prefix, ": dim ",
               c.dim, ", moe_intermediate_dim ", c.inner, " and num_experts ", c.experts,
               " must be positive");
  FLOWKV_CHECK(
      std::isfinite(c.capacity_factor) && c.capacity_factor >= 0 && std::isfinite(c.route_scale),
      "NucleusMoE layer ", prefix, ": capacity_factor ", c.capacity_factor, " and route_scale ",
      c.route_scale, " must be finite (capacity_factor >= 0)");
  FLOWKV_CHECK(compute.type == DType::kF32 || compute.type == DType::kBF16,
               "NucleusMoE layer: compute type must be F32 or BF16, got ",
               dtype_name(compute.type));
  const int64_t D = c.dim, I = c.inner, E = c.experts;
  auto w = std::make_shared<Weights>();
  w->c = c;
  w->bf16 = compute.type == DType::kBF16;

  const Tensor router = get(wmoe::kRouter);
  check_shape(router, prefix, wmoe::kRouter, {E, 2 * D});
  const Tensor shared_in = get(wmoe::kSharedIn), shared_out = get(wmoe::kSharedOut);
  check_shape(shared_in, prefix, wmoe::kSharedIn, {2 * I, D});
  check_shape(shared_out, prefix, wmoe::kSharedOut, {D, I});
  const Tensor gate_up = get(wmoe::kGateUp), down = get(wmoe::kDown);
  const bool input_major = layout == ExpertLayout::kInputMajor;
  check_shape(gate_up, prefix, wmoe::kGateUp,
              input_major ? Shape{E, D, 2 * I} : Shape{E, 2 * I, D});
  check_shape(down, prefix, wmoe::kDown, input_major ? Shape{E, I, D} : Shape{E, D, I});
  if (input_major) {
    for (const auto& [t, leaf] : {std::pair{&gate_up, wmoe::kGateUp}, {&down, wmoe::kDown}}) {
      FLOWKV_CHECK(!dtype_is_quantized(t->dtype()), "NucleusMoE layer: tensor ", prefix, leaf,
                   " is ", dtype_name(t->dtype()),
                   "; input-major (diffusers) experts must be F32, BF16 or F16");
    }
  }

  w->router = ops::Linear(router, compute, keep_plain);
  w->shared_in = ops::Linear(shared_in, compute, keep_plain);
  w->shared_out = ops::Linear(shared_out, compute, keep_plain);
  w->gate_up.reserve(static_cast<size_t>(E));
  w->down.reserve(static_cast<size_t>(E));
  for (int64_t e = 0; e < E; ++e) {
    const Tensor gu = input_major ? transposed_expert(gate_up, e) : expert_view(gate_up, e);
    const Tensor dn = input_major ? transposed_expert(down, e) : expert_view(down, e);
    w->gate_up.emplace_back(gu, compute, keep_plain);
    w->down.emplace_back(dn, compute, keep_plain);
  }
  MoELayer layer;
  layer.w_ = std::move(w);
  return layer;
}

const MoEConfig& MoELayer::config() const {
  return w_->c;
}

int64_t MoELayer::bytes() const {
  int64_t b =
      w_->router.packed_bytes() + w_->shared_in.packed_bytes() + w_->shared_out.packed_bytes();
  for (const ops::Linear& l : w_->gate_up) b += l.packed_bytes();
  for (const ops::Linear& l : w_->down) b += l.packed_bytes();
  return b;
}

MoELayer::Routing MoELayer::route(const ExecContext& ctx, int64_t B, int64_t S, const float* temb,
                                  const float* xn) const {
  check_call(w_->c, B, S);
  Routing r;
  r.capacity = capacity_of(w_->c, S);
  const size_t n = static_cast<size_t>(B * w_->c.experts * r.capacity);
  r.tokens.resize(n);
  r.weights.resize(n);
  Arena local;
  Arena& a = ctx.arena ? *ctx.arena : local;
  ArenaScope scope(a);
  route_into(*w_, ctx, a, B, S, temb, xn, r.capacity, r.tokens.data(), r.weights.data());
  return r;
}

void MoELayer::forward(const ExecContext& ctx, int64_t B, int64_t S, const float* temb,
                       const float* xn, const float* xm, float* out) const {
  const Weights& w = *w_;
  check_call(w.c, B, S);
  const int64_t D = w.c.dim, I = w.c.inner, E = w.c.experts, rows = B * S;
  const int64_t C = capacity_of(w.c, S), BC = B * C;
  const bool bf16 = w.bf16;
  Arena local;
  Arena& a = ctx.arena ? *ctx.arena : local;
  ArenaScope scope(a);

  auto* tokens = static_cast<int64_t*>(a.bytes(B * E * C * static_cast<int64_t>(sizeof(int64_t))));
  float* weights = a.floats(B * E * C);
  route_into(w, ctx, a, B, S, temb, xn, C, tokens, weights);

  // out = shared_expert(xm), in the model dtype; it then accumulates the routed rows in f32.
  const Mat x{const_cast<float*>(xm), rows, D, D};
  Mat y = make_mat(out, rows, D);
  {
    ArenaScope inner(a);
    Mat h = make_mat(a.floats(rows * 2 * I), rows, 2 * I);
    w.shared_in.forward(ctx, x, h);
    round_mat(ctx, h, bf16);
    swiglu_in_place(ctx, h, I, /*gate_first=*/false, bf16);
    w.shared_out.forward(ctx, h.cols_slice(0, I), y);
    round_mat(ctx, y, bf16);
  }

  // Routed experts, `pass` at a time (one per thread; each runs its GEMMs on that thread: the
  // tiles, so the results, are those of a call on its own), then their rows added onto `out`
  // in expert order (scatter_add's index order for every token).
  const int threads = std::max(1, num_threads());
  const int64_t pass = std::min<int64_t>(E, threads);
  float* in_buf = a.floats(pass * BC * D);     // gathered xm, then the expert's output
  float* h_buf = a.floats(pass * BC * 2 * I);  // gate | up, then the activation in [:, :I]
  ExecContext one = ctx;  // inside the expert tasks: no shared arena, profile or tracer
  one.arena = nullptr;
  one.profile = nullptr;
  one.tracer = nullptr;
  ScopedOpTimer timer(ctx.profile ? &ctx.profile->linear : nullptr,
                      2.0 * double(E) * double(BC) * double(3 * D * I));
  for (int64_t e0 = 0; e0 < E; e0 += pass) {
    const int64_t n = std::min(pass, E - e0);
    parallel_for_on(threads, n, [&](int64_t slot) {
      const int64_t e = e0 + slot;
      Mat xe = make_mat(in_buf + slot * BC * D, BC, D);
      Mat h = make_mat(h_buf + slot * BC * 2 * I, BC, 2 * I);
      for (int64_t b = 0; b < B; ++b) {
        for (int64_t c = 0; c < C; ++c) {
          std::memcpy(xe.row(b * C + c), xm + (b * S + tokens[(b * E + e) * C + c]) * D,
                      static_cast<size_t>(D) * sizeof(float));
        }
      }
      w.gate_up[static_cast<size_t>(e)].forward(one, xe, h);
      round_mat(one, h, bf16);
      swiglu_in_place(one, h, I, /*gate_first=*/true, bf16);
      w.down[static_cast<size_t>(e)].forward(one, h.cols_slice(0, I), xe);
      // (y.float() * weight).to(dtype)
      for (int64_t b = 0; b < B; ++b) {
        for (int64_t c = 0; c < C; ++c) {
          const float g = weights[(b * E + e) * C + c];
          float* row = xe.row(b * C + c);
          for (int64_t i = 0; i < D; ++i) row[i] = maybe_round(maybe_round(row[i], bf16) * g, bf16);
        }
      }
    });
    parallel_for_on(threads, (D + kScatterCols - 1) / kScatterCols, [&](int64_t task) {
      const int64_t c0 = task * kScatterCols, c1 = std::min(D, c0 + kScatterCols);
      for (int64_t slot = 0; slot < n; ++slot) {
        const int64_t e = e0 + slot;
        const float* ye = in_buf + slot * BC * D;
        for (int64_t b = 0; b < B; ++b) {
          for (int64_t c = 0; c < C; ++c) {
            float* dst = y.row(b * S + tokens[(b * E + e) * C + c]);
            const float* src = ye + (b * C + c) * D;
            for (int64_t i = c0; i < c1; ++i) dst[i] += src[i];
          }
        }
      }
    });
  }
  round_mat(ctx, y, bf16);
}

}  // namespace flowkv::nucleus
