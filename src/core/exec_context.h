// ExecContext: what one forward runs with. Passed explicitly; nothing of it is global.
#pragma once

#include <ostream>
#include <string>
#include <string_view>
#include <vector>

#include "core/arena.h"
#include "core/mat.h"
#include "flowkv/tensor.h"

namespace flowkv {

// Which implementation of each op to run: the fast kernels, or the plain scalar references
// the fast ones are tested against.
enum class KernelPath { kFast, kReference };

// Receives named intermediates (names as in tests/golden, e.g. "transformer_blocks.0.attn.k").
class Tracer {
 public:
  virtual ~Tracer() = default;
  virtual bool wants(std::string_view name) const { return true; }
  virtual void record(std::string_view name, const Tensor& value) = 0;
};

// A tracer that fails, naming it, at the first intermediate holding NaN or infinity.
class FiniteChecker : public Tracer {
 public:
  void record(std::string_view name, const Tensor& value) override;
};

// Time and work of the heavy ops, accumulated when a forward is profiled.
struct OpTotals {
  double seconds = 0;
  double flops = 0;
  int64_t calls = 0;
};
struct Profile {
  OpTotals linear;     // every Linear::forward (2*M*N*K FLOPs)
  OpTotals attention;  // every attention call (4*head_dim FLOPs per allowed query-key pair)
};

struct ExecContext {
  Arena* arena = nullptr;
  KernelPath kernels = KernelPath::kFast;
  Tracer* tracer = nullptr;
  Profile* profile = nullptr;
};

// Adds the lifetime of this object to `totals` (when profiling).
class ScopedOpTimer {
 public:
  ScopedOpTimer(OpTotals* totals, double flops);
  ~ScopedOpTimer();
  ScopedOpTimer(const ScopedOpTimer&) = delete;
  ScopedOpTimer& operator=(const ScopedOpTimer&) = delete;

 private:
  OpTotals* totals_;
  double flops_;
  double start_;
};

// A trace name that costs nothing until a tracer asks for it: "<block><index>.<leaf>"
// ("transformer_blocks.3.attn.k") or a plain name. Models build these on every block whether
// or not a tracer is attached, so no string is made unless one is.
struct TraceName {
  std::string_view block;  // "transformer_blocks." ("" for a plain name)
  int64_t index = -1;
  std::string_view leaf;
  TraceName(const char* name) : leaf(name) {}  // NOLINT: a plain name
  TraceName(std::string_view block, int64_t index, std::string_view leaf)
      : block(block), index(index), leaf(leaf) {}
  std::string str() const;
};

// The prefix of one block's names: `p + "attn.k"` is that block's "attn.k".
struct TraceBlock {
  std::string_view block;
  int64_t index;
  TraceName operator+(std::string_view leaf) const { return {block, index, leaf}; }
};
std::ostream& operator<<(std::ostream& out, const TraceBlock& b);

// Records the row-wise concatenation of `parts` (each [B*S_i, C]) as one [B, sum S_i, C]
// (or, with `heads`, [B, sum S_i, heads, C/heads]) tensor. Costs nothing without a tracer.
struct TracePart {
  Mat m;
  int64_t seq;             // rows per batch element
  int64_t batch_rows = 0;  // rows from one batch element to the next in m (0: seq)
};
void trace_parts(const ExecContext& ctx, const TraceName& name, int64_t batch,
                 std::initializer_list<TracePart> parts, int64_t heads = 0);
void trace_tensor(const ExecContext& ctx, const TraceName& name, const float* data, Shape shape);

}  // namespace flowkv
