// Workspace: the activations and scratch of one worker. Reused across calls, it grows to the
// largest shape it meets (its first, largest call) and then never allocates again; pass the
// same one to every step of a denoising loop. Not shared between threads.
#pragma once

#include <cstdint>
#include <memory>

namespace flowkv {

class Arena;

class Workspace {
 public:
  Workspace();
  ~Workspace();
  Workspace(Workspace&&) noexcept;
  Workspace& operator=(Workspace&&) noexcept;

  int64_t capacity_bytes() const;
  int64_t grow_count() const;  // how many times it had to allocate
  Arena& arena();

 private:
  std::unique_ptr<Arena> arena_;
};

}  // namespace flowkv
