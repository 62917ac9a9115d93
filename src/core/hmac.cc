#include "core/hmac.h"

#include <algorithm>

namespace flowkv {

namespace {
constexpr size_t kBlock = 64;  // SHA-256's block size
constexpr uint8_t kInnerPad = 0x36, kOuterPad = 0x5c;
}  // namespace

HmacSha256::HmacSha256(const void* key, size_t key_bytes) {
  // A key longer than a block is replaced by its hash; shorter ones are padded with zeros.
  std::array<uint8_t, kBlock> k{};
  if (key_bytes > kBlock) {
    const Sha256Digest d = Sha256::of(key, key_bytes);
    std::copy(d.begin(), d.end(), k.begin());
  } else if (key_bytes > 0) {
    const auto* p = static_cast<const uint8_t*>(key);
    std::copy(p, p + key_bytes, k.begin());
  }
  std::array<uint8_t, kBlock> inner_key{};
  for (size_t i = 0; i < kBlock; ++i) {
    inner_key[i] = k[i] ^ kInnerPad;
    outer_key_[i] = k[i] ^ kOuterPad;
  }
  inner_.update(inner_key.data(), inner_key.size());
}

void HmacSha256::update(const void* data, size_t n) {
  inner_.update(data, n);
}

Sha256Digest HmacSha256::finish() {
  const Sha256Digest inner = inner_.finish();  // refuses a second finish()
  Sha256 outer;
  outer.update(outer_key_.data(), outer_key_.size());
  outer.update(inner.data(), inner.size());
  return outer.finish();
}

Sha256Digest HmacSha256::of(const void* key, size_t key_bytes, const void* data, size_t n) {
  HmacSha256 h(key, key_bytes);
  h.update(data, n);
  return h.finish();
}

bool mac_equal(const Sha256Digest& mac, const uint8_t* p) {
  uint8_t diff = 0;
  for (size_t i = 0; i < mac.size(); ++i) diff |= static_cast<uint8_t>(mac[i] ^ p[i]);
  return diff == 0;
}

}  // namespace flowkv
