#include "core/exec_context.h"

#include <chrono>
#include <cstring>

#include "flowkv/error.h"

namespace flowkv {

namespace {
double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
}  // namespace

ScopedOpTimer::ScopedOpTimer(OpTotals* totals, double flops)
    : totals_(totals), flops_(flops), start_(totals ? now_seconds() : 0) {}

ScopedOpTimer::~ScopedOpTimer() {
  if (!totals_) return;
  totals_->seconds += now_seconds() - start_;
  totals_->flops += flops_;
  ++totals_->calls;
}

void FiniteChecker::record(std::string_view name, const Tensor& value) {
  const int64_t bad = first_non_finite(value);
  FLOWKV_CHECK(bad < 0, "forward: '", name, "' ", shape_str(value.shape()),
               " is the first intermediate that holds NaN or infinity (element ", bad, ")");
}

std::string TraceName::str() const {
  if (block.empty()) return std::string(leaf);
  return std::string(block) + std::to_string(index) + "." + std::string(leaf);
}

std::ostream& operator<<(std::ostream& out, const TraceBlock& b) {
  return out << b.block << b.index << ".";
}

void trace_parts(const ExecContext& ctx, const TraceName& trace_name, int64_t batch,
                 std::initializer_list<TracePart> parts, int64_t heads) {
  if (!ctx.tracer) return;
  const std::string name = trace_name.str();
  if (!ctx.tracer->wants(name)) return;
  int64_t seq = 0, cols = -1;
  for (const TracePart& p : parts) {
    seq += p.seq;
    if (p.seq > 0) cols = p.m.cols;
  }
  if (cols < 0) return;
  Shape shape = heads > 0 ? Shape{batch, seq, heads, cols / heads} : Shape{batch, seq, cols};
  Tensor t = Tensor::empty(shape);
  float* out = t.f32();
  for (int64_t b = 0; b < batch; ++b) {
    for (const TracePart& p : parts) {
      const int64_t first = b * (p.batch_rows > 0 ? p.batch_rows : p.seq);
      for (int64_t s = 0; s < p.seq; ++s) {
        std::memcpy(out, p.m.row(first + s), static_cast<size_t>(cols) * 4);
        out += cols;
      }
    }
  }
  ctx.tracer->record(name, t);
}

void trace_tensor(const ExecContext& ctx, const TraceName& trace_name, const float* data,
                  Shape shape) {
  if (!ctx.tracer) return;
  const std::string name = trace_name.str();
  if (!ctx.tracer->wants(name)) return;
  Tensor t = Tensor::empty(std::move(shape));
  std::memcpy(t.f32(), data, static_cast<size_t>(t.nbytes()));
  ctx.tracer->record(name, t);
}

}  // namespace flowkv
