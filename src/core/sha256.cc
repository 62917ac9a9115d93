#include "core/sha256.h"

#include <openssl/evp.h>

#include "flowkv/error.h"

namespace flowkv {

namespace {
EVP_MD_CTX* ctx_of(void* p) {
  return static_cast<EVP_MD_CTX*>(p);
}
}  // namespace

Sha256::Sha256() {
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  if (!ctx) fail("SHA-256: out of memory");
  if (EVP_DigestInit_ex(ctx, EVP_sha256(), nullptr) != 1) {
    EVP_MD_CTX_free(ctx);
    fail("SHA-256: libcrypto cannot start a digest");
  }
  ctx_ = ctx;
}

Sha256::~Sha256() {
  EVP_MD_CTX_free(ctx_of(ctx_));
}

void Sha256::update(const void* data, size_t n) {
  FLOWKV_CHECK(!finished_, "SHA-256: update after finish");
  if (n == 0) return;
  if (EVP_DigestUpdate(ctx_of(ctx_), data, n) != 1) fail("SHA-256: libcrypto update failed");
}

Sha256Digest Sha256::finish() {
  FLOWKV_CHECK(!finished_, "SHA-256: finish called twice");
  finished_ = true;
  Sha256Digest d{};
  unsigned int len = 0;
  if (EVP_DigestFinal_ex(ctx_of(ctx_), d.data(), &len) != 1 || len != d.size()) {
    fail("SHA-256: libcrypto finish failed");
  }
  return d;
}

Sha256Digest Sha256::of(const void* data, size_t n) {
  Sha256 h;
  h.update(data, n);
  return h.finish();
}

}  // namespace flowkv
