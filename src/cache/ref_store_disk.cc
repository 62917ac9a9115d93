// The disk tier's file format and reader. Every file in the folder is treated as hostile input:
// the header is parsed within limits, every size is checked (checked arithmetic) against the
// bytes actually present before anything is allocated, and the checksum is verified before any
// tensor is built.
#include "cache/ref_store_disk.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "core/checked.h"
#include "core/memory.h"
#include "core/sha256.h"
#include "flowkv/error.h"
#include "flowkv/limits.h"

namespace flowkv::store {

namespace disk {

namespace {

constexpr char kMagic[8] = {'F', 'L', 'O', 'W', 'K', 'V', 'R', 'S'};
constexpr uint32_t kVersion = 1;
constexpr int64_t kAlign = 64;  // payloads start at multiples of it (tensors point into the file)
constexpr int64_t kDigestBytes = 32;
constexpr const char* kSuffix = ".fkv";

constexpr DType kAllDTypes[] = {DType::kF32,  DType::kBF16, DType::kF16,  DType::kQ8_0,
                                DType::kQ4_0, DType::kQ4_1, DType::kQ5_0, DType::kQ5_1,
                                DType::kQ4_K, DType::kQ5_K, DType::kQ6_K};

int64_t align_up(int64_t n, std::string_view what) {
  return checked_add(n, kAlign - 1, what) / kAlign * kAlign;
}

void put_le(std::string& s, uint64_t v, int n) {
  for (int i = 0; i < n; ++i) s.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

// The header up to its padding (small: at most a few hundred KiB for kMaxStoreTensors).
std::string header_bytes(const Key& key, const Entry& entry) {
  check_kind(key.kind);
  FLOWKV_CHECK(static_cast<int64_t>(entry.tensors.size()) <= limits::kMaxStoreTensors,
               "store entry ", key.kind, " ", key.hex(), ": ", entry.tensors.size(),
               " tensors; an entry holds at most ", limits::kMaxStoreTensors);
  std::string h(kMagic, sizeof kMagic);
  put_le(h, kVersion, 4);
  put_le(h, key.kind.size(), 1);
  h += key.kind;
  h.append(reinterpret_cast<const char*>(key.digest.data()), key.digest.size());
  put_le(h, entry.tensors.size(), 4);
  for (size_t i = 0; i < entry.tensors.size(); ++i) {
    const Tensor& t = entry.tensors[i];
    FLOWKV_CHECK(t.defined(), "store entry ", key.kind, " ", key.hex(), ": tensor ", i,
                 " is undefined");
    FLOWKV_CHECK(t.ndim() <= limits::kMaxStoreNdim, "store entry ", key.kind, " ", key.hex(),
                 ": tensor ", i, " has ", t.ndim(), " dimensions; at most ", limits::kMaxStoreNdim);
    const std::string_view name = dtype_name(t.dtype());
    put_le(h, name.size(), 1);
    h += name;
    put_le(h, static_cast<uint64_t>(t.ndim()), 1);
    for (int64_t d : t.shape()) put_le(h, static_cast<uint64_t>(d), 8);
  }
  return h;
}

// Little-endian reads over bytes whose every access is bounds-checked first.
class Reader {
 public:
  Reader(const uint8_t* data, size_t n, const std::string& what) : p_(data), n_(n), what_(what) {}
  const uint8_t* take(size_t k, const char* field) {
    if (n_ - pos_ < k) {
      fail(what_, ": truncated: ", field, " needs ", k, " bytes at offset ", pos_,
           " but the file ends at ", n_);
    }
    const uint8_t* r = p_ + pos_;
    pos_ += k;
    return r;
  }
  uint64_t le(int k, const char* field) {
    const uint8_t* b = take(static_cast<size_t>(k), field);
    uint64_t v = 0;
    for (int i = k - 1; i >= 0; --i) v = (v << 8) | b[i];
    return v;
  }
  size_t pos() const { return pos_; }

 private:
  const uint8_t* p_;
  size_t n_, pos_ = 0;
  const std::string& what_;
};

struct TensorInfo {
  DType dtype = DType::kF32;
  Shape shape;
  int64_t bytes = 0, offset = 0;  // offset from the start of the file
};

bool all_zero(const uint8_t* p, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    if (p[i] != 0) return false;
  }
  return true;
}

// A 64-byte aligned block of n bytes; large ones are mapped, so freeing one returns its pages
// at once (as Tensor's own blocks).
std::shared_ptr<void> aligned_buffer(int64_t n) {
  const size_t m = static_cast<size_t>(std::max<int64_t>((n + kAlign - 1) / kAlign * kAlign, 64));
  if (m >= (size_t{1} << 20)) {
    void* p = ::mmap(nullptr, m, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) fail("out of memory allocating ", n, " bytes");
    return std::shared_ptr<void>(p, [m](void* q) { ::munmap(q, m); });
  }
  void* p = std::aligned_alloc(kAlign, m);
  if (!p) fail("out of memory allocating ", n, " bytes");
  return std::shared_ptr<void>(p, [](void* q) { std::free(q); });
}

}  // namespace

bool valid_kind(std::string_view kind) {
  if (kind.empty() || static_cast<int64_t>(kind.size()) > limits::kMaxStoreKindBytes) return false;
  for (char c : kind) {
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_')) return false;
  }
  return true;
}

void check_kind(std::string_view kind) {
  FLOWKV_CHECK(valid_kind(kind), "store: entry kind '", kind, "' must be 1 to ",
               limits::kMaxStoreKindBytes, " characters of a-z, 0-9 and _");
}

std::string id_of(const Key& key) {
  return key.kind + "-" + key.hex();
}

std::string file_name(const Key& key) {
  return id_of(key) + kSuffix;
}

bool parse_file_name(std::string_view name, Key* key) {
  const std::string_view suffix = kSuffix;
  if (name.size() < 1 + 1 + 64 + suffix.size()) return false;
  if (name.substr(name.size() - suffix.size()) != suffix) return false;
  name.remove_suffix(suffix.size());
  const std::string_view hex = name.substr(name.size() - 64);
  name.remove_suffix(64);
  if (name.back() != '-') return false;
  name.remove_suffix(1);
  if (!valid_kind(name)) return false;
  Digest d{};
  for (size_t i = 0; i < 64; ++i) {
    const char c = hex[i];
    int v;
    if (c >= '0' && c <= '9') {
      v = c - '0';
    } else if (c >= 'a' && c <= 'f') {
      v = c - 'a' + 10;
    } else {
      return false;
    }
    d[i / 2] = static_cast<uint8_t>(d[i / 2] << 4 | v);
  }
  if (key) *key = Key{std::string(name), d};
  return true;
}

long temp_file_pid(std::string_view name) {
  static constexpr std::string_view kTemp = ".tmp-flowkv-";  // io/atomic_file.cc's naming
  const size_t at = name.find(kTemp);
  if (at == std::string_view::npos || !parse_file_name(name.substr(0, at), nullptr)) return -1;
  std::string_view rest = name.substr(at + kTemp.size());
  const size_t dash = rest.find('-');
  if (dash == 0 || dash == std::string_view::npos || dash > 9) return -1;
  long pid = 0;
  for (char c : rest.substr(0, dash)) {
    if (c < '0' || c > '9') return -1;
    pid = pid * 10 + (c - '0');
  }
  rest.remove_prefix(dash + 1);
  if (rest.empty()) return -1;
  for (char c : rest) {
    if (c < '0' || c > '9') return -1;
  }
  return pid;
}

int64_t file_bytes(const Key& key, const Entry& entry) {
  int64_t n = align_up(static_cast<int64_t>(header_bytes(key, entry).size()), "store file size");
  for (const Tensor& t : entry.tensors) {
    n = checked_add(n, align_up(t.nbytes(), "store file size"), "store file size");
  }
  return checked_add(n, kDigestBytes, "store file size");
}

void write_entry(const Key& key, const Entry& entry,
                 const std::function<void(const void*, size_t)>& out) {
  static const char zeros[kAlign] = {};
  Sha256 sha;
  auto emit = [&](const void* p, size_t n) {
    if (n == 0) return;
    sha.update(p, n);
    out(p, n);
  };
  auto pad = [&](int64_t n) {
    const int64_t r = n % kAlign;
    if (r != 0) emit(zeros, static_cast<size_t>(kAlign - r));
  };
  const std::string h = header_bytes(key, entry);
  emit(h.data(), h.size());
  pad(static_cast<int64_t>(h.size()));
  for (const Tensor& t : entry.tensors) {
    emit(t.raw(), static_cast<size_t>(t.nbytes()));
    pad(t.nbytes());
  }
  const Sha256Digest d = sha.finish();
  out(d.data(), d.size());
}

Entry parse_entry(const Key& key, const uint8_t* data, size_t n, const std::string& what,
                  const std::shared_ptr<void>& holder) {
  Reader r(data, n, what);
  if (n < sizeof kMagic || std::memcmp(data, kMagic, sizeof kMagic) != 0) {
    fail(what, ": not a flowkv store entry (bad magic)");
  }
  r.take(sizeof kMagic, "magic");
  const uint64_t version = r.le(4, "format version");
  FLOWKV_CHECK(version == kVersion, what, ": store entry format version ", version,
               "; this build reads version ", kVersion);
  const uint64_t kind_len = r.le(1, "kind length");
  FLOWKV_CHECK(kind_len >= 1 && static_cast<int64_t>(kind_len) <= limits::kMaxStoreKindBytes, what,
               ": kind length ", kind_len, " is outside 1..", limits::kMaxStoreKindBytes);
  const uint8_t* kind_p = r.take(kind_len, "kind");
  const std::string kind(reinterpret_cast<const char*>(kind_p), kind_len);
  FLOWKV_CHECK(valid_kind(kind), what, ": the kind is not 1 to ", limits::kMaxStoreKindBytes,
               " characters of a-z, 0-9 and _");
  Digest digest{};
  std::memcpy(digest.data(), r.take(digest.size(), "key digest"), digest.size());
  if (kind != key.kind || digest != key.digest) {
    fail(what, ": holds the '", kind, "' entry ", Key{kind, digest}.hex(), ", not the '", key.kind,
         "' entry ", key.hex(), " asked for (a renamed or copied file)");
  }
  const uint64_t count = r.le(4, "tensor count");
  FLOWKV_CHECK(static_cast<int64_t>(count) <= limits::kMaxStoreTensors, what, ": ", count,
               " tensors; an entry holds at most ", limits::kMaxStoreTensors);
  std::vector<TensorInfo> infos;
  int64_t payload = 0;  // bytes of the padded payloads
  for (uint64_t i = 0; i < count; ++i) {
    TensorInfo info;
    const uint64_t name_len = r.le(1, "dtype name length");
    const uint8_t* name_p = r.take(name_len, "dtype name");
    const std::string_view name(reinterpret_cast<const char*>(name_p), name_len);
    bool known = false;
    for (DType t : kAllDTypes) {
      if (dtype_name(t) == name) {
        info.dtype = t;
        known = true;
      }
    }
    FLOWKV_CHECK(known, what, ": tensor ", i, ": unknown dtype '", std::string(name), "'");
    const uint64_t ndim = r.le(1, "tensor ndim");
    FLOWKV_CHECK(static_cast<int64_t>(ndim) <= limits::kMaxStoreNdim, what, ": tensor ", i, " has ",
                 ndim, " dimensions; at most ", limits::kMaxStoreNdim);
    for (uint64_t j = 0; j < ndim; ++j) {
      info.shape.push_back(checked_i64(r.le(8, "tensor dimension"), what));
    }
    const std::string where = what + ": tensor " + std::to_string(i) + " " + shape_str(info.shape);
    const int64_t numel = checked_numel(info.shape, where);
    if (dtype_is_quantized(info.dtype)) {
      FLOWKV_CHECK(!info.shape.empty() && info.shape.back() % dtype_block(info.dtype) == 0, where,
                   ": a ", dtype_name(info.dtype), " tensor's rows must be whole blocks of ",
                   dtype_block(info.dtype), " elements");
    }
    info.bytes = checked_mul(numel / dtype_block(info.dtype), dtype_block_bytes(info.dtype), where);
    info.offset = payload;  // relative for now
    payload = checked_add(payload, align_up(info.bytes, where), where);
    infos.push_back(std::move(info));
  }
  const int64_t header_end = static_cast<int64_t>(r.pos());
  const int64_t data_start = align_up(header_end, what);
  const int64_t expect =
      checked_add(checked_add(data_start, payload, what), kDigestBytes, "store file size");
  FLOWKV_CHECK(static_cast<int64_t>(n) == expect, what, ": the file is ", n,
               " bytes but its header describes ", expect, " (truncated or extended)");
  // From here on every offset is inside the n bytes present.
  FLOWKV_CHECK(all_zero(data + header_end, data_start - header_end), what,
               ": non-zero padding after the header");
  for (TensorInfo& info : infos) {
    info.offset += data_start;
    const int64_t padded = align_up(info.bytes, what);
    FLOWKV_CHECK(all_zero(data + info.offset + info.bytes, padded - info.bytes), what,
                 ": non-zero padding after a tensor's payload");
  }
  const Sha256Digest sum = Sha256::of(data, n - kDigestBytes);
  FLOWKV_CHECK(std::memcmp(sum.data(), data + n - kDigestBytes, kDigestBytes) == 0, what,
               ": checksum mismatch (the file is corrupt)");
  Entry entry;
  entry.tensors.reserve(infos.size());
  for (TensorInfo& info : infos) {
    uint8_t* p = const_cast<uint8_t*>(data) + info.offset;
    if (holder) {
      entry.tensors.push_back(Tensor::wrap(p, std::move(info.shape), info.dtype, holder));
    } else {
      Tensor t = Tensor::empty(std::move(info.shape), info.dtype);
      if (info.bytes > 0) std::memcpy(t.raw(), p, static_cast<size_t>(info.bytes));
      entry.tensors.push_back(std::move(t));
    }
  }
  return entry;
}

ReadResult read_entry_file(const std::string& path, const Key& key, int64_t max_bytes) {
  ReadResult res;
  // O_NONBLOCK: a FIFO planted under an entry's name does not hang open(); O_NOFOLLOW: the
  // store writes regular files only, a symlink is not one of its entries.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOFOLLOW);
  if (fd < 0) {
    const int err = errno;
    if (err == ENOENT || err == ENOTDIR) return res;  // kMissing
    res.status = ReadResult::kBad;
    res.error = path + ": cannot open: " + std::strerror(err);
    struct stat st {};
    if (::lstat(path.c_str(), &st) == 0) {
      res.dev = st.st_dev;
      res.ino = st.st_ino;
    }
    return res;
  }
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    res.status = ReadResult::kBad;
    res.error = path + ": cannot stat: " + std::strerror(errno);
    return res;
  }
  res.dev = st.st_dev;
  res.ino = st.st_ino;
  res.status = ReadResult::kBad;
  if (!S_ISREG(st.st_mode)) {
    res.error = path + ": not a regular file";
    return res;
  }
  const int64_t size = st.st_size;
  if (size > max_bytes) {
    res.error = path + ": " + std::to_string(size) + " bytes, over the disk tier's budget of " +
                std::to_string(max_bytes);
    return res;
  }
  if (size >= (int64_t{64} << 20)) {  // as Tensor::empty: small reads skip /proc/meminfo
    try {
      check_memory(size, "reading " + path);
    } catch (const Error&) {
      res.status = ReadResult::kUnavailable;
      return res;
    }
  }
  try {
    std::shared_ptr<void> buf = aligned_buffer(size);
    auto* p = static_cast<uint8_t*>(buf.get());
    int64_t got = 0;
    while (got < size) {
      const ssize_t k = ::pread(fd, p + got, static_cast<size_t>(size - got), got);
      if (k < 0 && errno == EINTR) continue;
      if (k < 0) fail(path, ": cannot read: ", std::strerror(errno));
      if (k == 0) fail(path, ": the file shrank while it was read");
      got += k;
    }
    res.entry = parse_entry(key, p, static_cast<size_t>(size), path, buf);
    res.status = ReadResult::kOk;
  } catch (const Error& e) {
    res.error = e.what();
  }
  return res;
}

void remove_if_same(const std::string& path, dev_t dev, ino_t ino) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) return;
  // remove(): unlink, or rmdir for an (empty) folder planted under an entry's name.
  if (st.st_dev == dev && st.st_ino == ino) std::remove(path.c_str());
}

}  // namespace disk

std::string serialize(const Key& key, const Entry& entry) {
  std::string s;
  s.reserve(static_cast<size_t>(disk::file_bytes(key, entry)));
  disk::write_entry(key, entry,
                    [&](const void* p, size_t n) { s.append(static_cast<const char*>(p), n); });
  return s;
}

Entry deserialize(const Key& key, std::string_view bytes, const std::string& what) {
  return disk::parse_entry(key, reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), what,
                           nullptr);
}

}  // namespace flowkv::store
