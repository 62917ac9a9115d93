// libFuzzer target: the reference store's disk-tier entry files (cache/ref_store.h
// deserialize), which anyone with access to the store's folder can write. Files are read under
// a fixed secret (the one tests/fuzz/make_seeds.sh seals its seeds with). Each input is read as
// a file three ways: for a fixed key (the key checks refuse almost everything), for the key its
// own header names (the MACs refuse what was not sealed), and for that key with both MACs
// recomputed (disk::reseal), so that the header's fields, the sizes, the padding, the
// finiteness checks and the tensor building are reached too. An accepted file must be exactly
// what serialize() writes for the entry it gave.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

#include "cache/ref_store.h"
#include "cache/ref_store_disk.h"
#include "fuzz_common.h"

namespace {

using flowkv::store::Entry;
using flowkv::store::Key;
using flowkv::store::Secret;

// Bytes 0, 1, ..., 31 (make_seeds.sh: hexkey 000102...1f).
constexpr Secret kSecret = {0,  1,  2,  3,  4,  5,  6,  7,  8,  9,  10, 11, 12, 13, 14, 15,
                            16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31};

void check(const Key& key, std::string_view bytes) {
  Entry e;
  bool accepted = false;
  flowkv::fuzz::expect_only_flowkv_errors([&] {
    e = flowkv::store::deserialize(key, bytes, kSecret, "fuzz.fkv");
    accepted = true;
  });
  if (!accepted) return;
  // Outside the catch: what the reader accepted, the writer must write (an Error here is a bug).
  const std::string again = flowkv::store::serialize(key, e, kSecret);
  FUZZ_ASSERT(again == bytes, "accepted %zu bytes that serialize back as %zu different ones",
              bytes.size(), again.size());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  check(Key{"kv", {}}, bytes);
  // The header's own key: magic 8, version 4, header length 4, kind length 1, kind, digest 32.
  if (size < 17) return 0;
  const size_t kind_len = data[16];
  if (size < 17 + kind_len + 32) return 0;
  Key own;
  own.kind.assign(reinterpret_cast<const char*>(data + 17), kind_len);
  std::memcpy(own.digest.data(), data + 17 + kind_len, 32);
  check(own, bytes);
  check(own, flowkv::store::disk::reseal(kSecret, std::string(bytes)));
  return 0;
}
