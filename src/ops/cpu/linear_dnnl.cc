#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>
#include <oneapi/dnnl/dnnl.hpp>
#include <tuple>
#include <unordered_map>

#include "core/parallel.h"
#include "flowkv/error.h"
#include "ops/linear.h"
#include "ops/ops.h"

namespace flowkv::ops {

namespace {

using dnnl::memory;
using Tag = memory::format_tag;
using DT = memory::data_type;

dnnl::engine& cpu_engine() {
  static dnnl::engine eng = [] {
    // oneDNN plans its primitives for omp_get_max_threads() threads. flowkv runs each
    // primitive on one thread (it parallelises over tiles itself), so it plans for one.
    omp_set_num_threads(1);
    return dnnl::engine(dnnl::engine::kind::cpu, 0);
  }();
  return eng;
}

dnnl::stream& thread_stream() {
  thread_local dnnl::stream s(cpu_engine());
  return s;
}

// Per-thread scratchpad (oneDNN primitives share nothing when each thread brings its own).
void* thread_scratch(size_t bytes) {
  thread_local std::vector<std::byte> buf;
  if (buf.size() < bytes) buf.resize(bytes);
  return buf.data();
}

// oneDNN runs bf16 matmul only where the CPU has bf16 instructions (AVX512_BF16, AMX).
bool native_bf16() {
  static const bool ok = [] {
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
};

constexpr int64_t kPackRows = 256;  // the M the weight layout is chosen for

}  // namespace

struct Linear::Packed {
  memory::desc wei;  // the layout oneDNN chose
  std::vector<std::byte> data;
};

namespace {

// Primitive for one tile shape, created once and cached (creation JIT-compiles kernels).
const Prim& get_prim(const PrimKey& key, const memory::desc& wei) {
  static std::mutex mu;
  static std::map<PrimKey, std::vector<std::unique_ptr<Prim>>> cache;
  std::lock_guard<std::mutex> lock(mu);
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
  dnnl::matmul::desc desc(p->src, p->wei, p->dst);
  dnnl::matmul::primitive_desc pd(desc, attr, cpu_engine());
  p->scratch = pd.scratchpad_desc().get_size();
  p->prim = dnnl::matmul(pd);
  list.push_back(std::move(p));
  return *list.back();
}

}  // namespace

GemmTiles gemm_tiles(int64_t m, int64_t n, int64_t k) {
  // Whole rows of output per task (one oneDNN call streams its rows past all the weights), the
  // rows split into kTasks tiles of at least kMinRows. Measured here against one oneDNN call
  // over all threads: splitting columns as well, or into more tiles, cost 5-15%; this split
  // costs 0-8%. Fixed by the shape alone, never by the thread count.
  (void)k;
  constexpr int64_t kTasks = 4, kMinRows = 64;
  int64_t rows = (m + kTasks - 1) / kTasks;
  rows = std::max(kMinRows, (rows + 15) / 16 * 16);
  return {std::min(m, rows), n};
}

Linear::Linear(const Tensor& w, DType compute, bool keep_plain) {
  FLOWKV_CHECK(w.ndim() == 2, "linear weight must be 2-D, got ", shape_str(w.shape()));
  const Tensor f = w.to_f32();
  build(f.f32(), w.dim(0), w.dim(1), compute, keep_plain);
}

Linear Linear::rows_of(const Tensor& w, int64_t r0, int64_t n, DType compute, bool keep_plain) {
  FLOWKV_CHECK(w.ndim() == 2 && r0 >= 0 && r0 + n <= w.dim(0), "rows [", r0, ", ", r0 + n,
               ") out of range for weight ", shape_str(w.shape()));
  const Tensor f = w.to_f32();
  Linear l;
  l.build(f.f32() + r0 * w.dim(1), n, w.dim(1), compute, keep_plain);
  return l;
}

Linear Linear::stacked(const std::vector<Tensor>& ws, DType compute, bool keep_plain) {
  FLOWKV_CHECK(!ws.empty(), "stacked linear needs weights");
  const int64_t k = ws[0].dim(1);
  int64_t n = 0;
  for (const Tensor& w : ws) {
    FLOWKV_CHECK(w.ndim() == 2 && w.dim(1) == k, "stacked weights disagree in input width");
    n += w.dim(0);
  }
  std::vector<float> all(static_cast<size_t>(n * k));
  int64_t off = 0;
  for (const Tensor& w : ws) {
    const Tensor f = w.to_f32();
    std::memcpy(all.data() + off * k, f.f32(), static_cast<size_t>(f.nbytes()));
    off += w.dim(0);
  }
  Linear l;
  l.build(all.data(), n, k, compute, keep_plain);
  return l;
}

void Linear::build(const float* w, int64_t n, int64_t k, DType compute, bool keep_plain) {
  FLOWKV_CHECK(compute == DType::kF32 || compute == DType::kBF16,
               "linear compute type must be F32 or BF16");
  n_ = n;
  k_ = k;
  compute_ = compute;
  packed_.reset();
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
  // Ask oneDNN which weight layout it wants, then reorder into it once.
  memory::desc src({kPackRows, k}, dt, Tag::ab);
  memory::desc wei_any({k, n}, dt, Tag::any);
  memory::desc dst({kPackRows, n}, DT::f32, Tag::ab);
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(src, wei_any, dst), attr, eng);
  packed_ = std::make_shared<Packed>();
  packed_->wei = pd.weights_desc();
  packed_->data.resize(packed_->wei.get_size());
  // W [N, K] row-major is the [K, N] matrix Wᵀ with strides {1, K}.
  memory plain_mem(memory::desc({k, n}, DT::f32, memory::dims{1, k}), eng, const_cast<float*>(w));
  memory packed_mem(packed_->wei, eng, packed_->data.data());
  dnnl::stream s(eng);
  dnnl::reorder(plain_mem, packed_mem).execute(s, plain_mem, packed_mem);
  s.wait();
}

int64_t Linear::packed_bytes() const {
  return packed_ ? static_cast<int64_t>(packed_->data.size()) : 0;
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
      y.row(r)[j] = static_cast<float>(acc);
    }
  }
}

void Linear::forward(const ExecContext& ctx, Mat x, Mat y) const {
  FLOWKV_CHECK(x.cols == k_ && y.cols == n_ && x.rows == y.rows, "linear: input ", x.rows, "x",
               x.cols, " and output ", y.rows, "x", y.cols, " do not fit weight ", n_, "x", k_);
  if (x.rows == 0) return;
  if (ctx.kernels == KernelPath::kReference) return forward_reference(x, y);
  const int64_t m = x.rows;
  // BF16: round the activations once into a packed copy (bf16, or bf16 values held in f32).
  const void* src = x.data;
  int64_t lda = x.stride;
  const bool bf16_gemm = gemm_type(compute_) == DT::bf16;
  if (compute_ == DType::kBF16) {
    thread_local std::vector<float> buf;
    const size_t need = static_cast<size_t>(m * k_) / (bf16_gemm ? 2 : 1) + 1;
    if (buf.size() < need) buf.resize(need);
    if (bf16_gemm) {
      to_bf16(ctx, x, reinterpret_cast<uint16_t*>(buf.data()));
    } else {
      Mat r = make_mat(buf.data(), m, k_);
      copy_rows(x, r);
      round_bf16(ctx, r);
    }
    src = buf.data();
    lda = k_;
  }
  const GemmTiles t = gemm_tiles(m, n_, k_);
  const int64_t tiles = (m + t.rows - 1) / t.rows;
  // Fetch (or create) both primitives before going parallel: full tiles and the last tile.
  const PrimKey full{t.rows, n_, k_, lda, y.stride, compute_};
  const PrimKey last{m - (tiles - 1) * t.rows, n_, k_, lda, y.stride, compute_};
  const Prim* p_full = tiles > 1 ? &get_prim(full, packed_->wei) : nullptr;
  const Prim* p_last = &get_prim(last, packed_->wei);
  const int64_t elem = bf16_gemm ? 2 : 4;
  parallel_for(tiles, [&](int64_t tile) {
    const Prim& p = tile == tiles - 1 ? *p_last : *p_full;
    auto& eng = cpu_engine();
    const int64_t r0 = tile * t.rows;
    memory a(p.src, eng,
             const_cast<std::byte*>(static_cast<const std::byte*>(src) + r0 * lda * elem));
    memory b(p.wei, eng, packed_->data.data());
    memory c(p.dst, eng, y.data + r0 * y.stride);
    std::unordered_map<int, memory> args = {
        {DNNL_ARG_SRC, a}, {DNNL_ARG_WEIGHTS, b}, {DNNL_ARG_DST, c}};
    if (p.scratch > 0) {
      args[DNNL_ARG_SCRATCHPAD] =
          memory(memory::desc({static_cast<int64_t>(p.scratch)}, DT::u8, Tag::a), eng,
                 thread_scratch(p.scratch));
    }
    p.prim.execute(thread_stream(), args);
  });
}

}  // namespace flowkv::ops
