#include "core/arena.h"

#include <algorithm>
#include <cstdlib>

#include "flowkv/error.h"

namespace flowkv {

namespace {
constexpr size_t kAlign = 64;
constexpr size_t kMinBlock = size_t{16} << 20;
}  // namespace

void* Arena::bytes(int64_t n) {
  FLOWKV_CHECK(n >= 0, "arena: negative allocation");
  const size_t need = (static_cast<size_t>(n) + kAlign - 1) / kAlign * kAlign;
  // Use the current block, or any later block (kept from earlier, larger calls) that fits.
  while (current_ < blocks_.size()) {
    Block& b = blocks_[current_];
    if (offset_ + need <= b.size) {
      void* p = b.data.get() + offset_;
      offset_ += need;
      return p;
    }
    ++current_;
    offset_ = 0;
  }
  const size_t size = std::max(kMinBlock, need);
  auto* raw = static_cast<std::byte*>(std::aligned_alloc(kAlign, size));
  if (!raw) fail("out of memory: the workspace needs another ", size, " bytes");
  Block b;
  b.data = {raw, [](std::byte* p) { std::free(p); }};
  b.size = size;
  blocks_.push_back(std::move(b));
  ++grow_count_;
  current_ = blocks_.size() - 1;
  offset_ = need;
  return raw;
}

int64_t Arena::capacity_bytes() const {
  int64_t total = 0;
  for (const Block& b : blocks_) total += static_cast<int64_t>(b.size);
  return total;
}

}  // namespace flowkv
