// SHA-256, from OpenSSL's libcrypto (EVP interface). A cryptographic hash, not a fast
// non-cryptographic one, because what it hashes may come from hostile clients: the reference
// store's content keys are built from request bytes (images, prompts) and the disk tier's
// checksums guard files anyone with access to the folder can write, so finding two inputs
// with one digest must be infeasible, not merely unlikely.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

namespace flowkv {

using Sha256Digest = std::array<uint8_t, 32>;

class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;

  void update(const void* data, size_t n);
  // The digest of everything given to update(); the hasher cannot be used afterwards.
  Sha256Digest finish();

  static Sha256Digest of(const void* data, size_t n);

 private:
  void* ctx_ = nullptr;  // EVP_MD_CTX (kept out of the header: no OpenSSL include here)
  bool finished_ = false;
};

}  // namespace flowkv
