// The reference store's disk tier, below the Store: file names, the entry file format (written
// streaming, read back from one buffer that the entry's tensors then point into), and reading
// a file without trusting it. docs/reliability.md describes the format.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "cache/ref_store.h"

namespace flowkv::store::disk {

// A kind is 1 to limits::kMaxStoreKindBytes of [a-z0-9_] (it becomes part of a file name, and
// '-' separates it from the digest there).
bool valid_kind(std::string_view kind);
void check_kind(std::string_view kind);  // throws flowkv::Error naming it

// "<kind>-<64 hex>", the entry's id in RAM and on disk, and its file name (id + ".fkv").
std::string id_of(const Key& key);
std::string file_name(const Key& key);
// Whether `name` follows the pattern; the key it names goes to *key.
bool parse_file_name(std::string_view name, Key* key);

// The writer's process id when `name` is an AtomicFile temporary of an entry file
// ("<file name>.tmp-flowkv-<pid>-<n>"), else -1.
long temp_file_pid(std::string_view name);

// Bytes of the entry's file (throws for an entry the format cannot hold: an undefined tensor,
// too many tensors or dimensions).
int64_t file_bytes(const Key& key, const Entry& entry);
// Streams the file's bytes to `out` (in pieces; the payloads straight from the tensors).
void write_entry(const Key& key, const Entry& entry,
                 const std::function<void(const void*, size_t)>& out);
// Parses bytes that claim to be `key`'s entry. With `holder` (which keeps `data` alive) the
// tensors point into `data` (it must be 64-byte aligned); without, they are copies.
Entry parse_entry(const Key& key, const uint8_t* data, size_t n, const std::string& what,
                  const std::shared_ptr<void>& holder);

struct ReadResult {
  enum Status {
    kMissing,      // no such file
    kUnavailable,  // not read now (it does not fit the memory budget): a miss, the file stays
    kOk,
    kBad,  // failed its check: `error` says why; the file (dev, ino) should be removed
  };
  Status status = kMissing;
  Entry entry;
  std::string error;
  dev_t dev = 0;
  ino_t ino = 0;
};
// Reads and checks the file at `path` for `key`; a file over `max_bytes` is bad.
ReadResult read_entry_file(const std::string& path, const Key& key, int64_t max_bytes);

// Removes `path` if it is still the file (dev, ino) that was read (not a newer one written
// since under the same name). Errors are ignored: a file left behind is checked again.
void remove_if_same(const std::string& path, dev_t dev, ino_t ino);

}  // namespace flowkv::store::disk
