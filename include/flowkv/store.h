// The reference store: the step-0 products of conditioning kept across requests, so that the
// same product photo or character sheet, edited request after request, is encoded once.
//
// Three kinds of entry, each under a content key (a SHA-256 over everything that decides its
// value; docs/serving.md lists the fields):
//   "latents"  a conditioning image's VAE latents (key: the image's bytes, its preprocessing,
//              the VAE's identity)
//   "prompt"   a prompt's embeddings (key: token ids, the text encoder's identity)
//   "kv"       the K/V of a whole conditioning set for every layer (key: the transformer's
//              identity and compute type, the pipeline variant, the ordered conditioning latents
//              with their position offsets and grids, and for a prefix that reads the text, the
//              text embeddings). The unit is the whole set: references attend to each other.
// A hit gives output bit-identical to a miss. An entry a running request holds is pinned; the
// others are evicted least recently used first when the RAM budget is exceeded. An optional
// disk tier keeps evicted and new entries as files in a folder, each sealed with HMAC-SHA256
// under a secret the store makes once in that folder (store.key, mode 0600), and checked
// (format, MACs, key, sizes, finite values) when read back and dropped when it fails the check:
// a file anyone else wrote, or another store, is never served.
// Thread-safe: one store serves concurrent requests.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>

namespace flowkv {

struct StoreOptions {
  int64_t ram_bytes = int64_t{2} << 30;  // entries held in memory (pinned ones may exceed it)
  // The share of ram_bytes prompt embeddings may hold; they evict only each other, so that new
  // prompts never push out reference work (latents, K/V), which they can.
  double prompt_share = 0.125;
  // "": no disk tier. The folder holds the store's secret, store.key: a ReferenceStore refuses
  // (flowkv::Error) a store.key that is not a 32-byte regular file readable by its owner only.
  std::string disk_dir;
  int64_t disk_bytes = int64_t{16} << 30;
};

struct StoreKindStats {
  int64_t hits = 0, misses = 0, entries = 0, bytes = 0;
};

struct StoreStats {
  int64_t hits = 0;        // found in RAM or on disk
  int64_t disk_hits = 0;   // of those, read back from the disk tier
  int64_t misses = 0;      // not found: the caller computed it
  int64_t insertions = 0;  // entries added
  int64_t evictions = 0;   // entries dropped from RAM to stay within the budget
  int64_t rejected = 0;    // entries larger than the budget left by pinned ones (not kept)
  int64_t disk_writes = 0, disk_evictions = 0;
  int64_t disk_errors = 0;                   // files failing their check (removed); failed writes
  int64_t entries = 0, bytes = 0;            // in RAM now
  int64_t pinned = 0, pinned_bytes = 0;      // held by running requests now
  int64_t disk_entries = 0, disk_bytes = 0;  // in the disk tier now
  std::map<std::string, StoreKindStats> kinds;  // "kv", "latents", "prompt"
};

class ReferenceStore {
 public:
  explicit ReferenceStore(const StoreOptions& options = {});
  ~ReferenceStore();
  ReferenceStore(const ReferenceStore&) = delete;
  ReferenceStore& operator=(const ReferenceStore&) = delete;

  const StoreOptions& options() const;
  StoreStats stats() const;
  // Drops every entry no request holds (RAM only; the disk tier stays).
  void clear();

  struct Impl;
  Impl& impl() const { return *impl_; }

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace flowkv
