// Threaded drivers of the row kernels, and the dispatch between fast and reference paths.
#include "core/parallel.h"
#include "ops/cpu/row_kernels.h"
#include "ops/ops.h"

namespace flowkv::ops {

namespace {

// Rows per task: fixed by the shape so the split never depends on the thread count.
int64_t rows_per_task(int64_t cols) {
  const int64_t target = 16384;  // floats of work per task
  return std::max<int64_t>(1, target / std::max<int64_t>(cols, 1));
}

template <class Fn>
void for_row_blocks(int64_t rows, int64_t cols, Fn&& fn) {
  const int64_t per = rows_per_task(cols);
  const int64_t tasks = (rows + per - 1) / per;
  parallel_for(tasks, [&](int64_t t) {
    const int64_t r1 = std::min(rows, (t + 1) * per);
    for (int64_t r = t * per; r < r1; ++r) fn(r);
  });
}

bool use_ref(const ExecContext& ctx) {
  return ctx.kernels == KernelPath::kReference;
}

}  // namespace

void layer_norm_modulate(const ExecContext& ctx, Mat x, Mat y, ModRows scale, ModRows shift,
                         float eps) {
  if (use_ref(ctx)) return ref::layer_norm_modulate(x, y, scale, shift, eps);
  const auto& k = cpu::row_kernels();
  for_row_blocks(x.rows, x.cols, [&](int64_t r) {
    k.layer_norm_modulate(x.row(r), y.row(r), x.cols, scale.at(r), shift.at(r), eps);
  });
}

void gated_add(const ExecContext& ctx, Mat x, Mat y, ModRows gate) {
  if (use_ref(ctx)) return ref::gated_add(x, y, gate);
  const auto& k = cpu::row_kernels();
  for_row_blocks(x.rows, x.cols,
                 [&](int64_t r) { k.gated_add(x.row(r), y.row(r), gate.at(r), x.cols); });
}

void rms_norm_rope(const ExecContext& ctx, Mat x, int64_t head_dim, const float* weight, float eps,
                   RopeRows rope) {
  FLOWKV_CHECK(x.cols % head_dim == 0 && head_dim % 2 == 0, "rms_norm_rope: width ", x.cols,
               " is not a whole number of even heads of ", head_dim);
  if (use_ref(ctx)) return ref::rms_norm_rope(x, head_dim, weight, eps, rope);
  const auto& k = cpu::row_kernels();
  for_row_blocks(x.rows, x.cols, [&](int64_t r) {
    const int64_t t = (r % rope.seq) * head_dim;
    k.rms_norm_rope(x.row(r), x.cols / head_dim, head_dim, weight, eps,
                    rope.cos ? rope.cos + t : nullptr, rope.sin ? rope.sin + t : nullptr,
                    rope.half);
  });
}

void swiglu(const ExecContext& ctx, Mat in, Mat out) {
  if (use_ref(ctx)) return ref::swiglu(in, out);
  const auto& k = cpu::row_kernels();
  for_row_blocks(in.rows, in.cols, [&](int64_t r) { k.swiglu(in.row(r), out.row(r), out.cols); });
}

void silu(const ExecContext& ctx, const float* x, float* y, int64_t n) {
  if (use_ref(ctx)) return ref::silu(x, y, n);
  cpu::row_kernels().silu(x, y, n);
}

void gelu_tanh(const ExecContext& ctx, Mat x) {
  if (use_ref(ctx)) return ref::gelu_tanh(x);
  const auto& k = cpu::row_kernels();
  for_row_blocks(x.rows, x.cols, [&](int64_t r) { k.gelu_tanh(x.row(r), x.cols); });
}

// No vector kernel: the patch mergers are its only user (a few thousand rows per image); the
// fast path threads the reference's rows.
void gelu_erf(const ExecContext& ctx, Mat x) {
  if (use_ref(ctx)) return ref::gelu_erf(x);
  for_row_blocks(x.rows, x.cols, [&](int64_t r) { ref::gelu_erf(x.rows_slice(r, 1)); });
}

void to_bf16(const ExecContext& ctx, Mat x, uint16_t* out) {
  if (use_ref(ctx)) return ref::to_bf16(x, out);
  const auto& k = cpu::row_kernels();
  for_row_blocks(x.rows, x.cols, [&](int64_t r) { k.to_bf16(x.row(r), out + r * x.cols, x.cols); });
}

void round_bf16(const ExecContext& ctx, Mat x) {
  if (use_ref(ctx)) return ref::round_bf16(x);
  const auto& k = cpu::row_kernels();
  for_row_blocks(x.rows, x.cols, [&](int64_t r) { k.round_bf16(x.row(r), x.cols); });
}

}  // namespace flowkv::ops
