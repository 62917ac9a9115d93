// The reference store's disk tier, below the Store: the store's secret, file names, the entry
// file format (written streaming, sealed with HMAC-SHA256 under the secret, read back from one
// buffer that the entry's tensors then point into), and reading a file without trusting it.
// docs/reliability.md describes the format.
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

// ---- the store's secret

// "<disk_dir>/store.key": 32 random bytes, mode 0600, made once when the store is first opened.
// Files are sealed with it, so a file that anyone else wrote (or that another store wrote) is
// never accepted.
inline constexpr const char* kSecretFile = "store.key";

struct SecretResult {
  bool ok = false;
  Secret secret{};
  std::string error;  // when !ok: why the secret could not be created
};
// The secret of the store in `dir`, created when absent: 32 bytes from getrandom() written to a
// temporary made with O_EXCL (0600), fsynced, then link()ed to its name, which fails if it
// exists; so stores opening a new folder at once all end up with the one secret that was linked
// first. Throws flowkv::Error naming the file when the secret file exists but is not one the
// store can trust: not a regular file (a symlink, a folder, a FIFO), not 32 bytes, readable or
// writable by group or others, or unreadable. A folder where it cannot be created (missing, not
// writable) is no error here: !ok, and the disk tier answers misses and fails its writes.
SecretResult open_secret(const std::string& dir);

// ---- entries

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
// Streams the file's bytes to `out` (in pieces; the payloads straight from the tensors), sealed
// with `secret`. Throws before the first byte for an entry holding a non-finite value (NaN or
// Inf in a float payload or a quantized block's scale): such an entry is never written.
void write_entry(const Key& key, const Entry& entry, const Secret& secret,
                 const std::function<void(const void*, size_t)>& out);
// Parses bytes that claim to be `key`'s entry sealed with `secret`. With `holder` (which keeps
// `data` alive) the tensors point into `data` (it must be 64-byte aligned); without, copies.
Entry parse_entry(const Key& key, const uint8_t* data, size_t n, const Secret& secret,
                  const std::string& what, const std::shared_ptr<void>& holder);
// For tests and the fuzz target: `bytes` with both MACs recomputed under `secret` where the
// header's length field places them (each only where it fits), so that the checks behind the
// MACs can be reached with altered bytes.
std::string reseal(const Secret& secret, std::string bytes);

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
// Reads and checks the file at `path` for `key`. Before a payload byte is read or its buffer
// allocated: the file must be a regular file no larger than `max_bytes`, not sparse (a large
// file with far fewer bytes on disk than its length), and its header (read alone, at most
// ~300 KiB) must carry a valid MAC and describe exactly the file's size; anything else is bad.
ReadResult read_entry_file(const std::string& path, const Key& key, const Secret& secret,
                           int64_t max_bytes);

// Removes `path` if it is still the file (dev, ino) that was read (not a newer one written
// since under the same name). Errors are ignored: a file left behind is checked again.
void remove_if_same(const std::string& path, dev_t dev, ino_t ino);

}  // namespace flowkv::store::disk
