// What every family's block loop shares: the block-hook protocol (cache/hooks.h) - begin (with
// the probe, computed only when a policy reads it), then per block before_block -> run or skip
// -> after_block, then end; inside a block, each hookable sublayer's output either fetched from
// the hooks or computed and shown to them - and the lazily advanced segment.
#pragma once

#include <cstdint>
#include <utility>

#include "cache/hooks.h"
#include "core/arena.h"
#include "core/mat.h"

namespace flowkv {

class BlockLoop {
 public:
  explicit BlockLoop(cache::BlockHooks* hooks) : hooks_(hooks) {}

  cache::BlockHooks* hooks() const { return hooks_; }

  // Before the first block. `make_probe()` returns the probe Mat (the first block's modulated
  // target input); it runs only when a policy wants it.
  template <class MakeProbe>
  void begin(cache::Streams& streams, MakeProbe&& make_probe) {
    if (!hooks_) return;
    const Mat probe = hooks_->wants_probe() ? std::forward<MakeProbe>(make_probe)() : Mat{};
    hooks_->begin(streams, probe);
  }

  // Blocks [first, last) over the same streams. `block(i, run)` runs block i; run is false when
  // the hooks skip it (its dynamic streams then stay as they are).
  template <class Block>
  void run(int64_t first, int64_t last, cache::Streams& streams, Block&& block) {
    for (int64_t i = first; i < last; ++i) {
      const int b = static_cast<int>(i);
      const bool run = !hooks_ || hooks_->before_block(b, streams) == cache::BlockAction::kRun;
      block(i, run);
      if (hooks_) hooks_->after_block(b, streams);
    }
  }

  void end(cache::Streams& streams) {
    if (hooks_) hooks_->end(streams);
  }

  // Whether block i's sublayer is reused instead of computed. Ask once per block and sublayer
  // (policies count the calls).
  bool reuse(int64_t block, cache::Sublayer which) const {
    return hooks_ && hooks_->reuse(static_cast<int>(block), which);
  }

  // A sublayer's output into `out` (laid out as the streams): fetched when `reused`, else
  // `compute()` fills it and the hooks see it.
  template <class Compute>
  void sublayer(int64_t block, cache::Sublayer which, bool reused, cache::Streams& out,
                Compute&& compute) const {
    const int b = static_cast<int>(block);
    if (reused) {
      hooks_->fetch(b, which, out);
      return;
    }
    compute();
    if (hooks_) hooks_->store(b, which, out);
  }

 private:
  cache::BlockHooks* hooks_;
};

// A segment that no dynamic stream writes to (FLUX.2's references, Qwen-Image-2.1's prefix)
// advances only when something reads it. Its block i reads only its own block i-1, so running
// it late gives the same bits. Block i runs when its K/V must be stored (`eager`: every block,
// as the loop reaches it) or when a dynamic stream attends at block i and reads them; blocks
// nothing read are caught up in order first. A call whose blocks are all skipped or forecast
// never starts it. Its buffers are allocated up front (they outlive every block's arena scope);
// start() and the blocks only compute into them.
class LazySegment {
 public:
  explicit LazySegment(bool eager) : eager_(eager) {}
  bool eager() const { return eager_; }
  bool started() const { return started_; }
  // Whether block i computes the segment, given whether a dynamic stream attends there.
  bool needed(bool dynamic_attends) const { return eager_ || dynamic_attends; }

  // Runs `start()` (the segment's input projections and modulation) unless it ran already.
  template <class Start>
  void start(Start&& start) {
    if (started_) return;
    start();
    started_ = true;
  }
  // Brings the segment to block i's input: start, then block(j) for every j in [done, i), each
  // in its own arena scope. The caller then runs block i in its own scope (its K/V are read
  // there) and reports it with ran(i).
  template <class Start, class Block>
  void catch_up(int64_t i, Arena& ws, Start&& start_fn, Block&& block) {
    start(std::forward<Start>(start_fn));
    for (; next_ < i; ++next_) {
      ArenaScope scope(ws);
      block(next_);
    }
  }
  void ran(int64_t i) { next_ = i + 1; }

 private:
  bool eager_;
  bool started_ = false;
  int64_t next_ = 0;  // blocks done
};

}  // namespace flowkv
