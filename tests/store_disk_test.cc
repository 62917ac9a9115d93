// The reference store's disk tier against whoever can write its folder (issue 27): HMAC-SHA256
// (RFC 4231's vectors), the store's secret (made once, 0600, agreed by concurrent openers,
// refused when it cannot be trusted), forged, copied and older-version entries, non-finite
// payloads, and planted files (sparse, oversized, FIFOs, symlinks) refused by their size and
// type before their payload is read.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "cache/ref_store.h"
#include "cache/ref_store_disk.h"
#include "core/hmac.h"
#include "core/sha256.h"
#include "flowkv/error.h"
#include "flowkv/store.h"
#include "temp_files.h"

namespace flowkv::store {
namespace {

namespace fs = std::filesystem;
using test::expect_error;
using test::TempDir;

std::string hex_of(const uint8_t* p, size_t n) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string s;
  for (size_t i = 0; i < n; ++i) {
    s += kDigits[p[i] >> 4];
    s += kDigits[p[i] & 15];
  }
  return s;
}

Key key_of(const std::string& kind, int64_t i) {
  return KeyBuilder(kind).integer("i", i).finish();
}

Entry entry_of(int64_t floats, float value) {
  Tensor t = Tensor::empty({floats});
  for (int64_t i = 0; i < floats; ++i) t.f32()[i] = value;
  return Entry{{t}};
}

StoreOptions with_disk(const std::string& dir, int64_t disk_bytes = int64_t{1} << 30) {
  StoreOptions o;
  o.ram_bytes = 1 << 20;
  o.disk_dir = dir;
  o.disk_bytes = disk_bytes;
  return o;
}

std::string file_of(const TempDir& d, const Key& k) {
  return d.file(disk::file_name(k));
}

Secret secret_of(const std::string& dir) {
  const disk::SecretResult r = disk::open_secret(dir);
  EXPECT_TRUE(r.ok) << r.error;
  return r.secret;
}

// Bytes this process has read through read()/pread() so far (/proc/self/io's rchar).
int64_t bytes_read() {
  std::ifstream in("/proc/self/io");
  std::string name;
  int64_t value = 0;
  while (in >> name >> value) {
    if (name == "rchar:") return value;
  }
  ADD_FAILURE() << "no rchar in /proc/self/io";
  return 0;
}

// A lookup of `k` in a store on `d` with budget `disk_bytes` misses, counts one disk error
// whose message names the file and `reason`, and removes the file; it reads less than
// `max_read` bytes doing so.
void expect_refused(const TempDir& d, const Key& k, const std::string& reason,
                    int64_t disk_bytes = int64_t{1} << 30, int64_t max_read = int64_t{4} << 20) {
  Store s(with_disk(d.path().string(), disk_bytes));
  const int64_t before = bytes_read();
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(s.find(k), nullptr);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(bytes_read() - before, max_read);
  EXPECT_LT(seconds, 10.0);
  const StoreStats st = s.stats();
  EXPECT_EQ(st.misses, 1);
  EXPECT_EQ(st.hits, 0);
  EXPECT_EQ(st.disk_errors, 1);
  const std::string err = s.last_disk_error();
  EXPECT_NE(err.find(file_of(d, k)), std::string::npos) << err;
  EXPECT_NE(err.find(reason), std::string::npos) << err;
  std::error_code ec;
  EXPECT_FALSE(fs::exists(fs::symlink_status(file_of(d, k), ec))) << "not removed";
}

// ---- HMAC-SHA256

struct Vector {
  std::string key, data, mac;  // mac: hex, possibly truncated (RFC 4231 test case 5)
};

TEST(Hmac, MatchesRfc4231) {
  const std::vector<Vector> cases = {
      {std::string(20, '\x0b'), "Hi There",
       "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7"},
      {"Jefe", "what do ya want for nothing?",
       "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"},
      {std::string(20, '\xaa'), std::string(50, '\xdd'),
       "773ea91e36800e46854db8ebd09181a72959098b3ef8c122d9635514ced565fe"},
      {"\x01\x02\x03\x04\x05\x06\x07\x08\x09\x0a\x0b\x0c\x0d\x0e\x0f\x10\x11\x12\x13\x14\x15\x16"
       "\x17\x18\x19",
       std::string(50, '\xcd'), "82558a389a443c0ea4cc819899f2083a85f0faa3e578f8077a2e3ff46729665b"},
      {std::string(20, '\x0c'), "Test With Truncation", "a3b6167473100ee06e0c796c2955552b"},
      {std::string(131, '\xaa'), "Test Using Larger Than Block-Size Key - Hash Key First",
       "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54"},
      {std::string(131, '\xaa'),
       "This is a test using a larger than block-size key and a larger than block-size data. The "
       "key needs to be hashed before being used by the HMAC algorithm.",
       "9b09ffa71b942fcb27635fbcd5b0e944bfdc63644f0713938a7f51535c3a35e2"},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    const Vector& v = cases[i];
    const Sha256Digest mac =
        HmacSha256::of(v.key.data(), v.key.size(), v.data.data(), v.data.size());
    EXPECT_EQ(hex_of(mac.data(), v.mac.size() / 2), v.mac) << "test case " << i + 1;
    // The same in pieces.
    HmacSha256 h(v.key.data(), v.key.size());
    for (char c : v.data) h.update(&c, 1);
    EXPECT_EQ(h.finish(), mac) << "test case " << i + 1;
  }
  // A key of exactly one block is used as it is, one byte longer is hashed first.
  const std::string block(64, 'k'), longer(65, 'k');
  EXPECT_NE(HmacSha256::of(block.data(), 64, "x", 1), HmacSha256::of(longer.data(), 65, "x", 1));
  const Sha256Digest m = HmacSha256::of("k", 1, "x", 1);
  EXPECT_TRUE(mac_equal(m, m.data()));
  Sha256Digest other = m;
  other[31] ^= 1;
  EXPECT_FALSE(mac_equal(m, other.data()));
}

// ---- the secret

TEST(StoreSecret, IsMadeOnceWithMode0600AndKept) {
  TempDir d;
  const std::string dir = d.file("store");
  Secret first{};
  {
    ReferenceStore r(with_disk(dir));  // the public face makes it too
  }
  const std::string path = dir + "/" + disk::kSecretFile;
  struct stat st {};
  ASSERT_EQ(::lstat(path.c_str(), &st), 0);
  EXPECT_TRUE(S_ISREG(st.st_mode));
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_EQ(st.st_size, 32);
  first = secret_of(dir);
  EXPECT_NE(first, Secret{});
  EXPECT_EQ(test::read_file(path), std::string(first.begin(), first.end()));
  Store again(with_disk(dir));
  EXPECT_EQ(secret_of(dir), first);
  EXPECT_EQ(d.list("store"), std::vector<std::string>{disk::kSecretFile});  // nothing else
  // Another store, another secret.
  TempDir other;
  EXPECT_NE(secret_of(other.path().string()), first);
}

// A creator killed between making its temporary and linking it leaves a temporary that the
// next opener removes (a live creator's is kept).
TEST(StoreSecret, AKilledCreatorsTemporaryIsRemoved) {
  TempDir d;
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  ASSERT_GT(child, 0);
  ::waitpid(child, nullptr, 0);  // its pid is free now: a dead writer's
  const std::string dead =
      std::string(disk::kSecretFile) + ".tmp-flowkv-" + std::to_string(child) + "-0";
  const std::string live =
      std::string(disk::kSecretFile) + ".tmp-flowkv-" + std::to_string(::getppid()) + "-0";
  test::write_file(d.file(dead), std::string(32, 'x'));
  test::write_file(d.file(live), std::string(32, 'y'));
  { Store s(with_disk(d.path().string())); }
  std::error_code ec;
  EXPECT_FALSE(fs::exists(d.file(dead), ec));
  EXPECT_TRUE(fs::exists(d.file(live), ec));
}

// Entries hold products of users' uploads and prompts: their files are the owner's alone.
TEST(StoreSecret, EntryFilesAreReadableByTheOwnerOnly) {
  TempDir d;
  const Key k = key_of("latents", 7);
  {
    Store s(with_disk(d.path().string()));
    s.insert(k, entry_of(16, 1.0f));
  }
  struct stat st {};
  ASSERT_EQ(::lstat(file_of(d, k).c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
}

// Processes opening one new store folder at the same moment all end up with the same secret.
TEST(StoreSecret, ConcurrentOpenersAgreeOnOneSecret) {
  constexpr int kProcesses = 6, kRounds = 5;
  for (int round = 0; round < kRounds; ++round) {
    TempDir d;
    const std::string dir = d.path().string();
    int go[2], results[2];
    ASSERT_EQ(::pipe(go), 0);
    ASSERT_EQ(::pipe(results), 0);
    std::vector<pid_t> children;
    for (int i = 0; i < kProcesses; ++i) {
      const pid_t pid = ::fork();
      ASSERT_GE(pid, 0);
      if (pid == 0) {
        ::close(go[1]);
        char c;
        while (::read(go[0], &c, 1) < 0) {
        }  // released all at once when the parent closes its end
        uint8_t out[33] = {};
        try {
          const disk::SecretResult r = disk::open_secret(dir);
          out[0] = r.ok ? 1 : 0;
          std::memcpy(out + 1, r.secret.data(), 32);
        } catch (...) {
          out[0] = 2;
        }
        const bool sent = ::write(results[1], out, sizeof out) == static_cast<ssize_t>(sizeof out);
        ::_exit(sent ? 0 : 1);
      }
      children.push_back(pid);
    }
    ::close(go[0]);
    ::close(results[1]);
    ::close(go[1]);  // go
    std::vector<std::string> secrets;
    for (int i = 0; i < kProcesses; ++i) {
      uint8_t in[33];
      size_t got = 0;
      while (got < sizeof in) {
        const ssize_t k = ::read(results[0], in + got, sizeof in - got);
        if (k <= 0) break;
        got += static_cast<size_t>(k);
      }
      ASSERT_EQ(got, sizeof in);
      EXPECT_EQ(in[0], 1) << "round " << round;
      secrets.push_back(hex_of(in + 1, 32));
    }
    ::close(results[0]);
    for (pid_t pid : children) {
      int status = 0;
      ::waitpid(pid, &status, 0);
      EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    }
    for (const std::string& s : secrets) EXPECT_EQ(s, secrets[0]) << "round " << round;
    const Secret kept = secret_of(dir);
    EXPECT_EQ(hex_of(kept.data(), 32), secrets[0]);
    EXPECT_EQ(d.list(), std::vector<std::string>{disk::kSecretFile});  // no temporary left
  }
}

TEST(StoreSecret, AnUntrustedSecretFileIsRefusedWithAClearError) {
  TempDir d;
  const std::string dir = d.path().string(), path = d.file(disk::kSecretFile);
  auto refused = [&](std::initializer_list<std::string> fragments) {
    expect_error([&] { ReferenceStore r(with_disk(dir)); }, fragments);
    expect_error([&] { Store s(with_disk(dir)); }, fragments);
  };
  { Store s(with_disk(dir)); }
  const std::string good = test::read_file(path);
  ASSERT_EQ(good.size(), 32u);
  for (const unsigned mode : {0644u, 0640u, 0604u, 0620u, 0602u}) {
    ASSERT_EQ(::chmod(path.c_str(), mode), 0);
    char text[8];
    std::snprintf(text, sizeof text, "%03o", mode);
    refused({path, std::string("has mode ") + text, "owner only", "chmod 600"});
  }
  ASSERT_EQ(::chmod(path.c_str(), 0400), 0);  // stricter is fine
  { Store s(with_disk(dir)); }
  ASSERT_EQ(::chmod(path.c_str(), 0600), 0);
  test::write_file(path, good.substr(0, 16));
  refused({path, "is 16 bytes; it must be 32", "remove it"});
  test::write_file(path, good + "x");
  refused({path, "is 33 bytes"});
  fs::remove(path);
  test::write_file(d.file("elsewhere"), good);
  ::chmod(d.file("elsewhere").c_str(), 0600);
  fs::create_symlink(d.file("elsewhere"), path);
  refused({path, "symbolic link"});
  fs::remove(path);
  fs::create_directory(path);
  refused({path, "not a regular file"});
  fs::remove(path);
  ASSERT_EQ(::mkfifo(path.c_str(), 0600), 0);  // refused, and opening it does not hang
  refused({path, "not a regular file"});
  fs::remove(path);
  // Removed: a new one is made, and what the old one sealed is no longer used.
  Store s(with_disk(dir));
  EXPECT_NE(test::read_file(path), good);
}

// ---- forged, copied and older entries

TEST(StoreForgery, AnEntryChangedWithItsPlainHashRecomputedIsAMiss) {
  TempDir d;
  const Key k = key_of("kv", 1);
  {
    Store a(with_disk(d.path().string()));
    a.insert(k, entry_of(64, 1.0f));
  }
  const std::string good = test::read_file(file_of(d, k));
  ASSERT_EQ(good.size(), 128u + 256 + 32);  // header (68) and its MAC, padding, payload, MAC
  auto plain_sum = [](std::string& s, size_t from, size_t n, size_t at) {
    const Sha256Digest h = Sha256::of(s.data() + from, n);
    std::memcpy(s.data() + at, h.data(), 32);
  };
  auto forged = [&] {
    std::string s = good;
    const float other = 2.0f;
    for (int i = 0; i < 64; ++i) std::memcpy(s.data() + 128 + 4 * i, &other, 4);  // a new picture
    return s;
  };
  // The old checksum field (the last 32 bytes) rewritten as the plain SHA-256 of what precedes.
  std::string s = forged();
  plain_sum(s, 0, s.size() - 32, s.size() - 32);
  test::write_file(file_of(d, k), s);
  expect_refused(d, k, "MAC mismatch");
  // The header's MAC rewritten as a plain hash too.
  s = forged();
  plain_sum(s, 0, 68, 68);
  plain_sum(s, 0, s.size() - 32, s.size() - 32);
  test::write_file(file_of(d, k), s);
  expect_refused(d, k, "header's MAC does not match");
  // As a version 1 file (what an older build wrote: no header length or MAC, a plain SHA-256
  // trailer) holding the forged payload.
  std::string v1 = good.substr(0, 12) + good.substr(16, 68 - 16);  // 64 bytes: no padding
  v1[8] = 1;
  v1 += forged().substr(128, 256);
  v1 += std::string(32, '\0');
  plain_sum(v1, 0, v1.size() - 32, v1.size() - 32);
  test::write_file(file_of(d, k), v1);
  expect_refused(d, k, "format version 1");
  // The untouched file is still served.
  test::write_file(file_of(d, k), good);
  Store s2(with_disk(d.path().string()));
  Handle h = s2.find(k);
  ASSERT_NE(h, nullptr);
  EXPECT_EQ(h->tensors.at(0).f32()[7], 1.0f);
}

TEST(StoreForgery, AnEntryCopiedFromAnotherStoreIsAMiss) {
  TempDir a_dir, b_dir;
  const Key k = key_of("latents", 5), mine = key_of("latents", 6);
  {
    Store a(with_disk(a_dir.path().string()));
    a.insert(k, entry_of(32, 5.0f));
    Store b(with_disk(b_dir.path().string()));
    b.insert(mine, entry_of(32, 6.0f));
  }
  EXPECT_NE(secret_of(a_dir.path().string()), secret_of(b_dir.path().string()));
  fs::copy_file(file_of(a_dir, k), file_of(b_dir, k));
  expect_refused(b_dir, k, "header's MAC does not match");
  Store b(with_disk(b_dir.path().string()));
  ASSERT_NE(b.find(mine), nullptr);  // its own entry still serves
  EXPECT_EQ(b.stats().disk_errors, 0);
}

// ---- non-finite values

// An entry of one tensor of `dtype` whose every byte is `fill` (finite in every dtype), with
// `bad` (two bytes) written at byte `at`.
Entry poisoned(DType dtype, Shape shape, int64_t at, uint16_t bad) {
  Tensor t = Tensor::empty(std::move(shape), dtype);
  std::memset(t.raw(), 0x3c, static_cast<size_t>(t.nbytes()));  // f16 / bf16 0x3c3c: finite
  if (at >= 0) std::memcpy(static_cast<uint8_t*>(t.raw()) + at, &bad, 2);
  return Entry{{t}};
}

TEST(StoreFinite, NonFiniteValuesAreNeverWrittenAndRefusedWhenRead) {
  const uint32_t nan_f32 = 0x7fc00001u, inf_f32 = 0xff800000u;
  struct Case {
    const char* name;
    DType dtype;
    Shape shape;
    int64_t at;  // byte of the bad value
    uint16_t v;  // its two bytes (for F32: the high half)
    int64_t element;
  };
  const std::vector<Case> cases = {
      {"F32 NaN", DType::kF32, {4, 8}, 4 * 9, static_cast<uint16_t>(nan_f32 >> 16), 9},
      {"F32 -Inf", DType::kF32, {4, 8}, 4 * 31, static_cast<uint16_t>(inf_f32 >> 16), 31},
      {"BF16 Inf", DType::kBF16, {16}, 2 * 3, 0x7f80, 3},
      {"BF16 NaN", DType::kBF16, {16}, 0, 0xffc1, 0},
      {"F16 NaN", DType::kF16, {16}, 2 * 15, 0x7e00, 15},
      {"F16 Inf", DType::kF16, {16}, 2 * 4, 0xfc00, 4},
      {"Q8_0 scale Inf", DType::kQ8_0, {2, 64}, 34 * 2, 0x7c00, 64},
      {"Q4_1 min NaN", DType::kQ4_1, {32}, 2, 0x7e00, 0},
      {"Q4_K dmin NaN", DType::kQ4_K, {2, 256}, 144 + 2, 0x7d00, 256},
      {"Q6_K scale Inf", DType::kQ6_K, {256}, 208, 0x7c00, 0},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const Key k = key_of("kv", 40);
    Entry bad = poisoned(c.dtype, c.shape, c.at + (c.dtype == DType::kF32 ? 2 : 0), c.v);
    if (c.dtype == DType::kF32) {  // the low half of the float too
      std::memset(static_cast<uint8_t*>(bad.tensors[0].raw()) + c.at, 0, 2);
    }
    // Never written: the writer refuses before its first byte.
    expect_error(
        [&] { serialize(k, bad, Secret{}); },
        {"tensor 0", "non-finite value (NaN or Inf) at element " + std::to_string(c.element),
         "not written"});
    TempDir d;
    {
      Store s(with_disk(d.path().string()));
      Handle h = s.insert(k, bad);  // the request goes on with it; the disk tier does not
      ASSERT_NE(h, nullptr);
      EXPECT_EQ(s.stats().disk_writes, 0);
      EXPECT_EQ(s.stats().disk_errors, 1);
      EXPECT_NE(s.last_disk_error().find("non-finite"), std::string::npos);
      EXPECT_EQ(d.list(), std::vector<std::string>{disk::kSecretFile});  // no temporary left
    }
    // Refused when read, even sealed with the store's own secret: a finite file with the bad
    // value patched in and both MACs recomputed.
    const Entry good = poisoned(c.dtype, c.shape, -1, 0);
    const Secret secret = secret_of(d.path().string());
    std::string bytes = serialize(k, good, secret);
    const std::string raw(static_cast<const char*>(bad.tensors[0].raw()),
                          static_cast<size_t>(bad.tensors[0].nbytes()));
    bytes.replace(bytes.size() - 32 - ((raw.size() + 63) / 64 * 64), raw.size(), raw);
    bytes = disk::reseal(secret, bytes);
    expect_error(
        [&] { deserialize(k, bytes, secret, "x.fkv"); },
        {"x.fkv", "non-finite value (NaN or Inf) at element " + std::to_string(c.element)});
    test::write_file(file_of(d, k), bytes);
    expect_refused(d, k, "non-finite");
  }
  // Extreme finite values are kept.
  const Key k = key_of("kv", 41);
  Entry big = entry_of(4, std::numeric_limits<float>::max());
  big.tensors[0].f32()[1] = -std::numeric_limits<float>::denorm_min();
  const Entry back = deserialize(k, serialize(k, big, Secret{}), Secret{}, "x");
  EXPECT_EQ(back.tensors[0].f32()[0], std::numeric_limits<float>::max());
}

// ---- planted files

// A file of `bytes` made sparse with ftruncate (nothing written but `prefix` at its start).
void plant_sparse(const std::string& path, int64_t bytes, const std::string& prefix = "") {
  test::write_file(path, prefix);
  ASSERT_EQ(::truncate(path.c_str(), static_cast<off_t>(bytes)), 0) << std::strerror(errno);
}

TEST(StorePlanted, ASparse4GiBFileIsRefusedWithoutBeingRead) {
  TempDir d;
  const Key k = key_of("kv", 3);
  const int64_t budget = int64_t{16} << 30, four = int64_t{4} << 30;  // the default budget
  plant_sparse(file_of(d, k), four);
  expect_refused(d, k, "sparse file (4294967296 bytes long", budget);
  // With a header this store sealed that describes exactly its size (4 GiB of floats after a
  // 128-byte header, then the MAC): refused the same way (its size on disk), before the payload.
  const Secret secret = secret_of(d.path().string());
  std::string h = serialize(k, entry_of(1, 0.0f), secret).substr(0, 128);
  const size_t dim = static_cast<uint8_t>(h[12]) - 8;  // the header's last field
  for (int i = 0; i < 8; ++i) h[dim + i] = static_cast<char>((four / 4) >> (8 * i));
  h = disk::reseal(secret, h + std::string(32, '\0')).substr(0, 128);
  expect_error([&] { deserialize(k, h, secret, "x"); },
               {"the file is 128 bytes but its header describes 4294967456"});  // valid but short
  plant_sparse(file_of(d, k), 128 + four + 32, h);
  expect_refused(d, k, "sparse file", budget);
}

TEST(StorePlanted, OversizedAndMisfitFilesAreRefusedByTheirSizeBeforeTheirPayload) {
  TempDir d;
  const Key k = key_of("kv", 4);
  // Over the disk budget (1 GiB here).
  plant_sparse(file_of(d, k), int64_t{2} << 30);
  expect_refused(d, k, "over the disk tier's budget");
  // Dense files (not sparse) of 8 MiB: only their first 4 KiB are read.
  const std::string junk(8 << 20, '\x5a');
  test::write_file(file_of(d, k), junk);
  expect_refused(d, k, "bad magic", int64_t{1} << 30, 1 << 20);
  // A sealed header that describes a smaller file than the one it heads.
  const Secret secret = secret_of(d.path().string());
  const std::string entry = serialize(k, entry_of(64, 1.0f), secret);
  test::write_file(file_of(d, k), entry + junk);
  expect_refused(d, k, "truncated or extended", int64_t{1} << 30, 1 << 20);
  // ... or a larger one.
  test::write_file(file_of(d, k), entry.substr(0, entry.size() - 64));
  expect_refused(d, k, "truncated or extended");
}

TEST(StorePlanted, FifosAndSymlinksAreRefusedWithoutHanging) {
  TempDir d;
  const Key k = key_of("prompt", 9);
  ASSERT_EQ(::mkfifo(file_of(d, k).c_str(), 0600), 0);
  expect_refused(d, k, "not a regular file");
  fs::create_symlink("/dev/zero", file_of(d, k));
  expect_refused(d, k, "cannot open");
  ASSERT_EQ(::mkfifo(d.file("fifo").c_str(), 0600), 0);
  fs::create_symlink(d.file("fifo"), file_of(d, k));
  expect_refused(d, k, "cannot open");
  EXPECT_TRUE(fs::exists(fs::symlink_status(d.file("fifo"))));  // what a link names is left
}

}  // namespace
}  // namespace flowkv::store
