// The reference store: content keys (framing: different field sequences never share a key),
// the RAM tier (hit / miss counters, LRU order, pinning by handle, rejection of what cannot fit,
// concurrent use), and the disk tier (a second store finds what the first wrote, bit for bit;
// truncated, corrupted and renamed files are refused, removed, counted and missed; the disk
// budget; a folder that cannot be written does not fail the request). The disk tier's secret,
// forged, copied, planted and non-finite files are in store_disk_test.cc.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "cache/ref_store.h"
#include "cache/ref_store_disk.h"
#include "core/sha256.h"
#include "flowkv/error.h"
#include "flowkv/limits.h"
#include "flowkv/store.h"
#include "temp_files.h"

namespace flowkv::store {
namespace {

namespace fs = std::filesystem;
using test::expect_error;
using test::TempDir;

Key key_of(const std::string& kind, int64_t i) {
  return KeyBuilder(kind).integer("i", i).finish();
}

// An entry of one F32 tensor of `floats` elements, each equal to `value`.
Entry entry_of(int64_t floats, float value) {
  Tensor t = Tensor::empty({floats});
  for (int64_t i = 0; i < floats; ++i) t.f32()[i] = value;
  return Entry{{t}};
}

StoreOptions ram_only(int64_t ram_bytes) {
  StoreOptions o;
  o.ram_bytes = ram_bytes;
  return o;
}

StoreOptions with_disk(const std::string& dir, int64_t disk_bytes = int64_t{1} << 30,
                       int64_t ram_bytes = 1 << 20) {
  StoreOptions o;
  o.ram_bytes = ram_bytes;
  o.disk_dir = dir;
  o.disk_bytes = disk_bytes;
  return o;
}

float value_of(const Handle& h) {
  return h->tensors.at(0).f32()[0];
}

std::string file_of(const TempDir& d, const Key& k) {
  return d.file(disk::file_name(k));
}

// The secret files are sealed with where no store folder is involved.
constexpr Secret kSecret = {1,  2,  3,  4,  5,  6,  7,  8,  9,  10, 11, 12, 13, 14, 15, 16,
                            17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32};

// The secret of the store in `d` (made now when it has none yet).
Secret secret_of(const TempDir& d) {
  const disk::SecretResult r = disk::open_secret(d.path().string());
  EXPECT_TRUE(r.ok) << r.error;
  return r.secret;
}

// ---- keys

TEST(StoreKey, Sha256MatchesTheStandardVector) {
  const Sha256Digest d = Sha256::of("abc", 3);
  EXPECT_EQ((Key{"kv", d}.hex()),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

TEST(StoreKey, HexIs64LowercaseDigits) {
  Key k{"kv", {}};
  for (size_t i = 0; i < k.digest.size(); ++i) k.digest[i] = static_cast<uint8_t>(i * 8 + 7);
  const std::string h = k.hex();
  ASSERT_EQ(h.size(), 64u);
  EXPECT_EQ(h.substr(0, 8), "070f171f");
  EXPECT_EQ(h.substr(56), "e7eff7ff");
  for (char c : h) EXPECT_TRUE((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f')) << h;
}

TEST(StoreKey, SameFieldsSameKey) {
  const Tensor t = Tensor::from_vector({1, 2, 3, 4}, {2, 2});
  auto make = [&] {
    return KeyBuilder("kv")
        .text("model", "klein")
        .integer("offset", -3)
        .real("scale", 0.5)
        .bytes("raw", "\x00\x01", 2)
        .tensor("latents", t)
        .finish();
  };
  const Key a = make(), b = make();
  EXPECT_TRUE(a == b);
  EXPECT_EQ(a.hex(), b.hex());
  EXPECT_EQ(a.kind, "kv");
}

TEST(StoreKey, FieldBoundariesLabelsTypesAndKindsChangeTheKey) {
  std::vector<Key> keys;
  keys.push_back(KeyBuilder("kv").text("a", "ab").text("a", "c").finish());
  keys.push_back(KeyBuilder("kv").text("a", "a").text("a", "bc").finish());
  keys.push_back(KeyBuilder("kv").text("a", "abc").finish());
  keys.push_back(KeyBuilder("kv").text("ab", "c").finish());  // label / value boundary
  keys.push_back(KeyBuilder("kv").text("a", "bc").finish());
  keys.push_back(KeyBuilder("kv").text("b", "bc").finish());       // another label
  keys.push_back(KeyBuilder("kv").bytes("a", "bc", 2).finish());   // another type
  keys.push_back(KeyBuilder("latents").text("a", "bc").finish());  // another kind
  keys.push_back(KeyBuilder("kv").integer("n", 1).finish());
  keys.push_back(KeyBuilder("kv").real("n", 1.0).finish());
  keys.push_back(KeyBuilder("kv").real("n", -0.0).finish());
  keys.push_back(KeyBuilder("kv").real("n", 0.0).finish());  // bit patterns, not values
  keys.push_back(KeyBuilder("kv").finish());
  keys.push_back(KeyBuilder("prompt").finish());
  // Tensors: same bytes under another shape or dtype.
  const Tensor t = Tensor::from_vector({1, 2, 3, 4, 5, 6}, {2, 3});
  keys.push_back(KeyBuilder("kv").tensor("t", t).finish());
  keys.push_back(KeyBuilder("kv").tensor("t", t.reshape({3, 2})).finish());
  keys.push_back(KeyBuilder("kv").tensor("t", t.reshape({6})).finish());
  Tensor same_bits = Tensor::empty({12}, DType::kBF16);
  std::memcpy(same_bits.raw(), t.raw(), 24);
  keys.push_back(KeyBuilder("kv").tensor("t", same_bits).finish());
  keys.push_back(KeyBuilder("kv").bytes("t", t.raw(), 24).finish());
  Tensor other = t.clone();
  other.f32()[5] = 7;
  keys.push_back(KeyBuilder("kv").tensor("t", other).finish());
  for (size_t i = 0; i < keys.size(); ++i) {
    for (size_t j = i + 1; j < keys.size(); ++j) {
      EXPECT_NE(keys[i].digest, keys[j].digest) << "keys " << i << " and " << j;
    }
  }
}

TEST(StoreKey, RefusesBadKindsAndASecondFinish) {
  expect_error([] { KeyBuilder("KV"); }, {"kind 'KV'", "a-z"});
  expect_error([] { KeyBuilder(""); }, {"kind ''"});
  expect_error([] { KeyBuilder("kv-1"); }, {"kind 'kv-1'"});
  expect_error([] { KeyBuilder("../x"); }, {"kind '../x'"});
  expect_error([] { KeyBuilder(std::string(33, 'a')); }, {"1 to 32"});
  KeyBuilder b("kv");
  b.finish();
  expect_error([&] { b.finish(); }, {"finish() called twice"});
  expect_error([&] { b.text("a", "b"); }, {"after finish()"});
  expect_error([] { KeyBuilder("kv").tensor("t", Tensor()); }, {"'t' is undefined"});
}

// ---- RAM tier

TEST(StoreRam, CountsHitsMissesAndInsertionsPerKind) {
  Store s(ram_only(1 << 20));
  const Key a = key_of("latents", 1), p = key_of("prompt", 1);
  EXPECT_EQ(s.find(a), nullptr);
  Handle h = s.insert(a, entry_of(10, 1.0f));
  ASSERT_NE(h, nullptr);
  EXPECT_EQ(value_of(h), 1.0f);
  EXPECT_EQ(s.find(a), h);
  EXPECT_EQ(s.find(p), nullptr);
  s.insert(p, entry_of(20, 2.0f));
  const StoreStats st = s.stats();
  EXPECT_EQ(st.hits, 1);
  EXPECT_EQ(st.misses, 2);
  EXPECT_EQ(st.insertions, 2);
  EXPECT_EQ(st.entries, 2);
  EXPECT_EQ(st.bytes, 120);
  EXPECT_EQ(st.pinned, 1);  // h
  EXPECT_EQ(st.pinned_bytes, 40);
  EXPECT_EQ(st.kinds.at("latents").hits, 1);
  EXPECT_EQ(st.kinds.at("latents").misses, 1);
  EXPECT_EQ(st.kinds.at("latents").entries, 1);
  EXPECT_EQ(st.kinds.at("latents").bytes, 40);
  EXPECT_EQ(st.kinds.at("prompt").hits, 0);
  EXPECT_EQ(st.kinds.at("prompt").misses, 1);
  EXPECT_EQ(st.kinds.at("prompt").bytes, 80);
  EXPECT_EQ(st.disk_entries, 0);
  // The same digest under another kind is another entry.
  EXPECT_EQ(s.find(Key{"kv", a.digest}), nullptr);
}

TEST(StoreRam, ASecondInsertOfAKeyReturnsTheFirstEntry) {
  Store s(ram_only(1 << 20));
  const Key k = key_of("kv", 1);
  Handle first = s.insert(k, entry_of(4, 1.0f));
  Handle second = s.insert(k, entry_of(4, 2.0f));
  EXPECT_EQ(first, second);
  EXPECT_EQ(value_of(second), 1.0f);
  EXPECT_EQ(s.stats().insertions, 1);
  EXPECT_EQ(s.stats().entries, 1);
}

TEST(StoreRam, EvictsTheLeastRecentlyUsed) {
  Store s(ram_only(300));  // three entries of 100 bytes
  for (int i = 0; i < 3; ++i) s.insert(key_of("kv", i), entry_of(25, float(i)));
  EXPECT_NE(s.find(key_of("kv", 0)), nullptr);  // 0 is now the most recent; 1 the least
  s.insert(key_of("kv", 3), entry_of(25, 3.0f));
  EXPECT_EQ(s.stats().evictions, 1);
  EXPECT_EQ(s.find(key_of("kv", 1)), nullptr);
  EXPECT_NE(s.find(key_of("kv", 0)), nullptr);
  EXPECT_NE(s.find(key_of("kv", 2)), nullptr);
  EXPECT_NE(s.find(key_of("kv", 3)), nullptr);
  EXPECT_EQ(s.stats().bytes, 300);
  // A larger entry evicts as many as it needs, oldest first (0, then 2).
  s.insert(key_of("kv", 4), entry_of(50, 4.0f));
  EXPECT_EQ(s.stats().evictions, 3);
  EXPECT_EQ(s.find(key_of("kv", 0)), nullptr);
  EXPECT_EQ(s.find(key_of("kv", 2)), nullptr);
  EXPECT_NE(s.find(key_of("kv", 3)), nullptr);
  EXPECT_EQ(s.stats().entries, 2);
}

// New prompts (a new one per request) evict only each other and hold at most prompt_share of
// the budget: they never push out reference work, which may push them out.
TEST(StoreRam, PromptsNeverEvictReferenceWork) {
  StoreOptions o = ram_only(1000);
  o.prompt_share = 0.25;  // 250 bytes: two 100-byte prompts
  Store s(o);
  for (int i = 0; i < 8; ++i) s.insert(key_of("kv", i), entry_of(25, float(i)));  // 800 bytes
  for (int i = 0; i < 5; ++i) s.insert(key_of("prompt", i), entry_of(25, float(i)));
  for (int i = 0; i < 8; ++i) EXPECT_NE(s.find(key_of("kv", i)), nullptr) << i;
  EXPECT_EQ(s.stats().kinds.at("prompt").entries, 2);  // the two newest
  EXPECT_NE(s.find(key_of("prompt", 4)), nullptr);
  EXPECT_NE(s.find(key_of("prompt", 3)), nullptr);
  EXPECT_EQ(s.find(key_of("prompt", 2)), nullptr);
  // Reference work does evict prompts (least recently used first).
  s.insert(key_of("latents", 0), entry_of(50, 9.0f));
  EXPECT_LE(s.stats().bytes, 1000);
  EXPECT_NE(s.find(key_of("latents", 0)), nullptr);
  // With the budget full of reference work, a new prompt is not kept (nothing it may evict).
  Store full(o);
  for (int i = 0; i < 10; ++i) full.insert(key_of("kv", i), entry_of(25, float(i)));
  Handle p = full.insert(key_of("prompt", 0), entry_of(25, 1.0f));
  EXPECT_EQ(value_of(p), 1.0f);
  EXPECT_EQ(full.stats().rejected, 1);
  EXPECT_EQ(full.find(key_of("prompt", 0)), nullptr);
  EXPECT_EQ(full.stats().kinds.at("kv").entries, 10);
}

TEST(StoreRam, PinnedEntriesAreNeverEvictedUntilReleased) {
  Store s(ram_only(300));
  Handle a = s.insert(key_of("kv", 0), entry_of(25, 0.0f));  // held: pinned
  s.insert(key_of("kv", 1), entry_of(25, 1.0f));
  s.insert(key_of("kv", 2), entry_of(25, 2.0f));
  s.insert(key_of("kv", 3), entry_of(25, 3.0f));  // 0 is the LRU, but pinned: 1 goes
  EXPECT_EQ(s.find(key_of("kv", 1)), nullptr);
  EXPECT_EQ(s.stats().pinned, 1);
  {
    Handle again = s.find(key_of("kv", 0));
    EXPECT_EQ(again, a);
  }
  // Every other entry is evicted before a pinned one, and a copy of a handle pins too.
  Handle copy = a;
  a.reset();
  s.insert(key_of("kv", 4), entry_of(50, 4.0f));
  EXPECT_NE(s.find(key_of("kv", 0)), nullptr);
  EXPECT_EQ(s.stats().pinned, 1);
  copy.reset();
  EXPECT_EQ(s.stats().pinned, 0);
  // Released, and now the least recently used: the next insert evicts it.
  s.find(key_of("kv", 4));
  s.insert(key_of("kv", 5), entry_of(25, 5.0f));
  EXPECT_EQ(s.find(key_of("kv", 0)), nullptr);
  EXPECT_NE(s.find(key_of("kv", 4)), nullptr);
  EXPECT_NE(s.find(key_of("kv", 5)), nullptr);
}

TEST(StoreRam, AnEntryThatCannotFitIsNotKeptButReturned) {
  Store s(ram_only(100));
  Handle big = s.insert(key_of("kv", 0), entry_of(40, 7.0f));  // 160 bytes
  ASSERT_NE(big, nullptr);
  EXPECT_EQ(value_of(big), 7.0f);
  EXPECT_EQ(big.use_count(), 1);  // the caller's alone
  StoreStats st = s.stats();
  EXPECT_EQ(st.rejected, 1);
  EXPECT_EQ(st.insertions, 0);
  EXPECT_EQ(st.entries, 0);
  EXPECT_EQ(s.find(key_of("kv", 0)), nullptr);
  // Beside a pinned entry: 60 + 60 > 100, and the pinned one stays.
  Handle pinned = s.insert(key_of("kv", 1), entry_of(15, 1.0f));
  s.insert(key_of("kv", 2), entry_of(10, 2.0f));  // unpinned: evicted for the next one if needed
  Handle second = s.insert(key_of("kv", 3), entry_of(15, 3.0f));
  EXPECT_EQ(value_of(second), 3.0f);
  st = s.stats();
  EXPECT_EQ(st.rejected, 2);
  EXPECT_EQ(st.evictions, 0);  // nothing was evicted for an entry that could not be kept
  EXPECT_NE(s.find(key_of("kv", 1)), nullptr);
  EXPECT_NE(s.find(key_of("kv", 2)), nullptr);
  // A budget of 0 keeps nothing.
  Store none(ram_only(0));
  EXPECT_NE(none.insert(key_of("kv", 0), entry_of(1, 1.0f)), nullptr);
  EXPECT_EQ(none.stats().entries, 0);
}

TEST(StoreRam, ClearDropsWhatNoRequestHolds) {
  Store s(ram_only(1000));
  Handle held = s.insert(key_of("kv", 0), entry_of(10, 0.0f));
  s.insert(key_of("kv", 1), entry_of(10, 1.0f));
  s.clear();
  EXPECT_EQ(s.stats().entries, 1);
  EXPECT_EQ(s.stats().bytes, 40);
  EXPECT_EQ(s.stats().kinds.at("kv").entries, 1);
  EXPECT_NE(s.find(key_of("kv", 0)), nullptr);
  EXPECT_EQ(s.find(key_of("kv", 1)), nullptr);
}

TEST(StoreRam, HandlesOutliveTheStore) {
  Handle h;
  {
    ReferenceStore r(ram_only(1000));
    h = of(r).insert(key_of("kv", 0), entry_of(3, 9.0f));
    EXPECT_EQ(r.stats().entries, 1);
  }
  EXPECT_EQ(value_of(h), 9.0f);
}

TEST(StoreRam, RefusesNegativeBudgets) {
  expect_error([] { Store s(ram_only(-1)); }, {"ram_bytes -1"});
  expect_error(
      [] {
        StoreOptions o;
        o.disk_bytes = -1;
        Store s(o);
      },
      {"disk_bytes -1"});
}

// Several threads look up and fill a small store at once: every handle holds its key's value,
// the counters add up, and the budget holds.
TEST(StoreRam, ConcurrentFindAndInsertStayConsistent) {
  constexpr int kThreads = 4, kOps = 400, kKeys = 24;
  Store s(ram_only(10 * 64 * 4));  // ten of the 24 entries
  std::vector<Key> keys;
  for (int i = 0; i < kKeys; ++i) keys.push_back(key_of(i % 2 ? "kv" : "latents", i));
  std::atomic<int> wrong{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::vector<Handle> held;
      for (int op = 0; op < kOps; ++op) {
        const int i = (op * 7 + t * 5) % kKeys;
        Handle h = s.find(keys[i]);
        if (!h) h = s.insert(keys[i], entry_of(64, float(i)));
        if (!h || value_of(h) != float(i) || h->tensors[0].f32()[63] != float(i)) ++wrong;
        if (op % 5 == 0) held.push_back(h);  // pin a few for a while
        if (held.size() > 2) held.erase(held.begin());
        if (op % 97 == 0) s.stats();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(wrong.load(), 0);
  const StoreStats st = s.stats();
  EXPECT_EQ(st.hits + st.misses, kThreads * kOps);
  EXPECT_LE(st.bytes, 10 * 64 * 4);
  EXPECT_EQ(st.pinned, 0);
  EXPECT_EQ(st.entries * 256, st.bytes);
  int64_t entries = 0, bytes = 0, hits = 0;
  for (const auto& [_, k] : st.kinds) {
    entries += k.entries;
    bytes += k.bytes;
    hits += k.hits;
  }
  EXPECT_EQ(entries, st.entries);
  EXPECT_EQ(bytes, st.bytes);
  EXPECT_EQ(hits, st.hits);
  EXPECT_EQ(st.insertions - st.evictions, st.entries);
}

// ---- the file format and the disk tier

// An entry of every shape of tensor a family stores: F32 and BF16 payloads, a quantized one, a
// scalar and an empty tensor.
Entry mixed_entry() {
  Entry e;
  Tensor f = Tensor::empty({2, 3, 5});
  for (int i = 0; i < 30; ++i) f.f32()[i] = 0.25f * float(i) - 3.0f;
  Tensor b = Tensor::empty({7}, DType::kBF16);
  for (int i = 0; i < 7; ++i) b.u16()[i] = static_cast<uint16_t>(0x3f80 + i);
  Tensor q = Tensor::zeros({2, 32}, DType::kQ8_0);
  static_cast<uint8_t*>(q.raw())[5] = 0x5a;
  Tensor scalar = Tensor::from_vector({42.0f}, {});
  Tensor empty = Tensor::empty({0, 4}, DType::kF16);
  e.tensors = {f, b, q, scalar, empty};
  return e;
}

void expect_same(const Entry& a, const Entry& b) {
  ASSERT_EQ(a.tensors.size(), b.tensors.size());
  for (size_t i = 0; i < a.tensors.size(); ++i) {
    const Tensor &x = a.tensors[i], &y = b.tensors[i];
    EXPECT_EQ(x.dtype(), y.dtype()) << i;
    EXPECT_EQ(x.shape(), y.shape()) << i;
    ASSERT_EQ(x.nbytes(), y.nbytes()) << i;
    EXPECT_EQ(std::memcmp(x.raw(), y.raw(), static_cast<size_t>(x.nbytes())), 0) << i;
  }
}

// The bytes with both MACs recomputed (so a test reaches the checks after them).
std::string resealed(std::string s) {
  return disk::reseal(kSecret, std::move(s));
}

TEST(StoreFormat, RoundTripsEveryTensorBitForBit) {
  const Key k = key_of("prompt", 5);
  const Entry e = mixed_entry();
  const std::string bytes = serialize(k, e, kSecret);
  EXPECT_EQ(static_cast<int64_t>(bytes.size()), disk::file_bytes(k, e));
  EXPECT_EQ(bytes.size() % 64, 32u);  // 64-aligned payloads, then the MAC
  expect_same(deserialize(k, bytes, kSecret, "x.fkv"), e);
  EXPECT_EQ(serialize(k, deserialize(k, bytes, kSecret, "x.fkv"), kSecret), bytes);
  const Entry none;
  expect_same(deserialize(k, serialize(k, none, kSecret), kSecret, "x"), none);
}

TEST(StoreFormat, RefusesDamagedAndForeignBytesNamingTheFile) {
  const Key k = key_of("latents", 1);
  const std::string good = serialize(k, entry_of(16, 1.5f), kSecret);
  auto refuse = [&](const std::string& bytes, std::initializer_list<std::string> fragments,
                    const Key& key) {
    expect_error([&] { deserialize(key, bytes, kSecret, "dir/latents-x.fkv"); }, fragments);
  };
  // Offsets: magic 8, version 4, header length 4, kind "latents" 1+7, digest 32, count 4, then
  // per tensor: dtype name 1+3 "F32", ndim 1, dims 8 each; the header ends at 73, its MAC at
  // 73..105, zeros to 128, the payload.
  constexpr size_t kLength = 12, kKind = 17, kCount = 16 + 8 + 32, kDtype = kCount + 4,
                   kNdim = kDtype + 4, kDim = kNdim + 1, kEnd = kDim + 8, kPad = kEnd + 32;
  ASSERT_EQ(static_cast<uint8_t>(good[kLength]), kEnd);
  ASSERT_EQ(static_cast<uint8_t>(good[kDim]), 16);
  refuse("", {"dir/latents-x.fkv", "bad magic"}, k);
  refuse(good.substr(0, 14), {"dir/latents-x.fkv", "truncated", "header length"}, k);
  refuse(good.substr(0, 20), {"dir/latents-x.fkv", "truncated", "header and its MAC need 105"}, k);
  refuse(good.substr(0, good.size() - 1), {"dir/latents-x.fkv", "truncated or extended"}, k);
  refuse(good + "x", {"truncated or extended"}, k);
  std::string flipped = good;
  flipped[130] ^= 0x10;  // a payload bit (the payload starts at 128)
  refuse(flipped, {"dir/latents-x.fkv", "MAC mismatch"}, k);
  std::string sum = good;
  sum.back() ^= 1;
  refuse(sum, {"MAC mismatch"}, k);
  std::string head = good;
  head[kDim] = 8;  // a header byte: its MAC refuses it before any field after the prelude is read
  refuse(head, {"dir/latents-x.fkv", "header's MAC does not match"}, k);
  // Another key's file (renamed), another kind with the same digest.
  const Key other = key_of("latents", 2);
  refuse(good, {"dir/latents-x.fkv", "renamed or copied", other.hex(), k.hex()}, other);
  refuse(good, {"renamed or copied"}, Key{"kv", k.digest});
  std::string kind = good;
  kind[kKind] = 'L';  // "Latents"
  refuse(resealed(kind), {"the kind is not 1 to 32 characters"}, Key{"Latents", k.digest});
  std::string version = good;
  version[8] = 1;
  refuse(version, {"format version 1", "reads version 2"}, k);
  version[8] = 3;
  refuse(version, {"format version 3", "reads version 2"}, k);
  // Header fields (both MACs recomputed, so the checks behind them are reached).
  std::string s = good;
  s[kLength] = 5;  // checked before the MAC
  refuse(s, {"header length 5 is outside 54.."}, k);
  s = good;
  s[kLength + 2] = 1;  // 64 KiB + 73: longer than the file
  refuse(resealed(s), {"header and its MAC need 65641"}, k);
  s = good;
  s[kLength + 3] = 1;  // 16 MiB + 73: over the largest header the limits allow
  refuse(resealed(s), {"header length 16777289 is outside"}, k);
  s = good;
  s[kLength] = kEnd + 8;  // the header's fields end before its length
  refuse(resealed(s), {"the header's fields end at 73 but its length is 81"}, k);
  s = good;
  s[kCount] = '\xff';
  s[kCount + 1] = '\xff';
  refuse(resealed(s), {"65535 tensors", "at most 4096"}, k);
  s = good;
  s[kCount] = 2;  // a second tensor header past the header's end
  refuse(resealed(s), {"truncated: dtype name length", "the header ends at 73"}, k);
  s[kLength] = kEnd + 1;  // ... and one of a zero byte: a zero-length dtype name
  s[kEnd] = 0;
  refuse(resealed(s), {"tensor 1: unknown dtype ''"}, k);
  s = good;
  s[kDtype + 1] = 'I';  // "I32"
  refuse(resealed(s), {"tensor 0: unknown dtype 'I32'"}, k);
  s = good;
  s[kNdim] = 9;
  refuse(resealed(s), {"tensor 0 has 9 dimensions", "at most 8"}, k);
  s = good;
  s[kDim + 7] = '\x80';  // a dimension above 2^63
  refuse(resealed(s), {"larger than the largest signed 64-bit size"}, k);
  s = good;
  s[kDim + 5] = '\x10';  // 2^44 + 16 floats in a file of a few hundred bytes: no allocation
  refuse(resealed(s), {"header describes", "truncated or extended"}, k);
  s = good;
  s[kLength] = kEnd + 8;  // with ndim 2, 8 more header bytes are a dimension of 2^62: 16 x 2^62
  s[kEnd] = '\x40';
  s[kEnd + 7] = '\x40';
  s[kNdim] = 2;
  refuse(resealed(s), {"tensor 0", "overflows 64 bits"}, k);
  // Past the sizes, padding that is not zero (MACs recomputed).
  s = good;
  s[kPad + 1] = 1;
  refuse(resealed(s), {"non-zero padding after the header"}, k);
  s = serialize(k, entry_of(3, 1.0f), kSecret);  // 12 bytes of payload, then 52 of padding
  s[s.size() - 32 - 1] = 1;
  refuse(resealed(s), {"non-zero padding after a tensor"}, k);
}

TEST(StoreFormat, RefusesQuantizedRowsThatAreNotWholeBlocks) {
  const Key k = key_of("kv", 1);
  Entry e{{Tensor::zeros({1, 32}, DType::kQ8_0)}};
  std::string s = serialize(k, e, kSecret);
  constexpr size_t kDim1 = 8 + 4 + 4 + 3 + 32 + 4 + 5 + 1 + 8;  // "Q8_0": 1+4 name bytes
  ASSERT_EQ(static_cast<uint8_t>(s[kDim1]), 32);
  s[kDim1] = 31;
  expect_error([&] { deserialize(k, resealed(s), kSecret, "q.fkv"); },
               {"q.fkv", "whole blocks of 32 elements"});
}

TEST(StoreFormat, RefusesToWriteWhatItCouldNotRead) {
  expect_error([] { serialize(key_of("kv", 0), Entry{{Tensor()}}, kSecret); },
               {"tensor 0 is undefined"});
  Entry deep{{Tensor::zeros({1, 1, 1, 1, 1, 1, 1, 1, 1})}};
  expect_error([&] { serialize(key_of("kv", 0), deep, kSecret); }, {"9 dimensions"});
}

TEST(StoreDisk, ASecondStoreFindsTheEntryBitForBit) {
  TempDir d;
  const Key k = key_of("kv", 11);
  const Entry e = mixed_entry();
  {
    Store a(with_disk(d.path().string()));
    a.insert(k, e);
    const StoreStats st = a.stats();
    EXPECT_EQ(st.disk_writes, 1);
    EXPECT_EQ(st.disk_entries, 1);
    EXPECT_EQ(st.disk_bytes, disk::file_bytes(k, e));
    EXPECT_EQ(st.disk_errors, 0);
  }
  EXPECT_EQ(d.list(), (std::vector<std::string>{"kv-" + k.hex() + ".fkv", disk::kSecretFile}));
  Store b(with_disk(d.path().string()));
  EXPECT_EQ(b.stats().disk_entries, 1);  // found at start-up
  Handle h = b.find(k);
  ASSERT_NE(h, nullptr);
  expect_same(*h, e);
  for (const Tensor& t : h->tensors) {  // the tensors point into one 64-byte aligned buffer
    EXPECT_EQ(reinterpret_cast<uintptr_t>(t.raw()) % 64, 0u);
  }
  StoreStats st = b.stats();
  EXPECT_EQ(st.hits, 1);
  EXPECT_EQ(st.disk_hits, 1);
  EXPECT_EQ(st.entries, 1);  // now in RAM too
  EXPECT_EQ(st.kinds.at("kv").hits, 1);
  EXPECT_EQ(b.find(k), h);  // from RAM
  EXPECT_EQ(b.stats().disk_hits, 1);
  // An entry evicted from RAM comes back from disk.
  Store c(with_disk(d.path().string(), int64_t{1} << 30, 400));
  c.insert(key_of("kv", 1), entry_of(100, 1.0f));
  c.insert(key_of("kv", 2), entry_of(100, 2.0f));  // evicts 1 from RAM; on disk still
  EXPECT_EQ(c.stats().evictions, 1);
  Handle back = c.find(key_of("kv", 1));
  ASSERT_NE(back, nullptr);
  EXPECT_EQ(value_of(back), 1.0f);
  EXPECT_EQ(c.stats().disk_hits, 1);
  EXPECT_EQ(c.stats().disk_writes, 2);  // read back, not written again
}

// A damaged file: the store refuses it, removes it, counts it and misses; the error names it.
void expect_refused_file(const TempDir& d, const Key& k, const std::string& reason) {
  Store s(with_disk(d.path().string()));
  EXPECT_EQ(s.find(k), nullptr);
  const StoreStats st = s.stats();
  EXPECT_EQ(st.disk_errors, 1);
  EXPECT_EQ(st.misses, 1);
  EXPECT_EQ(st.hits, 0);
  EXPECT_EQ(st.disk_entries, 0);
  EXPECT_FALSE(fs::exists(file_of(d, k)));
  const std::string err = s.last_disk_error();
  EXPECT_NE(err.find(file_of(d, k)), std::string::npos) << err;
  EXPECT_NE(err.find(reason), std::string::npos) << err;
  EXPECT_EQ(s.find(k), nullptr);  // gone: a plain miss now
  EXPECT_EQ(s.stats().disk_errors, 1);
}

TEST(StoreDisk, TruncatedFlippedAndRenamedFilesAreRefusedRemovedAndMissed) {
  TempDir d;
  const Key k = key_of("latents", 3);
  const Secret secret = secret_of(d);
  const std::string good = serialize(k, entry_of(64, 3.0f), secret);
  test::write_file(file_of(d, k), good.substr(0, good.size() - 100));
  expect_refused_file(d, k, "truncated");
  std::string flipped = good;
  flipped[300] ^= 4;
  test::write_file(file_of(d, k), flipped);
  expect_refused_file(d, k, "MAC mismatch");
  // Another key's (valid) file under this key's name.
  test::write_file(file_of(d, k), serialize(key_of("latents", 4), entry_of(64, 4.0f), secret));
  expect_refused_file(d, k, "renamed or copied");
  // Not a file at all.
  fs::create_directory(file_of(d, k));
  expect_refused_file(d, k, "");
  // A symlink to a good file: the store writes regular files only.
  test::write_file(d.file("elsewhere"), good);
  fs::create_symlink(d.file("elsewhere"), file_of(d, k));
  expect_refused_file(d, k, "cannot open");
  EXPECT_TRUE(fs::exists(d.file("elsewhere")));
}

TEST(StoreDisk, EvictsTheOldestFilesOverTheDiskBudget) {
  TempDir d;
  const int64_t file = disk::file_bytes(key_of("kv", 0), entry_of(100, 0.0f));  // 608 bytes
  {
    Store s(with_disk(d.path().string(), 2 * file));
    for (int i = 0; i < 3; ++i) s.insert(key_of("kv", i), entry_of(100, float(i)));
    const StoreStats st = s.stats();
    EXPECT_EQ(st.disk_writes, 3);
    EXPECT_EQ(st.disk_evictions, 1);
    EXPECT_EQ(st.disk_entries, 2);
    EXPECT_EQ(st.disk_bytes, 2 * file);
    EXPECT_FALSE(fs::exists(file_of(d, key_of("kv", 0))));
    EXPECT_TRUE(fs::exists(file_of(d, key_of("kv", 1))));
    // An entry larger than the whole disk budget is not written (it would evict everything).
    s.insert(key_of("kv", 9), entry_of(1000, 9.0f));
    EXPECT_EQ(s.stats().disk_writes, 3);
    EXPECT_FALSE(fs::exists(file_of(d, key_of("kv", 9))));
  }
  // At start-up: the folder's entry files are indexed oldest first (by mtime) and evicted to
  // the budget; other files are left alone.
  const auto old_time = fs::last_write_time(file_of(d, key_of("kv", 2))) - std::chrono::hours(1);
  fs::last_write_time(file_of(d, key_of("kv", 2)), old_time);
  test::write_file(d.file("notes.txt"), "keep me");
  // Temporaries of writers: a dead process's (pid 2^22 + 1 is above Linux's pid_max) is
  // removed, a live one's (this process's) stays, as does anything that only looks similar.
  const std::string entry_name = disk::file_name(key_of("kv", 7));
  test::write_file(d.file(entry_name + ".tmp-flowkv-4194305-0"), "dead writer");
  test::write_file(d.file(entry_name + ".tmp-flowkv-" + std::to_string(::getpid()) + "-3"), "");
  test::write_file(d.file("notes.txt.tmp-flowkv-4194305-0"), "not ours");
  test::write_file(d.file("kv-1234.fkv"), "not an entry name");
  test::write_file(d.file("KV-" + key_of("kv", 5).hex() + ".fkv"), "not an entry name");
  Store s(with_disk(d.path().string(), file));
  const StoreStats st = s.stats();
  EXPECT_EQ(st.disk_evictions, 1);
  EXPECT_EQ(st.disk_entries, 1);
  EXPECT_FALSE(fs::exists(file_of(d, key_of("kv", 2))));  // the older one
  EXPECT_TRUE(fs::exists(file_of(d, key_of("kv", 1))));
  EXPECT_TRUE(fs::exists(d.file("notes.txt")));
  EXPECT_TRUE(fs::exists(d.file("kv-1234.fkv")));
  EXPECT_FALSE(fs::exists(d.file(entry_name + ".tmp-flowkv-4194305-0")));
  EXPECT_TRUE(fs::exists(d.file(entry_name + ".tmp-flowkv-" + std::to_string(::getpid()) + "-3")));
  EXPECT_TRUE(fs::exists(d.file("notes.txt.tmp-flowkv-4194305-0")));
  ASSERT_NE(s.find(key_of("kv", 1)), nullptr);
}

TEST(StoreDisk, AFolderThatCannotBeWrittenDoesNotFailTheRequest) {
  TempDir d;
  test::write_file(d.file("file"), "a file where the folder should be");
  Store s(with_disk(d.file("file") + "/store"));
  Handle h = s.insert(key_of("kv", 0), entry_of(8, 1.0f));
  ASSERT_NE(h, nullptr);
  EXPECT_EQ(value_of(h), 1.0f);
  StoreStats st = s.stats();
  EXPECT_EQ(st.disk_errors, 1);
  EXPECT_EQ(st.disk_writes, 0);
  EXPECT_EQ(st.insertions, 1);
  EXPECT_NE(s.last_disk_error().find("cannot write"), std::string::npos) << s.last_disk_error();
  EXPECT_EQ(s.find(key_of("kv", 0)), h);  // RAM still serves it
  EXPECT_EQ(s.find(key_of("kv", 1)), nullptr);
  EXPECT_EQ(s.stats().disk_errors, 1);
}

// A full disk, without root: files may not grow past 4 KiB (writes fail with EFBIG).
TEST(StoreDisk, AFullDiskDoesNotFailTheRequest) {
  TempDir d;
  Store s(with_disk(d.path().string()));
  const auto old_signal = std::signal(SIGXFSZ, SIG_IGN);
  rlimit old{};
  ::getrlimit(RLIMIT_FSIZE, &old);
  rlimit l = old;
  l.rlim_cur = 4096;
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &l), 0);
  Handle big = s.insert(key_of("kv", 0), entry_of(4096, 1.0f));
  Handle small = s.insert(key_of("kv", 1), entry_of(16, 1.0f));
  ::setrlimit(RLIMIT_FSIZE, &old);
  std::signal(SIGXFSZ, old_signal);
  ASSERT_NE(big, nullptr);
  EXPECT_EQ(s.stats().disk_errors, 1);
  EXPECT_EQ(s.stats().disk_writes, 1);
  EXPECT_NE(s.last_disk_error().find("File too large"), std::string::npos);
  // Neither the failed file nor its temporary is left.
  EXPECT_EQ(d.list(),
            (std::vector<std::string>{disk::file_name(key_of("kv", 1)), disk::kSecretFile}));
}

// Threads sharing a store whose RAM holds few entries: most lookups go to the disk tier while
// other threads write it; every handle holds its key's value and no file is ever refused.
TEST(StoreDisk, ConcurrentUseThroughTheDiskTierStaysConsistent) {
  TempDir d;
  constexpr int kThreads = 4, kOps = 150, kKeys = 12;
  Store s(with_disk(d.path().string(), int64_t{1} << 30, 3 * 256));
  std::atomic<int> wrong{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int op = 0; op < kOps; ++op) {
        const int i = (op * 5 + t * 3) % kKeys;
        const Key k = key_of("kv", i);
        Handle h = s.find(k);
        if (!h) h = s.insert(k, entry_of(64, float(i)));
        if (!h || value_of(h) != float(i) || h->tensors[0].f32()[63] != float(i)) ++wrong;
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(wrong.load(), 0);
  const StoreStats st = s.stats();
  EXPECT_EQ(st.disk_errors, 0) << s.last_disk_error();
  EXPECT_EQ(st.hits + st.misses, kThreads * kOps);
  EXPECT_GT(st.disk_hits, 0);
  EXPECT_EQ(st.disk_entries, kKeys);
  EXPECT_LE(st.bytes, 3 * 256);
  EXPECT_EQ(d.list().size(), size_t{kKeys} + 1);  // no temporary left; the secret
  const Secret secret = secret_of(d);
  for (int i = 0; i < kKeys; ++i) {
    const Key k = key_of("kv", i);
    EXPECT_EQ(deserialize(k, test::read_file(file_of(d, k)), secret, "f").tensors.at(0).f32()[5],
              i);
  }
}

TEST(StoreDisk, FileNamesFollowOnePattern) {
  const Key k = key_of("prompt", 1);
  Key back;
  ASSERT_TRUE(disk::parse_file_name(disk::file_name(k), &back));
  EXPECT_TRUE(back == k);
  const std::string h = k.hex(), tail = h.substr(1);
  const std::vector<std::string> bad_names = {"prompt-" + h,
                                              "-" + h + ".fkv",
                                              "prompt_" + h + ".fkv",
                                              "prompt-" + tail + ".fkv",
                                              "Prompt-" + h + ".fkv",
                                              "prompt-" + h + ".fkv.tmp-flowkv-1-2",
                                              "prompt-x" + tail + ".fkv"};
  for (const std::string& bad : bad_names) {
    EXPECT_FALSE(disk::parse_file_name(bad, nullptr)) << bad;
  }
  EXPECT_EQ(disk::temp_file_pid(disk::file_name(k) + ".tmp-flowkv-123-4"), 123);
  EXPECT_EQ(disk::temp_file_pid(disk::file_name(k) + ".tmp-flowkv-123-"), -1);
  EXPECT_EQ(disk::temp_file_pid(disk::file_name(k) + ".tmp-flowkv--4"), -1);
  EXPECT_EQ(disk::temp_file_pid(disk::file_name(k) + ".tmp-flowkv-1x-4"), -1);
  EXPECT_EQ(disk::temp_file_pid(disk::file_name(k)), -1);
  EXPECT_EQ(disk::temp_file_pid("x.fkv.tmp-flowkv-123-4"), -1);
}

}  // namespace
}  // namespace flowkv::store
