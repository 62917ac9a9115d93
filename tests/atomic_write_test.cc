// Writes that cannot lose data: a full disk, a failed rename or an unwritable folder leaves the
// old file intact and no temporary file behind, with an Error naming the path; exporting over an
// older checkpoint leaves nothing the loader would read instead of the new files.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "flowkv/error.h"
#include "flowkv/flux2.h"
#include "flowkv/image.h"
#include "flowkv/io.h"
#include "io/atomic_file.h"
#include "io/checkpoint.h"
#include "io/safetensors.h"
#include "models/flux2/builtin.h"
#include "models/flux2/weights.h"
#include "temp_files.h"
#include "test_util.h"

namespace flowkv {
namespace {

namespace fs = std::filesystem;

using test::expect_error;
using test::TempDir;
const auto read = test::read_file;

// A full disk, deterministically and without root: files may grow to `bytes` at most (writes
// past it fail with EFBIG instead of raising SIGXFSZ). Restored on destruction.
class FileSizeLimit {
 public:
  explicit FileSizeLimit(rlim_t bytes) {
    old_signal_ = std::signal(SIGXFSZ, SIG_IGN);
    ::getrlimit(RLIMIT_FSIZE, &old_);
    rlimit l = old_;
    l.rlim_cur = bytes;
    EXPECT_EQ(::setrlimit(RLIMIT_FSIZE, &l), 0);
  }
  ~FileSizeLimit() {
    ::setrlimit(RLIMIT_FSIZE, &old_);
    std::signal(SIGXFSZ, old_signal_);
  }

 private:
  rlimit old_{};
  void (*old_signal_)(int) = nullptr;
};

TEST(AtomicWrite, WritesAndReplaces) {
  TempDir d;
  write_file_atomic(d.file("a.json"), "first");
  EXPECT_EQ(read(d.file("a.json")), "first");
  write_file_atomic(d.file("a.json"), "second, longer");
  EXPECT_EQ(read(d.file("a.json")), "second, longer");
  write_file_atomic(d.file("a.json"), "");
  EXPECT_EQ(read(d.file("a.json")), "");
  EXPECT_EQ(d.list(), std::vector<std::string>{"a.json"});
}

TEST(AtomicWrite, FullDiskKeepsTheOldFileAndLeavesNoTemp) {
  TempDir d;
  const std::string path = d.file("bench.json");
  write_file_atomic(path, "good");
  const std::string big(256 * 1024, 'x');
  {
    FileSizeLimit limit(64 * 1024);
    expect_error([&] { write_file_atomic(path, big); }, {"cannot write", path, "File too large"});
    // Streamed writes, safetensors: the same.
    expect_error(
        [&] {
          AtomicFile f(path);
          f.write(big.data(), 1000);
          f.write(big);
          f.commit();
        },
        {path, "File too large"});
    std::vector<float> data(64 * 1024, 1.0f);
    const std::string st = d.file("w.safetensors");
    expect_error(
        [&] {
          write_safetensors(st, {{"w", DType::kF32, {64, 1024}, data.data()}});
        },
        {st, "File too large"});
    // A hole that takes the file past the limit fails at commit.
    expect_error(
        [&] {
          write_safetensors(st, {{"w", DType::kF32, {64, 1024}, nullptr}});
        },
        {st, "File too large"});
  }
  EXPECT_EQ(read(path), "good");
  EXPECT_EQ(d.list(), std::vector<std::string>{"bench.json"});
}

TEST(AtomicWrite, FailedRenameLeavesNoTemp) {
  TempDir d;
  fs::create_directories(d.file("taken/inside"));
  expect_error([&] { write_file_atomic(d.file("taken"), "x"); }, {"cannot replace", "taken"});
  EXPECT_TRUE(fs::is_directory(d.file("taken/inside")));
  EXPECT_EQ(d.list(), std::vector<std::string>{"taken"});
  expect_error([&] { write_safetensors(d.file("taken"), {}); }, {"taken"});
  EXPECT_EQ(d.list(), std::vector<std::string>{"taken"});
}

TEST(AtomicWrite, UnwritableFolderIsAnErrorNamingThePath) {
  TempDir d;
  expect_error([&] { write_file_atomic(d.file("no/such/folder/out.json"), "x"); },
               {"no/such/folder/out.json", "No such file or directory"});
  expect_error([&] { write_file_atomic(d.file("dir/"), "x"); }, {"dir/"});
  if (::geteuid() != 0) {  // root writes anywhere
    fs::create_directories(d.file("ro"));
    fs::permissions(d.file("ro"), fs::perms::owner_read | fs::perms::owner_exec);
    expect_error([&] { write_file_atomic(d.file("ro/out.json"), "x"); },
                 {"ro/out.json", "Permission denied"});
    fs::permissions(d.file("ro"), fs::perms::owner_all);
  }
}

TEST(AtomicWrite, DroppedWriterRemovesItsTemp) {
  TempDir d;
  {
    AtomicFile f(d.file("x.bin"));
    f.write("partial");
    EXPECT_TRUE(fs::exists(f.temp_path()));
  }
  EXPECT_TRUE(d.list().empty());
}

TEST(AtomicWrite, SparseHolesReadBackAsZeros) {
  TempDir d;
  const std::vector<float> a = {1, 2, 3};
  write_safetensors(d.file("s.safetensors"),
                    {{"a", DType::kF32, {3}, a.data()}, {"hole", DType::kF32, {1000}, nullptr}});
  const SafetensorsFile f = SafetensorsFile::open(d.file("s.safetensors"));
  for (const TensorInfo& t : f.header().tensors) {
    const Tensor v = f.view(t);
    for (int64_t i = 0; i < v.numel(); ++i) {
      EXPECT_EQ(v.f32()[i], t.name == "a" ? a[static_cast<size_t>(i)] : 0.0f);
    }
  }
}

TEST(AtomicWrite, ConcurrentWritersNeverMix) {
  TempDir d;
  const std::string path = d.file("shared.json");
  std::vector<std::thread> pool;
  for (int t = 0; t < 4; ++t) {
    pool.emplace_back([&, t] {
      const std::string body(10000 + t, static_cast<char>('a' + t));
      for (int i = 0; i < 10; ++i) write_file_atomic(path, body);
    });
  }
  for (auto& t : pool) t.join();
  const std::string got = read(path);
  ASSERT_GE(got.size(), 10000u);
  EXPECT_EQ(got, std::string(got.size(), got[0]));
  EXPECT_EQ(d.list(), std::vector<std::string>{"shared.json"});
}

// Issue 27: a target that exists and is not a regular file is refused and left as it was:
// rename() would replace a symbolic link itself (and, as root, a device node or FIFO).
TEST(AtomicWrite, LinksFifosAndFoldersAreNeverReplaced) {
  TempDir d;
  test::write_file(d.file("real.png"), "keep me");
  fs::create_symlink(d.file("real.png"), d.file("link.png"));
  expect_error([&] { write_file_atomic(d.file("link.png"), "x"); },
               {"cannot replace", "link.png", "symbolic link", "not a regular file"});
  expect_error([&] { save_png(d.file("link.png"), Image::blank(2, 2, "x")); },
               {"link.png", "symbolic link"});
  EXPECT_TRUE(fs::is_symlink(d.file("link.png")));
  EXPECT_EQ(read(d.file("real.png")), "keep me");
  fs::create_symlink(d.file("nowhere"), d.file("dangling.json"));  // a dangling link too
  expect_error([&] { write_file_atomic(d.file("dangling.json"), "x"); }, {"symbolic link"});
  EXPECT_TRUE(fs::is_symlink(d.file("dangling.json")));
  EXPECT_FALSE(fs::exists(d.file("nowhere")));
  ASSERT_EQ(::mkfifo(d.file("out.png").c_str(), 0600), 0);
  expect_error([&] { save_png(d.file("out.png"), Image::blank(2, 2, "x")); },
               {"cannot replace", "out.png", "FIFO"});
  EXPECT_TRUE(fs::is_fifo(d.file("out.png")));
  fs::create_directory(d.file("dir.json"));
  expect_error([&] { write_file_atomic(d.file("dir.json"), "x"); },
               {"cannot replace", "dir.json", "folder"});
  EXPECT_EQ(d.list(), (std::vector<std::string>{"dangling.json", "dir.json", "link.png", "out.png",
                                                "real.png"}));
  // A device node (as root a rename would replace it): refused for everyone.
  expect_error([&] { write_file_atomic("/dev/null", "x"); }, {"/dev/null", "character device"});
}

// The temporary is readable by its owner only until it is committed; the file then has the
// mode a plain create gives (0666 less the umask).
TEST(AtomicWrite, TheTemporaryIsPrivateUntilCommitted) {
  TempDir d;
  const mode_t mask = ::umask(022);
  ::umask(mask);
  AtomicFile f(d.file("a.json"));
  f.write("secret until done");
  struct stat st {};
  ASSERT_EQ(::stat(f.temp_path().c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0600u);
  f.commit();
  ASSERT_EQ(::stat(d.file("a.json").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0666u & ~mask);
}

// A writer killed mid-write (SIGKILL: no destructor runs) leaves its temporary; the next write
// of the same file removes it. Temporaries of live writers and of other files stay.
TEST(AtomicWrite, TheNextWriteRemovesTheTemporaryOfAKilledWriter) {
  TempDir d;
  const std::string path = d.file("out.json");
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    AtomicFile f(path);
    f.write(std::string(100000, 'x'));
    const char c = 1;
    if (::write(ready[1], &c, 1) != 1) ::_exit(1);
    for (;;) ::pause();  // killed here, mid-write
  }
  char c = 0;
  ASSERT_EQ(::read(ready[0], &c, 1), 1);
  ::close(ready[0]);
  ::close(ready[1]);
  ASSERT_EQ(::kill(child, SIGKILL), 0);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFSIGNALED(status));
  const std::vector<std::string> left = d.list();
  ASSERT_EQ(left.size(), 1u);
  EXPECT_EQ(left[0].rfind("out.json.tmp-flowkv-" + std::to_string(child) + "-", 0), 0u);
  // A live writer's temporary (pid 1 always exists), another file's, and a name that only
  // looks like one stay.
  const std::vector<std::string> kept = {"other.json.tmp-flowkv-4194305-0",
                                         "out.json.tmp-flowkv-1-7", "out.json.tmp-flowkv-x-1"};
  for (const std::string& k : kept) test::write_file(d.file(k), "");
  write_file_atomic(path, "new");
  EXPECT_EQ(read(path), "new");
  std::vector<std::string> want = kept;
  want.push_back("out.json");
  std::sort(want.begin(), want.end());
  EXPECT_EQ(d.list(), want);
}

// Export: what an older checkpoint in the folder leaves must never be read instead.
flux2::Config tiny() {
  flux2::Config c;
  EXPECT_TRUE(flux2::builtin_config("tiny", &c));
  return c;
}

void export_tiny(const std::string& dir, float scale, int64_t shard_bytes,
                 std::vector<std::vector<float>>* keep) {
  const flux2::Config c = tiny();
  std::vector<TensorToWrite> list;
  keep->clear();
  keep->reserve(flux2::weight_table(c).size());
  for (const ExpectedTensor& e : flux2::weight_table(c)) {
    keep->push_back(test::randn(shape_numel(e.shape), keep->size() + 1, scale));
    list.push_back({e.name, DType::kF32, e.shape, keep->back().data()});
  }
  write_diffusers_folder(dir, c.to_json(), list, shard_bytes);
}

// The loader reads exactly the tensors of the latest export.
void expect_reads(const std::string& dir, const std::vector<std::vector<float>>& keep) {
  const CheckpointScan scan = scan_checkpoint(dir);
  const CheckpointReader reader(scan);
  const auto table = flux2::weight_table(tiny());
  ASSERT_EQ(table.size(), keep.size());
  for (size_t i = 0; i < table.size(); ++i) {
    const Tensor t = reader.get(table[i].name);
    ASSERT_EQ(t.numel(), static_cast<int64_t>(keep[i].size()));
    ASSERT_TRUE(test::bit_equal(t.f32(), keep[i].data(), t.numel())) << table[i].name;
  }
}

TEST(AtomicWrite, ExportOverAnOlderCheckpointLeavesNothingStale) {
  TempDir d;
  const std::string dir = d.file("m");
  const std::string index = "diffusion_pytorch_model.safetensors.index.json";
  const std::string single = "diffusion_pytorch_model.safetensors";
  std::vector<std::vector<float>> keep;
  // Sharded (many shards), then single: the old index would shadow the new file.
  export_tiny(dir, 0.1f, 20000, &keep);
  const size_t many = d.list("m").size();
  ASSERT_GT(many, 4u);
  export_tiny(dir, 0.2f, int64_t{1} << 40, &keep);
  EXPECT_EQ(d.list("m"), (std::vector<std::string>{"config.json", single}));
  expect_reads(dir, keep);
  // Single, then sharded: the single file goes.
  export_tiny(dir, 0.3f, 20000, &keep);
  std::vector<std::string> names = d.list("m");
  EXPECT_EQ(names.size(), many);
  EXPECT_TRUE(std::count(names.begin(), names.end(), index));
  EXPECT_FALSE(std::count(names.begin(), names.end(), single));
  expect_reads(dir, keep);
  // Many shards, then fewer: shards of the older count go.
  export_tiny(dir, 0.4f, 60000, &keep);
  names = d.list("m");
  EXPECT_LT(names.size(), many);
  for (const std::string& n : names) {
    if (n.find("-of-") == std::string::npos) continue;
    const std::string count = n.substr(n.find("-of-") + 4, 5);
    for (const std::string& m : names) {
      if (m.find("-of-") != std::string::npos) EXPECT_EQ(m.substr(m.find("-of-") + 4, 5), count);
    }
  }
  expect_reads(dir, keep);
  // The public export does the same.
  Flux2Transformer::write_builtin("tiny", 3, "f32", dir);
  EXPECT_EQ(d.list("m"), (std::vector<std::string>{"config.json", single}));
  (void)Flux2Transformer::load(dir);
}

TEST(AtomicWrite, FailedExportKeepsTheOldConfig) {
  TempDir d;
  const std::string dir = d.file("m");
  std::vector<std::vector<float>> keep;
  export_tiny(dir, 0.1f, int64_t{1} << 40, &keep);
  const std::string config = read(d.file("m/config.json"));
  const std::string weights = read(d.file("m/diffusion_pytorch_model.safetensors"));
  {
    FileSizeLimit limit(16 * 1024);
    expect_error([&] { export_tiny(dir, 0.2f, int64_t{1} << 40, &keep); },
                 {"diffusion_pytorch_model.safetensors", "File too large"});
  }
  EXPECT_EQ(read(d.file("m/config.json")), config);
  EXPECT_EQ(read(d.file("m/diffusion_pytorch_model.safetensors")), weights);
  EXPECT_EQ(d.list("m"),
            (std::vector<std::string>{"config.json", "diffusion_pytorch_model.safetensors"}));
}

}  // namespace
}  // namespace flowkv
