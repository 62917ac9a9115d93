// HMAC-SHA256 (RFC 2104 over core/sha256.h): a keyed checksum. The reference store's disk tier
// seals each file with it under a secret that only the store holds, so that whoever can write
// the store's folder cannot make a file the store accepts (a plain hash they can recompute).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

#include "core/sha256.h"

namespace flowkv {

class HmacSha256 {
 public:
  HmacSha256(const void* key, size_t key_bytes);
  HmacSha256(const HmacSha256&) = delete;
  HmacSha256& operator=(const HmacSha256&) = delete;

  void update(const void* data, size_t n);
  // The MAC of everything given to update(); once.
  Sha256Digest finish();

  static Sha256Digest of(const void* key, size_t key_bytes, const void* data, size_t n);

 private:
  std::array<uint8_t, 64> outer_key_{};  // the block-sized key XOR opad
  Sha256 inner_;
};

// Whether the 32 bytes at `p` equal `mac`, in time that does not depend on where they differ.
bool mac_equal(const Sha256Digest& mac, const uint8_t* p);

}  // namespace flowkv
