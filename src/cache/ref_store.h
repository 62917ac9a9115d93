// The reference store's engine side (the public face is include/flowkv/store.h): content keys,
// immutable entries of tensors, pinning by handle, LRU eviction within a byte budget, and the
// disk tier. Families build keys and read / fill entries; the store knows no family.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "flowkv/store.h"
#include "flowkv/tensor.h"

namespace flowkv::store {

using Digest = std::array<uint8_t, 32>;  // SHA-256
// A disk tier's secret (disk::open_secret): the key of the HMAC that seals its files.
using Secret = std::array<uint8_t, 32>;

struct Key {
  std::string kind;  // "kv", "latents", "prompt" (a short lowercase word)
  Digest digest{};
  std::string hex() const;  // 64 lowercase hex digits of the digest
  bool operator==(const Key& o) const { return kind == o.kind && digest == o.digest; }
};

// A key from named fields. Every field is framed (label, type, length, bytes), so no two
// different field sequences hash the same input: "ab"+"c" and "a"+"bc" give different keys.
class KeyBuilder {
 public:
  explicit KeyBuilder(std::string kind);
  ~KeyBuilder();
  KeyBuilder(const KeyBuilder&) = delete;
  KeyBuilder& operator=(const KeyBuilder&) = delete;

  KeyBuilder& bytes(std::string_view label, const void* data, size_t n);
  KeyBuilder& text(std::string_view label, std::string_view value);
  KeyBuilder& integer(std::string_view label, int64_t value);
  KeyBuilder& real(std::string_view label, double value);  // its bit pattern
  // dtype, shape and every byte of the tensor's storage.
  KeyBuilder& tensor(std::string_view label, const Tensor& t);
  Key finish();  // once

 private:
  struct State;
  std::unique_ptr<State> s_;
  std::string kind_;
};

// What an entry holds: tensors (owned, contiguous), immutable once inserted.
struct Entry {
  std::vector<Tensor> tensors;
  int64_t bytes() const;  // sum of the tensors' nbytes
};

// Holding a handle pins the entry: it is never evicted from RAM while any handle lives.
using Handle = std::shared_ptr<const Entry>;

// The store (ReferenceStore::Impl holds one).
class Store {
 public:
  // Throws flowkv::Error when the disk tier's secret file exists but cannot be trusted
  // (disk::open_secret).
  explicit Store(const StoreOptions& o);
  ~Store();

  // RAM first, then the disk tier (a file that fails its check is removed and counted as a
  // disk error, and the lookup is a miss). Counts a hit or a miss for key.kind.
  Handle find(const Key& key);
  // Adds an entry (copied tensors are not made: the entry's tensors are shared, the caller must
  // not write to them afterwards) and returns its handle. When the key is already present the
  // existing entry is returned and `entry` is dropped (two requests that missed together
  // computed the same value). When the entry cannot fit beside the pinned ones it is not kept
  // (counted as rejected), and the returned handle holds it for the caller alone. With a disk
  // tier the entry is also written there (atomically).
  Handle insert(const Key& key, Entry entry);

  StoreStats stats() const;
  void clear();
  const StoreOptions& options() const;
  // What the last disk error was (a file that failed its check, a write that failed), for
  // logs; "" when none.
  std::string last_disk_error() const;

  struct State;

 private:
  std::unique_ptr<State> s_;
};

// The store behind a public ReferenceStore.
Store& of(const ReferenceStore& r);

// The disk tier's file format, exposed for its fuzz target and tests: an entry's bytes sealed
// with `secret`, and the entry read back from bytes that claim to be `key`'s (throws
// flowkv::Error naming what is wrong: magic, version, header MAC, key, counts, dtypes, shapes,
// sizes, padding, file MAC, non-finite values; every size is checked against the bytes present
// before anything is allocated).
std::string serialize(const Key& key, const Entry& entry, const Secret& secret);
Entry deserialize(const Key& key, std::string_view bytes, const Secret& secret,
                  const std::string& what);

}  // namespace flowkv::store
