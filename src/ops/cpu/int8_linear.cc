// Int8 Linear: quantization, weight packing, the scalar reference, and the driver that tiles
// the product and runs the kernel of the instruction set this CPU has. Compiled with
// -ffp-contract=off (src/CMakeLists.txt): the float arithmetic is the contract of
// ops/int8_linear.h.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>

#include "core/parallel.h"
#include "flowkv/error.h"
#include "ops/cpu/int8_kernels.h"
#include "ops/int8_linear.h"

namespace flowkv::ops {

namespace {

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

int64_t block_len(const Int8Weights& w, int64_t b) {
  return std::min(w.block, w.k - b * w.block);
}

// Offset of value (row, col) in the packed layout.
int64_t packed_index(const Int8Weights& w, int64_t row, int64_t col) {
  const int64_t p = row / Int8Weights::kPanel, j = row % Int8Weights::kPanel;
  const int64_t b = col / w.block, i = col % w.block;
  return (p * w.blocks + b) * w.block_stride * Int8Weights::kPanel +
         (i / 4) * 4 * Int8Weights::kPanel + j * 4 + i % 4;
}

int64_t scale_index(const Int8Weights& w, int64_t row, int64_t b) {
  const int64_t p = row / Int8Weights::kPanel, j = row % Int8Weights::kPanel;
  return (p * w.blocks + b) * Int8Weights::kPanel + j;
}

void check_shapes(Mat x, const Int8Weights& w, Mat y) {
  FLOWKV_CHECK(!w.empty(), "int8_linear: empty weights");
  FLOWKV_CHECK(x.cols == w.k, "int8_linear: x has ", x.cols, " columns, weights take ", w.k);
  FLOWKV_CHECK(y.cols == w.n, "int8_linear: y has ", y.cols, " columns, weights give ", w.n);
  FLOWKV_CHECK(x.rows == y.rows, "int8_linear: x has ", x.rows, " rows, y ", y.rows);
}

// Scratch of one call: from the arena when there is one, else owned here.
class Scratch {
 public:
  explicit Scratch(Arena* arena) : arena_(arena) {}
  void* get(int64_t bytes) {
    if (arena_) return arena_->bytes(bytes);
    owned_.emplace_back(static_cast<size_t>(bytes + 64));
    auto p = reinterpret_cast<uintptr_t>(owned_.back().data());
    return reinterpret_cast<void*>((p + 63) & ~uintptr_t{63});
  }

 private:
  Arena* arena_;
  std::vector<std::vector<std::byte>> owned_;
};

// Tasks: kTaskRows rows (rounded to the row tile) by kTaskPanels panels, fixed by the shape.
// 256 x 256 outputs: the task's f32 tile (256 KB) and its activation block (128 KB per K block)
// sit in the 512 KB L2; one K block of a panel (4 KB) stays in L1 across the task's rows.
constexpr int64_t kTaskRows = 256;
constexpr int64_t kTaskPanels = 16;
// Rows per activation-quantization task: a multiple of every kernel's row tile (5, 8).
constexpr int64_t kQuantRows = 120;

void run_fast(Int8Isa isa, const ExecContext& ctx, Mat x, const Int8Weights& w, Mat y) {
  const bool vnni = isa == Int8Isa::kAvx512Vnni;
  const int64_t mr = vnni ? int8::kRowsVnni : int8::kRowsAvx2;
  const int8::GemmFn gemm = vnni ? int8::gemm_vnni : int8::gemm_avx2;
  const int64_t m = x.rows;
  if (m == 0) return;
  const int64_t m_pad = ceil_div(m, mr) * mr;

  std::optional<ArenaScope> scope;
  if (ctx.arena) scope.emplace(*ctx.arena);
  Scratch scratch(ctx.arena);
  int8::Act act;
  act.mr = mr;
  act.offset = vnni;
  act.quads = w.block_stride / 4;
  act.blocks = w.blocks;
  act.data =
      static_cast<uint8_t*>(scratch.get(m_pad * w.blocks * w.block_stride / 4 * act.quad_bytes));
  act.scale = static_cast<float*>(scratch.get(m_pad * w.blocks * 4));
  const int threads = num_threads();
  const int64_t task_rows = ceil_div(kTaskRows, mr) * mr;
  const int64_t ldc = kTaskPanels * Int8Weights::kPanel;
  auto* c_all = static_cast<float*>(scratch.get(threads * task_rows * ldc * 4));

  // kQuantRows is a multiple of every row tile, so tasks pack whole tiles.
  parallel_for_on(threads, ceil_div(m_pad, kQuantRows), [&](int64_t t) {
    const int64_t r0 = t * kQuantRows;
    int8::pack_rows_avx2(x, r0, std::min(kQuantRows, m_pad - r0), w, act);
  });

  const int64_t col_tasks = ceil_div(w.panels, kTaskPanels);
  const int64_t row_tasks = ceil_div(m_pad, task_rows);
  parallel_for_on(threads, row_tasks * col_tasks, [&](int64_t t) {
    const int64_t m0 = (t / col_tasks) * task_rows, p0 = (t % col_tasks) * kTaskPanels;
    const int64_t rows = std::min(task_rows, m_pad - m0);
    const int64_t p1 = std::min(w.panels, p0 + kTaskPanels);
    float* c = c_all + thread_index() * task_rows * ldc;
    gemm(act, w, m0, rows, p0, p1, c, ldc);
    const int64_t n0 = p0 * Int8Weights::kPanel;
    const int64_t cols = std::min(w.n, p1 * Int8Weights::kPanel) - n0;
    const int64_t valid = std::min(rows, m - m0);
    for (int64_t r = 0; r < valid; ++r) {
      std::memcpy(y.row(m0 + r) + n0, c + r * ldc, cols * sizeof(float));
    }
  });
}

}  // namespace

float quantize_block_int8(const float* x, int64_t len, int8_t* q) {
  float amax = 0.0f;
  for (int64_t i = 0; i < len; ++i) {
    const float a = std::fabs(x[i]);
    amax = a > amax ? a : amax;  // as vmaxps(a, amax): a NaN is skipped
  }
  const float s = amax / 127.0f;
  if (!(s > 0.0f)) {
    std::fill(q, q + len, int8_t{0});
    return 0.0f;
  }
  for (int64_t i = 0; i < len; ++i) {
    // Round to nearest even (the default rounding mode); clamp as vmaxps/vminps would.
    float v = std::nearbyint(x[i] / s);
    v = v > -127.0f ? v : -127.0f;
    v = v < 127.0f ? v : 127.0f;
    q[i] = static_cast<int8_t>(v);
  }
  return s;
}

Int8Weights quantize_weights_int8(const float* w, int64_t n, int64_t k) {
  FLOWKV_CHECK(n > 0 && k > 0, "quantize_weights_int8: shape [", n, ", ", k, "]");
  Int8Weights q;
  q.n = n;
  q.k = k;
  q.block = std::min(kInt8Block, k);
  q.blocks = ceil_div(k, q.block);
  q.block_stride = ceil_div(q.block, 4) * 4;
  q.panels = ceil_div(n, Int8Weights::kPanel);
  const int64_t per_panel = q.blocks * Int8Weights::kPanel;
  q.values = std::make_shared<std::vector<int8_t>>(q.panels * per_panel * q.block_stride, 0);
  q.scales = std::make_shared<std::vector<float>>(q.panels * per_panel, 0.0f);
  q.sums = std::make_shared<std::vector<int32_t>>(q.panels * per_panel, 0);
  parallel_for(q.panels, [&](int64_t p) {
    std::vector<int8_t> block(q.block);
    const int64_t r1 = std::min(n, (p + 1) * Int8Weights::kPanel);
    for (int64_t r = p * Int8Weights::kPanel; r < r1; ++r) {
      for (int64_t b = 0; b < q.blocks; ++b) {
        const int64_t len = block_len(q, b);
        const float scale = quantize_block_int8(w + r * k + b * q.block, len, block.data());
        int32_t sum = 0;
        for (int64_t i = 0; i < len; ++i) {
          (*q.values)[packed_index(q, r, b * q.block + i)] = block[i];
          sum += block[i];
        }
        (*q.scales)[scale_index(q, r, b)] = scale;
        (*q.sums)[scale_index(q, r, b)] = sum;
      }
    }
  });
  return q;
}

int64_t Int8Weights::packed_bytes() const {
  if (empty()) return 0;
  return static_cast<int64_t>(values->size() + scales->size() * 4 + sums->size() * 4);
}

int8_t Int8Weights::value(int64_t row, int64_t col) const {
  return (*values)[packed_index(*this, row, col)];
}

float Int8Weights::scale(int64_t row, int64_t b) const {
  return (*scales)[scale_index(*this, row, b)];
}

Int8Isa int8_best_isa() {
  if (int8_isa_supported(Int8Isa::kAvx512Vnni)) return Int8Isa::kAvx512Vnni;
  if (int8_isa_supported(Int8Isa::kAvx2)) return Int8Isa::kAvx2;
  return Int8Isa::kScalar;
}

bool int8_isa_supported(Int8Isa isa) {
  switch (isa) {
    case Int8Isa::kScalar:
      return true;
    case Int8Isa::kAvx2:
      return __builtin_cpu_supports("avx2");
    case Int8Isa::kAvx512Vnni:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("avx512f") &&
             __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
             __builtin_cpu_supports("avx512vnni");
  }
  return false;
}

const char* int8_isa_name(Int8Isa isa) {
  switch (isa) {
    case Int8Isa::kScalar:
      return "scalar";
    case Int8Isa::kAvx2:
      return "AVX2";
    case Int8Isa::kAvx512Vnni:
      return "AVX-512 VNNI";
  }
  return "?";
}

void int8_linear(const ExecContext& ctx, Mat x, const Int8Weights& w, Mat y) {
  // Counted with the f32 Linear's work (2*M*N*K), so a profile compares the two directly.
  ScopedOpTimer timer(ctx.profile ? &ctx.profile->linear : nullptr,
                      2.0 * double(x.rows) * double(w.n) * double(w.k));
  if (ctx.kernels == KernelPath::kReference) {
    int8_linear_reference(x, w, y);
    return;
  }
  int8_linear_on(int8_best_isa(), ctx, x, w, y);
}

void int8_linear_on(Int8Isa isa, const ExecContext& ctx, Mat x, const Int8Weights& w, Mat y) {
  check_shapes(x, w, y);
  FLOWKV_CHECK(int8_isa_supported(isa), "int8_linear: this CPU lacks ", int8_isa_name(isa));
  if (isa == Int8Isa::kScalar) {
    int8_linear_reference(x, w, y);
    return;
  }
  run_fast(isa, ctx, x, w, y);
}

void int8_linear_reference(Mat x, const Int8Weights& w, Mat y) {
  check_shapes(x, w, y);
  std::vector<int8_t> q(w.k);
  std::vector<float> sx(w.blocks);
  for (int64_t m = 0; m < x.rows; ++m) {
    for (int64_t b = 0; b < w.blocks; ++b) {
      sx[b] = quantize_block_int8(x.row(m) + b * w.block, block_len(w, b), q.data() + b * w.block);
    }
    for (int64_t n = 0; n < w.n; ++n) {
      float acc = 0.0f;
      for (int64_t b = 0; b < w.blocks; ++b) {
        int32_t dot = 0;
        for (int64_t i = b * w.block; i < b * w.block + block_len(w, b); ++i) {
          dot += int32_t{q[i]} * int32_t{w.value(n, i)};
        }
        const float t = sx[b] * w.scale(n, b);
        acc = acc + t * static_cast<float>(dot);
      }
      y.row(m)[n] = acc;
    }
  }
}

}  // namespace flowkv::ops
