// The public Workspace is an arena owner: here in core beside Tensor (core/tensor.cc), so that
// every layer that takes one (families, pipeline) can use it without reaching up into api/.
#include "flowkv/workspace.h"

#include "core/arena.h"

namespace flowkv {

Workspace::Workspace() : arena_(std::make_unique<Arena>()) {}
Workspace::~Workspace() = default;
Workspace::Workspace(Workspace&&) noexcept = default;
Workspace& Workspace::operator=(Workspace&&) noexcept = default;
int64_t Workspace::capacity_bytes() const {
  return arena_->capacity_bytes();
}
int64_t Workspace::grow_count() const {
  return arena_->grow_count();
}
Arena& Workspace::arena() {
  return *arena_;
}

}  // namespace flowkv
