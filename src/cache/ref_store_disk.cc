// The disk tier's secret, file format and reader. Every file in the folder is treated as hostile
// input: a file is opened without following links or blocking, must be a regular, non-sparse
// file within the budget, and its header is read alone and authenticated (HMAC under the
// store's secret) before its sizes are trusted, a payload byte is read or anything large is
// allocated; then the whole file's MAC, its padding and the finiteness of its values are checked
// before any tensor is built.
#include "cache/ref_store_disk.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "core/checked.h"
#include "core/hmac.h"
#include "core/memory.h"
#include "flowkv/error.h"
#include "flowkv/limits.h"
#include "io/atomic_file.h"

namespace flowkv::store {

namespace disk {

namespace {

constexpr char kMagic[8] = {'F', 'L', 'O', 'W', 'K', 'V', 'R', 'S'};
// 2: header length, header MAC and a file MAC under the store's secret. (1, whose trailer was a
// plain SHA-256 anyone could recompute, is refused: its files are misses.)
constexpr uint32_t kVersion = 2;
constexpr int64_t kAlign = 64;  // payloads start at multiples of it (tensors point into the file)
constexpr int64_t kMacBytes = 32;
constexpr int64_t kSecretBytes = std::tuple_size_v<Secret>;
constexpr const char* kSuffix = ".fkv";

constexpr DType kAllDTypes[] = {DType::kF32,  DType::kBF16, DType::kF16,  DType::kQ8_0,
                                DType::kQ4_0, DType::kQ4_1, DType::kQ5_0, DType::kQ5_1,
                                DType::kQ4_K, DType::kQ5_K, DType::kQ6_K};

constexpr int64_t longest_dtype_name() {
  int64_t n = 0;
  for (DType t : kAllDTypes) n = std::max(n, static_cast<int64_t>(dtype_name(t).size()));
  return n;
}

// The header: magic, version, its own length (the prelude), then kind, digest, tensor count and
// the tensor table. Its length is bounded by the limits, so a reader can read it alone.
constexpr int64_t kPreludeBytes = 8 + 4 + 4;
constexpr int64_t kMinHeaderBytes = kPreludeBytes + 1 + 1 + 32 + 4;
constexpr int64_t kMaxHeaderBytes =
    kPreludeBytes + 1 + limits::kMaxStoreKindBytes + 32 + 4 +
    limits::kMaxStoreTensors * (1 + longest_dtype_name() + 1 + 8 * limits::kMaxStoreNdim);
// What a reader reads first: most headers fit.
constexpr int64_t kFirstRead = 4096;

// A file of at least kSparseMinBytes with fewer than 1/kSparseRatio of its bytes allocated on
// disk is sparse: the store writes every byte of its files, so it is planted. (Leniently, for
// file systems that compress.)
constexpr int64_t kSparseMinBytes = int64_t{1} << 20;
constexpr int64_t kSparseRatio = 8;

int64_t align_up(int64_t n, std::string_view what) {
  return checked_add(n, kAlign - 1, what) / kAlign * kAlign;
}

void put_le(std::string& s, uint64_t v, int n) {
  for (int i = 0; i < n; ++i) s.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

uint64_t get_le(const uint8_t* p, int n) {
  uint64_t v = 0;
  for (int i = n - 1; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

Sha256Digest mac_of(const Secret& secret, const void* data, size_t n) {
  return HmacSha256::of(secret.data(), secret.size(), data, n);
}

// The header (small: at most kMaxHeaderBytes).
std::string header_bytes(const Key& key, const Entry& entry) {
  check_kind(key.kind);
  FLOWKV_CHECK(static_cast<int64_t>(entry.tensors.size()) <= limits::kMaxStoreTensors,
               "store entry ", key.kind, " ", key.hex(), ": ", entry.tensors.size(),
               " tensors; an entry holds at most ", limits::kMaxStoreTensors);
  std::string h(kMagic, sizeof kMagic);
  put_le(h, kVersion, 4);
  put_le(h, 0, 4);  // the header's length, set below
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
  const uint64_t n = h.size();
  for (int i = 0; i < 4; ++i) h[8 + 4 + i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return h;
}

// Little-endian reads over bytes whose every access is bounds-checked first.
class Reader {
 public:
  Reader(const uint8_t* data, size_t n, const std::string& what, const char* whole = "the file")
      : p_(data), n_(n), what_(what), whole_(whole) {}
  const uint8_t* take(size_t k, const char* field) {
    if (n_ - pos_ < k) {
      fail(what_, ": truncated: ", field, " needs ", k, " bytes at offset ", pos_, " but ", whole_,
           " ends at ", n_);
    }
    const uint8_t* r = p_ + pos_;
    pos_ += k;
    return r;
  }
  uint64_t le(int k, const char* field) { return get_le(take(static_cast<size_t>(k), field), k); }
  size_t pos() const { return pos_; }

 private:
  const uint8_t* p_;
  size_t n_, pos_ = 0;
  const std::string& what_;
  const char* whole_;
};

struct TensorInfo {
  DType dtype = DType::kF32;
  Shape shape;
  int64_t bytes = 0, offset = 0;  // offset from the start of the file
};

// Where everything of a file is, from its authenticated header.
struct Layout {
  std::vector<TensorInfo> tensors;
  int64_t header_end = 0;  // the header's length: its MAC follows
  int64_t data_start = 0;  // the first payload
  int64_t file_bytes = 0;
};

// Bytes of the file's start that parse_header needs (the header and its MAC), from the prelude
// of `n` bytes: checks the magic, the version and the header's length against the limits.
int64_t header_need(const uint8_t* data, size_t n, const std::string& what) {
  if (n < sizeof kMagic || std::memcmp(data, kMagic, sizeof kMagic) != 0) {
    fail(what, ": not a flowkv store entry (bad magic)");
  }
  Reader r(data, n, what);
  r.take(sizeof kMagic, "magic");
  const uint64_t version = r.le(4, "format version");
  FLOWKV_CHECK(version == kVersion, what, ": store entry format version ", version,
               "; this build reads version ", kVersion);
  const uint64_t len = r.le(4, "header length");
  FLOWKV_CHECK(
      static_cast<int64_t>(len) >= kMinHeaderBytes && static_cast<int64_t>(len) <= kMaxHeaderBytes,
      what, ": header length ", len, " is outside ", kMinHeaderBytes, "..", kMaxHeaderBytes);
  return static_cast<int64_t>(len) + kMacBytes;
}

// Parses the header at the start of `data` (n bytes: the whole file, or at least the header and
// its MAC), after checking its MAC: every field parsed was written by a holder of the secret.
Layout parse_header(const Key& key, const uint8_t* data, size_t n, const Secret& secret,
                    const std::string& what) {
  const int64_t need = header_need(data, n, what);
  const int64_t len = need - kMacBytes;
  FLOWKV_CHECK(static_cast<int64_t>(n) >= need, what, ": truncated: the header and its MAC need ",
               need, " bytes but the file ends at ", n);
  FLOWKV_CHECK(mac_equal(mac_of(secret, data, static_cast<size_t>(len)), data + len), what,
               ": the header's MAC does not match: the file was not written by this store "
               "(another store's, an older version's or a forged one) or is corrupt");
  Reader r(data, static_cast<size_t>(len), what, "the header");
  r.take(kPreludeBytes, "prelude");
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
  Layout l;
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
    l.tensors.push_back(std::move(info));
  }
  FLOWKV_CHECK(static_cast<int64_t>(r.pos()) == len, what, ": the header's fields end at ", r.pos(),
               " but its length is ", len);
  l.header_end = len;
  l.data_start = align_up(len + kMacBytes, what);
  for (TensorInfo& info : l.tensors) info.offset += l.data_start;
  l.file_bytes =
      checked_add(checked_add(l.data_start, payload, what), kMacBytes, "store file size");
  return l;
}

bool all_zero(const uint8_t* p, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    if (p[i] != 0) return false;
  }
  return true;
}

// The first of n values of type U (read unaligned) whose bits under `exponent` are all set (an
// IEEE NaN or Inf when `exponent` is the exponent field), or -1. The first pass vectorises.
template <class U>
int64_t first_all_ones(const uint8_t* p, int64_t n, int64_t stride, int64_t at, U exponent) {
  auto load = [&](int64_t i) {
    U u;
    std::memcpy(&u, p + i * stride + at, sizeof u);
    return u;
  };
  bool any = false;
  for (int64_t i = 0; i < n; ++i) any |= (load(i) & exponent) == exponent;
  if (!any) return -1;
  for (int64_t i = 0; i < n; ++i) {
    if ((load(i) & exponent) == exponent) return i;
  }
  return -1;
}

// The index of the first element of a payload that is not finite (for a quantized type: the
// first element of the first block whose f16 scale is NaN or Inf; its quants are integers), or
// -1. Scale offsets are those of ggml's block structs.
int64_t first_non_finite(DType t, const uint8_t* p, int64_t bytes) {
  constexpr uint16_t kF16Exp = 0x7c00;
  switch (t) {
    case DType::kF32:
      return first_all_ones<uint32_t>(p, bytes / 4, 4, 0, 0x7f800000u);
    case DType::kBF16:
      return first_all_ones<uint16_t>(p, bytes / 2, 2, 0, 0x7f80);
    case DType::kF16:
      return first_all_ones<uint16_t>(p, bytes / 2, 2, 0, kF16Exp);
    default:
      break;
  }
  int64_t scales[2] = {0, -1};  // d (and m / dmin) at the start of the block
  if (t == DType::kQ4_1 || t == DType::kQ5_1 || t == DType::kQ4_K || t == DType::kQ5_K) {
    scales[1] = 2;
  } else if (t == DType::kQ6_K) {
    scales[0] = 208;  // after ql[128], qh[64], scales[16]
  }
  const int64_t stride = dtype_block_bytes(t), blocks = bytes / stride;
  int64_t first = -1;
  for (int64_t at : scales) {
    if (at < 0) continue;
    const int64_t b = first_all_ones<uint16_t>(p, blocks, stride, at, kF16Exp);
    if (b >= 0 && (first < 0 || b < first)) first = b;
  }
  return first < 0 ? -1 : first * dtype_block(t);
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

struct Closer {
  int fd;
  ~Closer() { ::close(fd); }
};

// Reads exactly n bytes at offset `at`.
void read_at(int fd, void* p, size_t n, int64_t at, const std::string& path) {
  size_t got = 0;
  while (got < n) {
    const ssize_t k = ::pread(fd, static_cast<uint8_t*>(p) + got, n - got,
                              static_cast<off_t>(at + static_cast<int64_t>(got)));
    if (k < 0 && errno == EINTR) continue;
    if (k < 0) fail(path, ": cannot read: ", std::strerror(errno));
    if (k == 0) fail(path, ": the file shrank while it was read");
    got += static_cast<size_t>(k);
  }
}

// ---- the secret

std::string secret_path(const std::string& dir) {
  return dir.empty() || dir.back() == '/' ? dir + kSecretFile : dir + "/" + kSecretFile;
}

constexpr const char* kSecretAdvice =
    " (remove it to start the store afresh: a new secret is made and the files sealed with the "
    "old one are refused and recomputed)";

Secret read_secret(int fd, const std::string& path) {
  Closer closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) fail(path, ": cannot stat the store's secret: ", std::strerror(errno));
  FLOWKV_CHECK(S_ISREG(st.st_mode), path,
               ": the store's secret is not a regular file; it must be a file of ", kSecretBytes,
               " bytes readable by its owner only", kSecretAdvice);
  if ((st.st_mode & 077) != 0) {
    char mode[8];
    std::snprintf(mode, sizeof mode, "%03o", static_cast<unsigned>(st.st_mode & 0777));
    fail(path, ": the store's secret has mode ", mode,
         ", open to group or others; it must be readable and writable by its owner only (chmod "
         "600 it if no one else can have read it; else remove it, and a new secret is made: the "
         "files sealed with the old one are refused and recomputed)");
  }
  FLOWKV_CHECK(st.st_size == kSecretBytes, path, ": the store's secret is ", st.st_size,
               " bytes; it must be ", kSecretBytes, kSecretAdvice);
  Secret s{};
  read_at(fd, s.data(), s.size(), 0, path);
  return s;
}

void random_bytes(void* p, size_t n) {
  auto* b = static_cast<uint8_t*>(p);
  size_t got = 0;
  while (got < n) {
    const ssize_t k = ::getrandom(b + got, n - got, 0);
    if (k < 0 && errno == EINTR) continue;
    if (k < 0) break;
    got += static_cast<size_t>(k);
  }
  if (got == n) return;
  const int fd = ::open("/dev/urandom", O_RDONLY | O_CLOEXEC);  // getrandom() unavailable
  if (fd < 0) fail("store: no source of random bytes for a secret: ", std::strerror(errno));
  Closer closer{fd};
  read_at(fd, b + got, n - got, 0, "/dev/urandom");
}

// Makes the secret at `path`; true when it exists afterwards (made here or, concurrently, by
// another opener), false with *error when the folder cannot hold it.
bool create_secret(const std::string& path, std::string* error) {
  remove_dead_writers_temps_of(path);  // a creator killed before its link()
  Secret s{};
  random_bytes(s.data(), s.size());
  static std::atomic<uint64_t> counter{0};
  const std::string tmp = path + ".tmp-flowkv-" + std::to_string(::getpid()) + "-" +
                          std::to_string(counter.fetch_add(1));
  auto cannot = [&](const char* step, int err) {
    *error = path + ": cannot write the store's secret (" + step + "): " + std::strerror(err);
    return false;
  };
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) return cannot("create", errno);
  bool written = ::fchmod(fd, 0600) == 0;  // exactly 0600, whatever the umask
  size_t put = 0;
  while (written && put < s.size()) {
    const ssize_t k = ::write(fd, s.data() + put, s.size() - put);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) written = false;
    if (k > 0) put += static_cast<size_t>(k);
  }
  written = written && ::fsync(fd) == 0;
  const int write_err = errno;
  ::close(fd);
  if (!written) {
    ::unlink(tmp.c_str());
    return cannot("write", write_err);
  }
  // link() publishes the whole file under its name, or fails when one is there already.
  const int rc = ::link(tmp.c_str(), path.c_str());
  const int link_err = errno;
  ::unlink(tmp.c_str());
  if (rc != 0 && link_err != EEXIST) return cannot("link", link_err);
  if (rc == 0) {  // the folder's entry made durable (best effort)
    const std::string dir = path.substr(0, path.size() - std::strlen(kSecretFile));
    const int dfd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
      ::fsync(dfd);
      ::close(dfd);
    }
  }
  return true;
}

}  // namespace

SecretResult open_secret(const std::string& dir) {
  const std::string path = secret_path(dir);
  for (int attempt = 0; attempt < 2; ++attempt) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (fd >= 0) return SecretResult{true, read_secret(fd, path), ""};
    const int err = errno;
    if (err == ELOOP) {
      fail(path, ": the store's secret is a symbolic link; it must be a regular file",
           kSecretAdvice);
    }
    if (err == ENOTDIR) {
      return SecretResult{
          false, {}, path + ": cannot write the store's secret: " + std::strerror(err)};
    }
    if (err != ENOENT) fail(path, ": cannot open the store's secret: ", std::strerror(err));
    SecretResult r;
    if (!create_secret(path, &r.error)) return r;
  }
  fail(path, ": the store's secret was removed while it was being created");
}

// ---- names

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

// ---- entries

int64_t file_bytes(const Key& key, const Entry& entry) {
  const int64_t header = static_cast<int64_t>(header_bytes(key, entry).size()) + kMacBytes;
  int64_t n = align_up(header, "store file size");
  for (const Tensor& t : entry.tensors) {
    n = checked_add(n, align_up(t.nbytes(), "store file size"), "store file size");
  }
  return checked_add(n, kMacBytes, "store file size");
}

void write_entry(const Key& key, const Entry& entry, const Secret& secret,
                 const std::function<void(const void*, size_t)>& out) {
  static const char zeros[kAlign] = {};
  const std::string h = header_bytes(key, entry);
  for (size_t i = 0; i < entry.tensors.size(); ++i) {
    const Tensor& t = entry.tensors[i];
    const int64_t at =
        first_non_finite(t.dtype(), static_cast<const uint8_t*>(t.raw()), t.nbytes());
    FLOWKV_CHECK(at < 0, "store entry ", key.kind, " ", key.hex(), ": tensor ", i, " ",
                 shape_str(t.shape()), " ", dtype_name(t.dtype()),
                 " holds a non-finite value (NaN or Inf) at element ", at, "; it is not written");
  }
  const Sha256Digest header_mac = mac_of(secret, h.data(), h.size());
  HmacSha256 mac(secret.data(), secret.size());
  auto emit = [&](const void* p, size_t n) {
    if (n == 0) return;
    mac.update(p, n);
    out(p, n);
  };
  auto pad = [&](int64_t n) {
    const int64_t r = n % kAlign;
    if (r != 0) emit(zeros, static_cast<size_t>(kAlign - r));
  };
  emit(h.data(), h.size());
  emit(header_mac.data(), header_mac.size());
  pad(static_cast<int64_t>(h.size()) + kMacBytes);
  for (const Tensor& t : entry.tensors) {
    emit(t.raw(), static_cast<size_t>(t.nbytes()));
    pad(t.nbytes());
  }
  const Sha256Digest d = mac.finish();
  out(d.data(), d.size());
}

Entry parse_entry(const Key& key, const uint8_t* data, size_t n, const Secret& secret,
                  const std::string& what, const std::shared_ptr<void>& holder) {
  Layout l = parse_header(key, data, n, secret, what);
  FLOWKV_CHECK(static_cast<int64_t>(n) == l.file_bytes, what, ": the file is ", n,
               " bytes but its header describes ", l.file_bytes, " (truncated or extended)");
  // From here on every offset is inside the n bytes present.
  const int64_t header_mac_end = l.header_end + kMacBytes;
  FLOWKV_CHECK(all_zero(data + header_mac_end, l.data_start - header_mac_end), what,
               ": non-zero padding after the header");
  for (const TensorInfo& info : l.tensors) {
    const int64_t padded = align_up(info.bytes, what);
    FLOWKV_CHECK(all_zero(data + info.offset + info.bytes, padded - info.bytes), what,
                 ": non-zero padding after a tensor's payload");
  }
  FLOWKV_CHECK(mac_equal(mac_of(secret, data, n - kMacBytes), data + n - kMacBytes), what,
               ": MAC mismatch (the file is corrupt, or was not written by this store)");
  for (size_t i = 0; i < l.tensors.size(); ++i) {
    const TensorInfo& info = l.tensors[i];
    const int64_t at = first_non_finite(info.dtype, data + info.offset, info.bytes);
    FLOWKV_CHECK(at < 0, what, ": tensor ", i, " ", shape_str(info.shape), " ",
                 dtype_name(info.dtype), " holds a non-finite value (NaN or Inf) at element ", at);
  }
  Entry entry;
  entry.tensors.reserve(l.tensors.size());
  for (TensorInfo& info : l.tensors) {
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

std::string reseal(const Secret& secret, std::string b) {
  if (static_cast<int64_t>(b.size()) >= kPreludeBytes) {
    const uint64_t len = get_le(reinterpret_cast<const uint8_t*>(b.data()) + 12, 4);
    if (len + kMacBytes <= b.size()) {
      const Sha256Digest m = mac_of(secret, b.data(), len);
      std::memcpy(b.data() + len, m.data(), m.size());
    }
  }
  if (static_cast<int64_t>(b.size()) >= kMacBytes) {
    const Sha256Digest m = mac_of(secret, b.data(), b.size() - kMacBytes);
    std::memcpy(b.data() + b.size() - kMacBytes, m.data(), m.size());
  }
  return b;
}

ReadResult read_entry_file(const std::string& path, const Key& key, const Secret& secret,
                           int64_t max_bytes) {
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
  Closer closer{fd};
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
  // Planted files are refused by their size on disk before a byte is read.
  const int64_t size = st.st_size;
  if (size > max_bytes) {
    res.error = path + ": " + std::to_string(size) + " bytes, over the disk tier's budget of " +
                std::to_string(max_bytes);
    return res;
  }
  const int64_t on_disk = static_cast<int64_t>(st.st_blocks) * 512;
  if (size >= kSparseMinBytes && on_disk < size / kSparseRatio) {
    res.error = path + ": a sparse file (" + std::to_string(size) + " bytes long, " +
                std::to_string(on_disk) + " on disk); the store writes whole files";
    return res;
  }
  try {
    // The header alone (bounded), authenticated, and the size it describes.
    std::vector<uint8_t> head(static_cast<size_t>(std::min(size, kFirstRead)));
    read_at(fd, head.data(), head.size(), 0, path);
    const int64_t need = header_need(head.data(), head.size(), path);
    const int64_t had = static_cast<int64_t>(head.size());
    if (need > had && size > had) {
      head.resize(static_cast<size_t>(std::min(need, size)));
      read_at(fd, head.data() + had, head.size() - static_cast<size_t>(had), had, path);
    }
    const Layout l = parse_header(key, head.data(), head.size(), secret, path);
    FLOWKV_CHECK(size == l.file_bytes, path, ": the file is ", size,
                 " bytes but its header describes ", l.file_bytes, " (truncated or extended)");
    if (size >= (int64_t{64} << 20)) {  // as Tensor::empty: small reads skip /proc/meminfo
      try {
        check_memory(size, "reading " + path);
      } catch (const Error&) {
        res.status = ReadResult::kUnavailable;
        return res;
      }
    }
    // The whole file, checked again from its first byte (it may have changed meanwhile).
    std::shared_ptr<void> buf = aligned_buffer(size);
    auto* p = static_cast<uint8_t*>(buf.get());
    read_at(fd, p, static_cast<size_t>(size), 0, path);
    res.entry = parse_entry(key, p, static_cast<size_t>(size), secret, path, buf);
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

std::string serialize(const Key& key, const Entry& entry, const Secret& secret) {
  std::string s;
  s.reserve(static_cast<size_t>(disk::file_bytes(key, entry)));
  disk::write_entry(key, entry, secret,
                    [&](const void* p, size_t n) { s.append(static_cast<const char*>(p), n); });
  return s;
}

Entry deserialize(const Key& key, std::string_view bytes, const Secret& secret,
                  const std::string& what) {
  return disk::parse_entry(key, reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(),
                           secret, what, nullptr);
}

}  // namespace flowkv::store
