#include <omp.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstring>
#include <map>
#include <mutex>
#include <oneapi/dnnl/dnnl.hpp>
#include <string_view>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "core/parallel.h"
#include "flowkv/error.h"
#include "ops/gemm.h"
#include "ops/linear.h"
#include "ops/ops.h"
#include "quant/quant.h"

namespace flowkv::ops {

namespace {

using dnnl::memory;
using Tag = memory::format_tag;
using DT = memory::data_type;

// oneDNN (OpenMP build) plans a primitive for, and runs it on, omp_get_max_threads() threads:
// an OpenMP setting each thread holds for itself (a bare std::thread has the default team, an
// embedding application may have set anything). flowkv runs each primitive on one thread (it
// parallelises over tiles itself), so every oneDNN call (creating a primitive descriptor or
// primitive, executing one) runs inside this scope, which pins the calling thread's team to one
// and restores the caller's setting after. The plan, the scratchpad size and the summation
// order are then the same on every thread.
class OneThreadScope {
 public:
  OneThreadScope() : prev_(omp_get_max_threads()) {
    if (prev_ != 1) omp_set_num_threads(1);
  }
  ~OneThreadScope() {
    if (prev_ != 1) omp_set_num_threads(prev_);
  }
  OneThreadScope(const OneThreadScope&) = delete;
  OneThreadScope& operator=(const OneThreadScope&) = delete;

 private:
  int prev_;
};

dnnl::engine& cpu_engine() {
  static dnnl::engine eng = [] {
    OneThreadScope one;
    return dnnl::engine(dnnl::engine::kind::cpu, 0);
  }();
  return eng;
}

dnnl::stream& thread_stream() {
  thread_local dnnl::stream s(cpu_engine());
  return s;
}

// Per-thread buffers that only grow (oneDNN primitives share nothing when each thread brings
// its own), one per use so that a call may hold several at once.
enum class ThreadBuffer { kActivations, kScratchpad, kStaging, kCount };
void* thread_buffer(ThreadBuffer which, size_t bytes) {
  thread_local std::array<std::vector<std::byte>, static_cast<size_t>(ThreadBuffer::kCount)> bufs;
  std::vector<std::byte>& buf = bufs[static_cast<size_t>(which)];
  if (buf.size() < bytes) buf.resize(bytes);
  return buf.data();
}

// oneDNN runs bf16 matmul only where the CPU has bf16 instructions (AVX512_BF16, AMX).
bool native_bf16() {
  static const bool ok = [] {
    OneThreadScope one;
    try {
      memory::desc a({8, 32}, DT::bf16, Tag::ab), b({32, 16}, DT::bf16, Tag::any),
          c({8, 16}, DT::f32, Tag::ab);
      dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a, b, c), cpu_engine());
      return true;
    } catch (const dnnl::error&) {
      return false;
    }
  }();
  return ok;
}

// The type oneDNN multiplies in. BF16 weights on a CPU without bf16 instructions are stored
// as their (exact) f32 values and multiplied with bf16-rounded activations in f32: every
// product of two bf16 values is exact in f32 and sums accumulate in f32, as bf16 x bf16 -> f32
// hardware does; only the summation order differs.
DT gemm_type(DType compute) {
  return compute == DType::kBF16 && native_bf16() ? DT::bf16 : DT::f32;
}

struct PrimKey {
  int64_t m, n, k, lda, ldc;
  DType compute;
  bool operator<(const PrimKey& o) const {
    return std::tie(m, n, k, lda, ldc, compute) < std::tie(o.m, o.n, o.k, o.lda, o.ldc, o.compute);
  }
};

struct Prim {
  dnnl::matmul prim;
  memory::desc src, wei, dst;
  size_t scratch = 0;
  // Writes a contiguous [m, n] block that the caller copies into its strided output: oneDNN's
  // AMX kernels take packed weights only with a contiguous destination, and with a strided
  // one (a column chunk of a wider output) it falls back to its reference matmul, about 300x
  // slower (measured on the built-in model: 6.4 s against 0.02 s for 8 steps).
  bool staged = false;
};

constexpr int64_t kPackRows = 256;  // the M the weight layout is chosen for

std::atomic<bool> g_compact{true};

}  // namespace

struct Linear::Packed {  // one column chunk of the weights, in the layout oneDNN chose
  int64_t n0 = 0, n = 0;
  memory::desc wei;
  std::vector<std::byte> data;
};

// Narrow weights as stored: output rows [out0, out0 + n) are rows [r0, r0 + n) of `w`.
struct Linear::Compact {
  struct Part {
    Tensor w;
    int64_t r0 = 0, n = 0, out0 = 0;
  };
  DType dtype = DType::kBF16;
  std::vector<Part> parts;
  int64_t row_bytes = 0;
  // Widens output rows [j0, j0 + count), columns [k0, k0 + kc), into out [count, kc]. k0 is a
  // whole number of blocks (kGemmKBlock is a multiple of every block).
  void widen(int64_t j0, int64_t count, int64_t k0, int64_t kc, float* out) const {
    size_t p = 0;
    const int64_t skip = dtype_bytes(dtype, k0);
    for (int64_t j = j0; j < j0 + count; ++j) {
      while (j >= parts[p].out0 + parts[p].n) ++p;
      const Part& part = parts[p];
      const auto* row = static_cast<const std::byte*>(part.w.raw()) +
                        (part.r0 + j - part.out0) * row_bytes + skip;
      quant::dequantize_row(dtype, row, out + (j - j0) * kc, kc);
    }
  }
  RowSource source() const {
    return {[](const void* self, int64_t j0, int64_t count, int64_t k0, int64_t kc, float* out) {
              static_cast<const Compact*>(self)->widen(j0, count, k0, kc, out);
            },
            this};
  }
};

namespace {

// Primitive for one tile shape, created once and cached (creation JIT-compiles kernels).
const Prim& get_prim(const PrimKey& key, const memory::desc& wei) {
  static std::mutex mu;
  static std::map<PrimKey, std::vector<std::unique_ptr<Prim>>> cache;
  std::lock_guard<std::mutex> lock(mu);
  OneThreadScope one;
  auto& list = cache[key];
  for (const auto& p : list) {
    if (p->wei == wei) return *p;
  }
  auto p = std::make_unique<Prim>();
  const DT in = gemm_type(key.compute);
  p->src = memory::desc({key.m, key.k}, in, memory::dims{key.lda, 1});
  p->dst = memory::desc({key.m, key.n}, DT::f32, memory::dims{key.ldc, 1});
  p->wei = wei;
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(p->src, p->wei, p->dst), attr, cpu_engine());
  if (key.ldc != key.n && std::string_view(pd.impl_info_str()).substr(0, 3) == "ref") {
    p->dst = memory::desc({key.m, key.n}, DT::f32, memory::dims{key.n, 1});
    pd = dnnl::matmul::primitive_desc(dnnl::matmul::desc(p->src, p->wei, p->dst), attr,
                                      cpu_engine());
    p->staged = true;
  }
  p->scratch = pd.scratchpad_desc().get_size();
  p->prim = dnnl::matmul(pd);
  list.push_back(std::move(p));
  return *list.back();
}

}  // namespace

bool native_bf16_gemm() {
  return native_bf16();
}

void set_compact_weights(bool on) {
  g_compact.store(on);
}

GemmTiles gemm_tiles(int64_t m, int64_t n, int64_t k) {
  // Two column chunks (from 256 outputs), rows split in two only from 2,048 rows (or when the
  // columns cannot split), all fixed by the shape alone. Measured here (2 cores, AVX2) against
  // one oneDNN call over both threads, on FLUX.2 shapes from 64 to 1,280 rows: two column tiles
  // run at 93-101% of it; a single tile at half; 4 row tiles lose 5-12% (each repacks all the
  // weights), 2 x 2 tiles 0-8%.
  (void)k;
  constexpr int64_t kSplitColumnsFrom = 256, kSplitRowsFrom = 2048, kMinRows = 64;
  const bool split_cols = n >= kSplitColumnsFrom;
  const bool split_rows = m >= kSplitRowsFrom || (!split_cols && m >= 2 * kMinRows);
  return {split_rows ? (m + 1) / 2 : m, split_cols ? (n + 1) / 2 : n};
}

Linear::Linear(const Tensor& w, Compute compute, bool keep_plain) {
  FLOWKV_CHECK(w.ndim() == 2, "linear weight must be 2-D, got ", shape_str(w.shape()));
  init({w}, 0, w.dim(0), compute, keep_plain);
}

Linear Linear::rows_of(const Tensor& w, int64_t r0, int64_t n, Compute compute, bool keep_plain) {
  FLOWKV_CHECK(w.ndim() == 2 && r0 >= 0 && n >= 0 && r0 + n <= w.dim(0), "rows [", r0, ", ", r0 + n,
               ") out of range for weight ", shape_str(w.shape()));
  Linear l;
  l.init({w}, r0, n, compute, keep_plain);
  return l;
}

Linear Linear::stacked(const std::vector<Tensor>& ws, Compute compute, bool keep_plain) {
  FLOWKV_CHECK(!ws.empty(), "stacked linear needs weights");
  int64_t n = 0;
  for (const Tensor& w : ws) {
    FLOWKV_CHECK(w.ndim() == 2 && w.dim(1) == ws[0].dim(1),
                 "stacked weights disagree in input width");
    n += w.dim(0);
  }
  Linear l;
  l.init(ws, 0, n, compute, keep_plain);
  return l;
}

// Rows [r0, r0 + n) of one weight, or all rows of several stacked: kept as stored, or their f32
// values packed.
void Linear::init(const std::vector<Tensor>& ws, int64_t r0, int64_t n, Compute compute,
                  bool keep_plain) {
  if (!compute.int8 && try_compact(ws, r0, n, compute.type, keep_plain)) return;
  const int64_t k = ws[0].dim(1);
  std::vector<float> all(static_cast<size_t>(n * k));
  int64_t off = 0;
  for (const Tensor& w : ws) {
    const int64_t rows = ws.size() == 1 ? n : w.dim(0);
    const Tensor f = w.to_f32();
    std::memcpy(all.data() + off * k, f.f32() + (ws.size() == 1 ? r0 : 0) * k,
                static_cast<size_t>(rows * k) * sizeof(float));
    off += rows;
  }
  if (compute.int8) {  // weights quantized once, from their exact values
    n_ = n;
    k_ = k;
    compute_ = DType::kF32;
    int8_ = std::make_shared<const Int8Weights>(quantize_weights_int8(all.data(), n, k));
    return;
  }
  build(all.data(), n, k, compute.type, keep_plain);
}

// Narrow weights stay as stored when that multiplies the same values: at F32 compute, or at
// BF16 compute with bf16 weights on a CPU without bf16 instructions (oneDNN would multiply them
// as their f32 values anyway). Quantized weights are always kept (f32 compute of the values).
bool keeps_as_stored(DType stored, DType compute) {
  if (stored == DType::kF32) return false;
  if (dtype_is_quantized(stored)) return true;
  if (!g_compact.load()) return false;
  return compute == DType::kF32 || (stored == DType::kBF16 && !native_bf16());
}

int64_t held_weight_bytes(DType stored, const Shape& shape, DType compute) {
  const int64_t n = shape_numel(shape);
  // A matrix, or a stack of them (NucleusMoE-Image's experts [E, out, in]: one Linear each).
  if (shape.size() != 2 && shape.size() != 3) return 4 * n;
  if (keeps_as_stored(stored, compute)) return dtype_bytes(stored, n);
  // On a CPU with bf16 instructions, BF16 compute packs the weights as bf16 for oneDNN (its
  // blocks pad a dimension that is no multiple of them; real models' are).
  return !dtype_is_quantized(stored) && gemm_type(compute) == DT::bf16 ? 2 * n : 4 * n;
}

bool Linear::try_compact(const std::vector<Tensor>& ws, int64_t r0, int64_t n, DType compute,
                         bool keep_plain) {
  const DType t = ws[0].dtype();
  for (const Tensor& w : ws) {
    if (w.dtype() != t) return false;
  }
  if (n == 0 || !keeps_as_stored(t, compute)) return false;
  auto c = std::make_shared<Compact>();
  c->dtype = t;
  c->row_bytes = dtype_bytes(t, ws[0].dim(1));
  int64_t out0 = 0;
  for (size_t i = 0; i < ws.size(); ++i) {
    const int64_t rows = ws.size() == 1 ? n : ws[i].dim(0);
    c->parts.push_back({ws[i], ws.size() == 1 ? r0 : 0, rows, out0});
    out0 += rows;
  }
  n_ = n;
  k_ = ws[0].dim(1);
  compute_ = compute;
  if (keep_plain) {
    plain_ = std::make_shared<std::vector<float>>(static_cast<size_t>(n * k_));
    c->widen(0, n, 0, k_, plain_->data());
  }
  compact_ = std::move(c);
  return true;
}

void Linear::build(const float* w, int64_t n, int64_t k, DType compute, bool keep_plain) {
  FLOWKV_CHECK(compute == DType::kF32 || compute == DType::kBF16,
               "linear compute type must be F32 or BF16");
  n_ = n;
  k_ = k;
  compute_ = compute;
  chunks_.clear();
  std::vector<float> rounded;
  if (compute == DType::kBF16) {  // the weights as bf16 holds them (a no-op for bf16 files)
    rounded.assign(w, w + n * k);
    for (float& v : rounded) v = flowkv::round_bf16(v);
    w = rounded.data();
  }
  if (keep_plain || n == 0) plain_ = std::make_shared<std::vector<float>>(w, w + n * k);
  if (n == 0) return;
  auto& eng = cpu_engine();
  const DT dt = gemm_type(compute);
  OneThreadScope one;  // the weight layout oneDNN picks must not depend on the calling thread
  const int64_t chunk = gemm_tiles(kPackRows, n, k).cols;
  for (int64_t n0 = 0; n0 < n; n0 += chunk) {
    auto c = std::make_shared<Packed>();
    c->n0 = n0;
    c->n = std::min(chunk, n - n0);
    // Ask oneDNN which weight layout it wants for this chunk, then reorder into it once.
    memory::desc src({kPackRows, k}, dt, Tag::ab);
    memory::desc wei_any({k, c->n}, dt, Tag::any);
    memory::desc dst({kPackRows, c->n}, DT::f32, Tag::ab);
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(src, wei_any, dst), attr, eng);
    c->wei = pd.weights_desc();
    c->data.resize(c->wei.get_size());
    // Rows [n0, n0+n) of W [N, K] are the [K, n] matrix Wᵀ with strides {1, K}.
    memory plain(memory::desc({k, c->n}, DT::f32, memory::dims{1, k}), eng,
                 const_cast<float*>(w + n0 * k));
    memory packed(c->wei, eng, c->data.data());
    dnnl::stream s(eng);
    dnnl::reorder(plain, packed).execute(s, plain, packed);
    s.wait();
    chunks_.push_back(std::move(c));
  }
}

int64_t Linear::packed_bytes() const {
  if (compact_) return dtype_bytes(compact_->dtype, n_ * k_);
  if (int8_) return int8_->packed_bytes();
  int64_t b = 0;
  for (const auto& c : chunks_) b += static_cast<int64_t>(c->data.size());
  return b;
}

void Linear::set_bias(const Tensor& bias) {
  FLOWKV_CHECK(bias.numel() == n_, "bias has ", bias.numel(), " values for ", n_, " outputs");
  const Tensor f = bias.to_f32();
  bias_.assign(f.f32(), f.f32() + n_);
}

void Linear::forward_reference(Mat x, Mat y) const {
  FLOWKV_CHECK(plain_, "this Linear was built without its plain weights (keep_plain)");
  const float* w = plain_->data();
  for (int64_t r = 0; r < x.rows; ++r) {
    const float* xr = x.row(r);
    for (int64_t j = 0; j < n_; ++j) {
      double acc = 0;
      const float* wj = w + j * k_;
      for (int64_t i = 0; i < k_; ++i) {
        const float a = compute_ == DType::kBF16 ? flowkv::round_bf16(xr[i]) : xr[i];
        acc += double(a) * wj[i];
      }
      y.row(r)[j] = static_cast<float>(acc) + (bias_.empty() ? 0.0f : bias_[j]);
    }
  }
}

void Linear::forward(const ExecContext& ctx, Mat x, Mat y) const {
  FLOWKV_CHECK(x.cols == k_ && y.cols == n_ && x.rows == y.rows, "linear: input ", x.rows, "x",
               x.cols, " and output ", y.rows, "x", y.cols, " do not fit weight ", n_, "x", k_);
  if (x.rows == 0) return;
  if (int8_) {
    int8_linear(ctx, x, *int8_, y);  // its own reference path under KernelPath::kReference
    if (!bias_.empty()) gated_add(ctx, y, Mat{const_cast<float*>(bias_.data()), y.rows, n_, 0}, {});
    return;
  }
  if (ctx.kernels == KernelPath::kReference) return forward_reference(x, y);
  const int64_t m = x.rows;
  ScopedOpTimer timer(ctx.profile ? &ctx.profile->linear : nullptr, 2.0 * double(m) * n_ * k_);

  // BF16: round the activations once into a packed copy (bf16, or bf16 values held in f32).
  const void* src = x.data;
  int64_t lda = x.stride;
  const bool bf16_gemm = gemm_type(compute_) == DT::bf16;
  if (compute_ == DType::kBF16) {
    const size_t need = static_cast<size_t>(m * k_) / (bf16_gemm ? 2 : 1) + 1;
    float* buf =
        static_cast<float*>(thread_buffer(ThreadBuffer::kActivations, need * sizeof(float)));
    if (bf16_gemm) {
      to_bf16(ctx, x, reinterpret_cast<uint16_t*>(buf));
    } else {
      Mat r = make_mat(buf, m, k_);
      copy_rows(x, r);
      round_bf16(ctx, r);
    }
    src = buf;
    lda = k_;
  }
  if (compact_) {
    forward_compact(src, lda, y);
  } else {
    forward_packed(ctx, src, lda, y);
  }
  if (!bias_.empty()) {
    // The bias as the residual-add op: y += bias, row by row (shape-fixed split, as the GEMM).
    gated_add(ctx, y, Mat{const_cast<float*>(bias_.data()), y.rows, n_, 0}, {});
  }
}

// Narrow weights: each tile (the same shape-fixed grid as the packed path) is one call of the
// narrow-weight GEMM, which widens its weights K block by K block.
void Linear::forward_compact(const void* src, int64_t lda, Mat y) const {
  const int64_t m = y.rows;
  const GemmTiles t = gemm_tiles(m, n_, k_);
  const int64_t row_tiles = (m + t.rows - 1) / t.rows;
  const int64_t col_tiles = (n_ + t.cols - 1) / t.cols;
  const RowSource b = compact_->source();
  const auto* a = static_cast<const float*>(src);
  parallel_for(row_tiles * col_tiles, [&](int64_t task) {
    const int64_t rt = task / col_tiles, ct = task % col_tiles;
    const int64_t r0 = rt * t.rows, rows = std::min(t.rows, m - r0);
    const int64_t c0 = ct * t.cols, c1 = std::min(n_, c0 + t.cols);
    gemm_rows_source(a + r0 * lda, lda, rows, k_, b, c0, c1, y.data + r0 * y.stride, y.stride);
  });
}

void Linear::forward_packed(const ExecContext& ctx, const void* src, int64_t lda, Mat y) const {
  (void)ctx;
  const int64_t m = y.rows;
  const bool bf16_gemm = gemm_type(compute_) == DT::bf16;
  const GemmTiles t = gemm_tiles(m, n_, k_);
  const int64_t row_tiles = (m + t.rows - 1) / t.rows;
  const int64_t col_tiles = static_cast<int64_t>(chunks_.size());
  // Fetch (or create) every primitive before going parallel: per chunk, full and last rows.
  std::vector<const Prim*> prims(static_cast<size_t>(2 * col_tiles), nullptr);
  const int64_t last_rows = m - (row_tiles - 1) * t.rows;
  for (int64_t c = 0; c < col_tiles; ++c) {
    const Packed& ch = *chunks_[static_cast<size_t>(c)];
    if (row_tiles > 1)
      prims[2 * c] = &get_prim({t.rows, ch.n, k_, lda, y.stride, compute_}, ch.wei);
    prims[2 * c + 1] = &get_prim({last_rows, ch.n, k_, lda, y.stride, compute_}, ch.wei);
  }
  const int64_t elem = bf16_gemm ? 2 : 4;
  parallel_for(row_tiles * col_tiles, [&](int64_t task) {
    const int64_t rt = task / col_tiles, ct = task % col_tiles;
    const Packed& ch = *chunks_[static_cast<size_t>(ct)];
    const Prim& p = *prims[2 * ct + (rt == row_tiles - 1 ? 1 : 0)];
    auto& eng = cpu_engine();
    const int64_t r0 = rt * t.rows;
    memory a(p.src, eng,
             const_cast<std::byte*>(static_cast<const std::byte*>(src) + r0 * lda * elem));
    memory b(p.wei, eng, const_cast<std::byte*>(ch.data.data()));
    const int64_t rows = std::min(t.rows, m - r0);
    float* staging = nullptr;
    if (p.staged) {
      const size_t bytes = static_cast<size_t>(rows * ch.n) * sizeof(float);
      staging = static_cast<float*>(thread_buffer(ThreadBuffer::kStaging, bytes));
    }
    memory c(p.dst, eng, staging ? staging : y.data + r0 * y.stride + ch.n0);
    std::unordered_map<int, memory> args = {
        {DNNL_ARG_SRC, a}, {DNNL_ARG_WEIGHTS, b}, {DNNL_ARG_DST, c}};
    if (p.scratch > 0) {
      args[DNNL_ARG_SCRATCHPAD] =
          memory(memory::desc({static_cast<int64_t>(p.scratch)}, DT::u8, Tag::a), eng,
                 thread_buffer(ThreadBuffer::kScratchpad, p.scratch));
    }
    {
      OneThreadScope one;
      p.prim.execute(thread_stream(), args);
    }
    if (staging) {
      for (int64_t r = 0; r < rows; ++r) {
        std::copy_n(staging + r * ch.n, ch.n, y.data + (r0 + r) * y.stride + ch.n0);
      }
    }
  });
}

}  // namespace flowkv::ops
