// The reference store: content keys (SHA-256 over framed fields), a RAM tier of immutable
// entries with LRU eviction among unpinned ones, and the disk tier (ref_store_disk.cc).
//
// Pinning: the store keeps one std::shared_ptr per entry and hands out copies of it, so an
// entry is pinned exactly while its use_count() is above 1. Reading use_count() under the
// store's mutex is sound for this: a new handle to a kept entry is only made by copying the
// store's pointer under the mutex (find, insert) or by copying a handle that already exists
// (use_count was already > 1), so a count of 1 seen under the mutex cannot rise before the
// mutex is released. A count that is falling concurrently is at worst seen high: the entry is
// treated as pinned a little longer. No deleter or back-pointer is needed, so handles may
// outlive the store.
#include "cache/ref_store.h"

#include <signal.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <list>
#include <mutex>
#include <unordered_map>
#include <utility>
#include <vector>

#include "cache/ref_store_disk.h"
#include "core/sha256.h"
#include "flowkv/error.h"
#include "io/atomic_file.h"

namespace flowkv::store {

// ---- keys

// The hash input is a sequence of frames, each self-delimiting:
//   u64 label length, label, u8 type tag, then the value, which is either
//   u64 length + bytes (bytes 'b', text 's', integer 'i' (8 bytes), real 'r' (8 bytes)), or
//   for a tensor 't': u64 dtype-name length + name, u64 ndim, ndim x u64 dims,
//   u64 byte count + the storage's bytes.
// It starts with a domain tag and the kind (both framed), so keys of different kinds, or of
// another use of SHA-256, never share an input. Integers are little-endian.
struct KeyBuilder::State {
  Sha256 sha;
  bool finished = false;
  void u64(uint64_t v) {
    uint8_t b[8];
    for (int i = 0; i < 8; ++i) b[i] = static_cast<uint8_t>(v >> (8 * i));
    sha.update(b, 8);
  }
  void head(std::string_view label, char tag) {
    FLOWKV_CHECK(!finished, "store key: a field added after finish()");
    u64(label.size());
    sha.update(label.data(), label.size());
    sha.update(&tag, 1);
  }
  void field(std::string_view label, char tag, const void* data, size_t n) {
    head(label, tag);
    u64(n);
    sha.update(data, n);
  }
};

KeyBuilder::KeyBuilder(std::string kind) : s_(std::make_unique<State>()), kind_(std::move(kind)) {
  disk::check_kind(kind_);
  static constexpr std::string_view kDomain = "flowkv.store.key.v1";
  s_->field("domain", 's', kDomain.data(), kDomain.size());
  s_->field("kind", 's', kind_.data(), kind_.size());
}
KeyBuilder::~KeyBuilder() = default;

KeyBuilder& KeyBuilder::bytes(std::string_view label, const void* data, size_t n) {
  s_->field(label, 'b', data, n);
  return *this;
}
KeyBuilder& KeyBuilder::text(std::string_view label, std::string_view value) {
  s_->field(label, 's', value.data(), value.size());
  return *this;
}
KeyBuilder& KeyBuilder::integer(std::string_view label, int64_t value) {
  uint8_t b[8];
  for (int i = 0; i < 8; ++i) b[i] = static_cast<uint8_t>(static_cast<uint64_t>(value) >> (8 * i));
  s_->field(label, 'i', b, 8);
  return *this;
}
KeyBuilder& KeyBuilder::real(std::string_view label, double value) {
  uint64_t bits;
  std::memcpy(&bits, &value, 8);
  uint8_t b[8];
  for (int i = 0; i < 8; ++i) b[i] = static_cast<uint8_t>(bits >> (8 * i));
  s_->field(label, 'r', b, 8);
  return *this;
}
KeyBuilder& KeyBuilder::tensor(std::string_view label, const Tensor& t) {
  FLOWKV_CHECK(t.defined(), "store key: tensor field '", label, "' is undefined");
  s_->head(label, 't');
  const std::string_view name = dtype_name(t.dtype());
  s_->u64(name.size());
  s_->sha.update(name.data(), name.size());
  s_->u64(static_cast<uint64_t>(t.ndim()));
  for (int64_t d : t.shape()) s_->u64(static_cast<uint64_t>(d));
  s_->u64(static_cast<uint64_t>(t.nbytes()));
  s_->sha.update(t.raw(), static_cast<size_t>(t.nbytes()));
  return *this;
}
Key KeyBuilder::finish() {
  FLOWKV_CHECK(!s_->finished, "store key: finish() called twice");
  s_->finished = true;
  Key k;
  k.kind = kind_;
  k.digest = s_->sha.finish();
  return k;
}

std::string Key::hex() const {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string s(64, '0');
  for (size_t i = 0; i < digest.size(); ++i) {
    s[2 * i] = kDigits[digest[i] >> 4];
    s[2 * i + 1] = kDigits[digest[i] & 15];
  }
  return s;
}

int64_t Entry::bytes() const {
  int64_t n = 0;
  for (const Tensor& t : tensors) n += t.nbytes();
  return n;
}

// ---- the store

namespace {

namespace fs = std::filesystem;

struct Slot {
  std::shared_ptr<const Entry> entry;  // the store's own reference (see pinning above)
  std::string kind;
  int64_t bytes = 0;
  std::list<std::string>::iterator lru;
};

struct DiskFile {
  std::string kind;
  int64_t bytes = 0;
  std::list<std::string>::iterator lru;
};

bool pinned(const Slot& s) {
  return s.entry.use_count() > 1;
}

}  // namespace

struct Store::State {
  StoreOptions options;
  bool disk = false;
  // The disk tier's secret (sealed: it could be read or made; else secret_error says why, and
  // every lookup there is a miss and every write fails with it).
  bool sealed = false;
  Secret secret{};
  std::string secret_error;

  mutable std::mutex mu;  // guards everything below
  // RAM tier, by id ("<kind>-<hex>"); the LRU list's front is the most recently used.
  std::unordered_map<std::string, Slot> ram;
  std::list<std::string> ram_lru;
  int64_t ram_bytes = 0;
  // Disk tier index: the files this store knows of (found at start-up or written or read
  // since), oldest use at the back.
  std::unordered_map<std::string, DiskFile> files;
  std::list<std::string> disk_lru;
  int64_t disk_bytes = 0;
  StoreStats counts;  // the counters (entries, bytes, pinned and disk figures are computed)
  std::map<std::string, StoreKindStats> kinds;
  std::string last_disk_error;

  std::string path_of(const std::string& id) const {
    return (fs::path(options.disk_dir) / (id + ".fkv")).string();
  }

  void touch(Slot& s) { ram_lru.splice(ram_lru.begin(), ram_lru, s.lru); }

  void drop(std::unordered_map<std::string, Slot>::iterator it) {
    StoreKindStats& k = kinds[it->second.kind];
    k.entries -= 1;
    k.bytes -= it->second.bytes;
    ram_bytes -= it->second.bytes;
    ram_lru.erase(it->second.lru);
    ram.erase(it);
  }

  // Prompt embeddings are small and, with a new prompt per request, rarely reused: they may
  // hold at most prompt_share of the budget and evict only each other, so that a stream of
  // new prompts never pushes out a reference set (measured with bench-store: with budget for
  // all three references of a workload, unique prompts evicted them and halved the hit rate).
  int64_t prompt_cap() const {
    return static_cast<int64_t>(static_cast<double>(options.ram_bytes) * options.prompt_share);
  }
  bool over(bool prompt) {
    return ram_bytes > options.ram_bytes || (prompt && kinds["prompt"].bytes > prompt_cap());
  }

  // Evicts least recently used unpinned entries (never `keep`; for a prompt, prompts only)
  // until within the budget; false when that is not enough.
  bool trim(const std::string& keep, const std::string& kind) {
    const bool prompt = kind == "prompt";
    auto it = ram_lru.end();
    while (over(prompt) && it != ram_lru.begin()) {
      --it;
      auto s = ram.find(*it);
      if (*it == keep || pinned(s->second) || (prompt && s->second.kind != "prompt")) continue;
      it = std::next(it);  // the newer neighbour survives the erase
      drop(s);
      counts.evictions += 1;
    }
    return !over(prompt);
  }

  // Adds an entry to RAM when it fits beside the pinned ones; false (counted as rejected)
  // when not. The id must not be present.
  bool keep(const std::string& id, const std::string& kind, std::shared_ptr<const Entry> e) {
    const int64_t bytes = e->bytes();
    int64_t pinned_bytes = 0;
    for (const auto& [_, s] : ram) {
      if (pinned(s)) pinned_bytes += s.bytes;
    }
    if (bytes > options.ram_bytes - pinned_bytes) {
      counts.rejected += 1;
      return false;
    }
    ram_lru.push_front(id);
    Slot& s = ram[id];
    s.entry = std::move(e);
    s.kind = kind;
    s.bytes = bytes;
    s.lru = ram_lru.begin();
    ram_bytes += bytes;
    StoreKindStats& k = kinds[kind];
    k.entries += 1;
    k.bytes += bytes;
    if (!trim(id, kind)) {  // a prompt that only reference work would make room for
      drop(ram.find(id));
      counts.rejected += 1;
      return false;
    }
    return true;
  }

  void forget_file(const std::string& id) {
    auto it = files.find(id);
    if (it == files.end()) return;
    disk_bytes -= it->second.bytes;
    disk_lru.erase(it->second.lru);
    files.erase(it);
  }

  // Records a file as most recently used, then removes the oldest others while over budget.
  void note_file(const std::string& id, const std::string& kind, int64_t bytes) {
    forget_file(id);
    disk_lru.push_front(id);
    files[id] = DiskFile{kind, bytes, disk_lru.begin()};
    disk_bytes += bytes;
    while (disk_bytes > options.disk_bytes && disk_lru.size() > 1) {
      const std::string victim = disk_lru.back();
      if (victim == id) break;
      forget_file(victim);
      // A plain unlink (no folder fsync): a file that comes back after a crash is only
      // checked and used or evicted again.
      std::error_code ec;
      fs::remove(path_of(victim), ec);
      counts.disk_evictions += 1;
    }
  }

  void note_disk_error(const std::string& what) {
    counts.disk_errors += 1;
    last_disk_error = what;
  }

  // Start-up: index the folder's entry files (others are ignored, but for dead writers'
  // temporaries), oldest first by mtime, and evict down to the budget.
  void scan() {
    std::error_code ec;
    struct Found {
      std::string id, kind;
      int64_t bytes;
      fs::file_time_type mtime;
    };
    std::vector<Found> found;
    fs::directory_iterator dir(options.disk_dir, ec);
    if (ec) return;
    for (; dir != fs::directory_iterator(); dir.increment(ec)) {
      if (ec) break;
      std::error_code e0;
      const std::string name = dir->path().filename().string();
      // A temporary of a writer that died mid-write (its process is gone) would hold disk
      // space outside the budget for ever: removed. (A store folder shared by several hosts
      // would need another rule: a pid names a process of this host only.)
      if (const long pid = disk::temp_file_pid(name);
          pid > 0 && ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) {
        fs::remove(dir->path(), e0);
        continue;
      }
      Key key;
      if (!disk::parse_file_name(name, &key)) continue;
      std::error_code e1, e2, e3;
      if (!fs::is_regular_file(dir->symlink_status(e1)) || e1) continue;
      const auto size = fs::file_size(dir->path(), e2);
      const auto mtime = fs::last_write_time(dir->path(), e3);
      if (e2 || e3) continue;
      found.push_back({disk::id_of(key), key.kind, static_cast<int64_t>(size), mtime});
    }
    std::sort(found.begin(), found.end(),
              [](const Found& a, const Found& b) { return a.mtime < b.mtime; });
    for (const Found& f : found) note_file(f.id, f.kind, f.bytes);
  }
};

Store::Store(const StoreOptions& o) : s_(std::make_unique<State>()) {
  FLOWKV_CHECK(o.ram_bytes >= 0, "store: ram_bytes ", o.ram_bytes, " is negative");
  FLOWKV_CHECK(o.prompt_share >= 0 && o.prompt_share <= 1, "store: prompt_share ", o.prompt_share,
               " is not in [0, 1]");
  FLOWKV_CHECK(o.disk_bytes >= 0, "store: disk_bytes ", o.disk_bytes, " is negative");
  s_->options = o;
  s_->disk = !o.disk_dir.empty();
  if (s_->disk) {
    std::error_code ec;
    fs::create_directories(o.disk_dir, ec);  // a failure shows as write errors later
    disk::SecretResult secret = disk::open_secret(o.disk_dir);  // throws for an untrusted one
    s_->sealed = secret.ok;
    s_->secret = secret.secret;
    s_->secret_error = std::move(secret.error);
    s_->scan();
  }
}
Store::~Store() = default;

Handle Store::find(const Key& key) {
  disk::check_kind(key.kind);
  const std::string id = disk::id_of(key);
  State& s = *s_;
  const bool tier = s.disk && s.sealed;
  // Under the lock: the RAM entry as a counted hit, or (`miss`) nullptr counted as a miss.
  auto in_ram = [&](bool miss) -> Handle {
    auto it = s.ram.find(id);
    if (it != s.ram.end()) {
      s.touch(it->second);
      s.counts.hits += 1;
      s.kinds[key.kind].hits += 1;
      return it->second.entry;
    }
    if (miss) {
      s.counts.misses += 1;
      s.kinds[key.kind].misses += 1;
    }
    return nullptr;
  };
  {
    std::lock_guard lock(s.mu);
    if (Handle h = in_ram(!tier); h || !tier) return h;
  }
  // The disk tier, read and checked without the lock.
  const std::string path = s.path_of(id);
  disk::ReadResult r = disk::read_entry_file(path, key, s.secret, s.options.disk_bytes);
  std::lock_guard lock(s.mu);
  if (r.status != disk::ReadResult::kOk) {
    if (r.status == disk::ReadResult::kBad) {
      disk::remove_if_same(path, r.dev, r.ino);
      s.note_disk_error(r.error);
    }
    if (r.status != disk::ReadResult::kUnavailable) s.forget_file(id);
    return in_ram(true);  // another request may have inserted it meanwhile
  }
  s.counts.hits += 1;
  s.counts.disk_hits += 1;
  s.kinds[key.kind].hits += 1;
  const int64_t file_bytes = disk::file_bytes(key, r.entry);
  s.note_file(id, key.kind, file_bytes);
  auto it = s.ram.find(id);
  if (it != s.ram.end()) {  // inserted meanwhile: one value per key
    s.touch(it->second);
    return it->second.entry;
  }
  auto e = std::make_shared<const Entry>(std::move(r.entry));
  s.keep(id, key.kind, e);
  return e;
}

Handle Store::insert(const Key& key, Entry entry) {
  disk::check_kind(key.kind);
  const std::string id = disk::id_of(key);
  State& s = *s_;
  auto e = std::make_shared<const Entry>(std::move(entry));
  bool write = false;
  {
    std::lock_guard lock(s.mu);
    auto it = s.ram.find(id);
    if (it != s.ram.end()) {
      s.touch(it->second);
      return it->second.entry;
    }
    if (s.keep(id, key.kind, e)) s.counts.insertions += 1;
    write = s.disk && s.files.count(id) == 0;
  }
  if (!write) return e;
  // The disk tier, written without the lock (the entry is immutable).
  const std::string path = s.path_of(id);
  try {
    FLOWKV_CHECK(s.sealed, s.secret_error);
    const int64_t bytes = disk::file_bytes(key, *e);
    if (bytes > s.options.disk_bytes) return e;  // would evict everything else, itself too
    // 0600: entries are products of users' uploads and prompts; no other local user reads them.
    AtomicFile f(path, 0600);
    disk::write_entry(key, *e, s.secret, [&](const void* p, size_t n) { f.write(p, n); });
    f.commit();
    std::lock_guard lock(s.mu);
    s.counts.disk_writes += 1;
    s.note_file(id, key.kind, bytes);
  } catch (const std::exception& err) {
    // A full disk, a folder that cannot be written: the request goes on without the tier.
    std::lock_guard lock(s.mu);
    s.note_disk_error(err.what());
  }
  return e;
}

StoreStats Store::stats() const {
  std::lock_guard lock(s_->mu);
  StoreStats st = s_->counts;
  st.kinds = s_->kinds;
  st.entries = static_cast<int64_t>(s_->ram.size());
  st.bytes = s_->ram_bytes;
  for (const auto& [_, slot] : s_->ram) {
    if (pinned(slot)) {
      st.pinned += 1;
      st.pinned_bytes += slot.bytes;
    }
  }
  st.disk_entries = static_cast<int64_t>(s_->files.size());
  st.disk_bytes = s_->disk_bytes;
  return st;
}

void Store::clear() {
  std::lock_guard lock(s_->mu);
  for (auto it = s_->ram.begin(); it != s_->ram.end();) {
    auto next = std::next(it);
    if (!pinned(it->second)) s_->drop(it);
    it = next;
  }
}

const StoreOptions& Store::options() const {
  return s_->options;
}

std::string Store::last_disk_error() const {
  std::lock_guard lock(s_->mu);
  return s_->last_disk_error;
}

}  // namespace flowkv::store

namespace flowkv {

struct ReferenceStore::Impl {
  explicit Impl(const StoreOptions& o) : store(o) {}
  store::Store store;
};

ReferenceStore::ReferenceStore(const StoreOptions& options)
    : impl_(std::make_unique<Impl>(options)) {}
ReferenceStore::~ReferenceStore() = default;
const StoreOptions& ReferenceStore::options() const {
  return impl_->store.options();
}
StoreStats ReferenceStore::stats() const {
  return impl_->store.stats();
}
void ReferenceStore::clear() {
  impl_->store.clear();
}

store::Store& store::of(const ReferenceStore& r) {
  return r.impl().store;
}

}  // namespace flowkv
