// Workspace arena: bump allocation of activations and scratch for one forward.
// A scope (Arena::Mark) releases everything allocated inside it. The arena grows only while a
// request meets a shape larger than any before (its first, largest call); after that the step
// loop runs without touching the heap. `grow_count()` lets tests check that.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace flowkv {

namespace detail {
struct Unmap {  // deleter of a block mapped with mmap
  size_t size;
  void operator()(std::byte* p) const;
};
}  // namespace detail

class Arena {
 public:
  Arena() = default;
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;

  // Returns 64-byte aligned, uninitialised memory for n floats.
  float* floats(int64_t n) { return static_cast<float*>(bytes(n * 4)); }
  uint16_t* halves(int64_t n) { return static_cast<uint16_t*>(bytes(n * 2)); }
  void* bytes(int64_t n);

  struct Mark {
    size_t block;
    size_t offset;
  };
  Mark mark() const { return {current_, offset_}; }
  void release(Mark m) {
    current_ = m.block;
    offset_ = m.offset;
  }

  int64_t capacity_bytes() const;
  int64_t grow_count() const { return grow_count_; }

 private:
  struct Block {
    std::unique_ptr<std::byte[], detail::Unmap> data;
    size_t size = 0;
  };
  std::vector<Block> blocks_;
  size_t current_ = 0;
  size_t offset_ = 0;
  int64_t grow_count_ = 0;
};

// RAII scope: everything allocated from `arena` during the scope's life is released at its end.
class ArenaScope {
 public:
  explicit ArenaScope(Arena& a) : arena_(a), mark_(a.mark()) {}
  ~ArenaScope() { arena_.release(mark_); }
  ArenaScope(const ArenaScope&) = delete;
  ArenaScope& operator=(const ArenaScope&) = delete;

 private:
  Arena& arena_;
  Arena::Mark mark_;
};

}  // namespace flowkv
