#include "core/arena.h"

#include <sys/mman.h>
#include <algorithm>

#include <cstdlib>

#include "flowkv/error.h"

namespace flowkv {

namespace {
constexpr size_t kAlign = 64;
constexpr size_t kMinBlock = size_t{16} << 20;
}  // namespace

void detail::Unmap::operator()(std::byte* p) const {
  munmap(p, size);
}

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
  // Mapped directly (64-byte aligned, as pages are): released to the system when the arena goes.
  void* raw = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) fail("out of memory: the workspace needs another ", size, " bytes");
  Block b;
  b.data = std::unique_ptr<std::byte[], detail::Unmap>(static_cast<std::byte*>(raw),
                                                       detail::Unmap{size});
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
