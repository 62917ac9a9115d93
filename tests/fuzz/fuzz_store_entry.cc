// libFuzzer target: the reference store's disk-tier entry files (cache/ref_store.h
// deserialize), which anyone with access to the store's folder can write. Each input is read as
// a file three ways: for a fixed key (the key checks refuse almost everything), for the key its
// own header names (so the size checks and the checksum are reached), and for that key with the
// trailing checksum recomputed (so the padding checks and the tensor building are reached too).
// An accepted file must be exactly what serialize() writes for the entry it gave.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

#include "cache/ref_store.h"
#include "core/sha256.h"
#include "fuzz_common.h"

namespace {

using flowkv::store::Entry;
using flowkv::store::Key;

void check(const Key& key, std::string_view bytes) {
  Entry e;
  bool accepted = false;
  flowkv::fuzz::expect_only_flowkv_errors([&] {
    e = flowkv::store::deserialize(key, bytes, "fuzz.fkv");
    accepted = true;
  });
  if (!accepted) return;
  // Outside the catch: what the reader accepted, the writer must write (an Error here is a bug).
  const std::string again = flowkv::store::serialize(key, e);
  FUZZ_ASSERT(again == bytes, "accepted %zu bytes that serialize back as %zu different ones",
              bytes.size(), again.size());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  check(Key{"kv", {}}, bytes);
  // The header's own key: magic 8, version 4, kind length 1, kind, digest 32.
  if (size < 13) return 0;
  const size_t kind_len = data[12];
  if (size < 13 + kind_len + 32) return 0;
  Key own;
  own.kind.assign(reinterpret_cast<const char*>(data + 13), kind_len);
  std::memcpy(own.digest.data(), data + 13 + kind_len, 32);
  check(own, bytes);
  if (size < 13 + kind_len + 32 + 32) return 0;
  std::string sealed(bytes);
  const flowkv::Sha256Digest sum = flowkv::Sha256::of(sealed.data(), sealed.size() - 32);
  std::memcpy(sealed.data() + sealed.size() - 32, sum.data(), 32);
  check(own, sealed);
  return 0;
}
