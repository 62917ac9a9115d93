#include "io/atomic_file.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <csignal>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string_view>

#include "flowkv/error.h"
#include "io/mapped_file.h"  // file_type_name

namespace flowkv {

namespace {

namespace fs = std::filesystem;

std::string folder_of(const std::string& path) {
  const fs::path parent = fs::path(path).parent_path();
  return parent.empty() ? std::string(".") : parent.string();
}

// fsync of the folder makes a rename or an unlink in it durable. Filesystems that cannot sync
// a folder answer EINVAL; there is nothing more to do on them.
int sync_folder(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return errno;
  int err = 0;
  if (::fsync(fd) != 0 && errno != EINVAL) err = errno;
  ::close(fd);
  return err;
}

// Temporaries are "<target>.tmp-flowkv-<pid>-<n>" (the reference store's start-up sweep,
// cache/ref_store_disk.cc, parses the same form).
constexpr std::string_view kTempInfix = ".tmp-flowkv-";

// The writer's pid when `name` is a temporary of the file `target_name`, else -1.
long temp_pid(std::string_view name, std::string_view target_name) {
  if (name.size() <= target_name.size() + kTempInfix.size() || !name.starts_with(target_name) ||
      name.substr(target_name.size(), kTempInfix.size()) != kTempInfix) {
    return -1;
  }
  std::string_view rest = name.substr(target_name.size() + kTempInfix.size());
  const size_t dash = rest.find('-');
  if (dash == 0 || dash == std::string_view::npos || dash > 9 || dash + 1 == rest.size()) return -1;
  long pid = 0;
  for (const char c : rest.substr(0, dash)) {
    if (c < '0' || c > '9') return -1;
    pid = pid * 10 + (c - '0');
  }
  for (const char c : rest.substr(dash + 1)) {
    if (c < '0' || c > '9') return -1;
  }
  return pid;
}

// Removes the temporaries of `path` left by writers that were killed mid-write (their process
// is gone), so that a crash leaves nothing a later write of the same file does not clean up.
// A live writer's temporary is left alone. Best effort: a folder that cannot be listed is
// not an error here (creating the new temporary reports it).
void remove_dead_writers_temps(const std::string& path) {
  const std::string dir = folder_of(path);
  const std::string name = fs::path(path).filename().string();
  DIR* d = ::opendir(dir.c_str());
  if (!d) return;
  while (const dirent* e = ::readdir(d)) {
    const long pid = temp_pid(e->d_name, name);
    if (pid <= 0 || pid == ::getpid()) continue;
    if (::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) {
      ::unlinkat(::dirfd(d), e->d_name, 0);
    }
  }
  ::closedir(d);
}

// The mode a plain create gives (0666 less the umask). The umask is read from /proc, since
// umask() can only be read by setting it, which races other threads creating files.
mode_t created_file_mode() {
  mode_t mask = 022;
  const int fd = ::open("/proc/self/status", O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    char buf[4096];
    const ssize_t n = ::read(fd, buf, sizeof(buf) - 1);
    ::close(fd);
    if (n > 0) {
      buf[n] = '\0';
      if (const char* u = std::strstr(buf, "\nUmask:"))
        mask = static_cast<mode_t>(std::strtoul(u + 8, nullptr, 8) & 0777);
    }
  }
  return static_cast<mode_t>(0666 & ~mask);
}

}  // namespace

// rename() would replace a symbolic link itself (not what it points to) and, as root, a device
// node or FIFO: such a target is refused.
void check_replaceable(const std::string& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0 || S_ISREG(st.st_mode)) return;  // absent, or a file
  fail("cannot replace ", path, ": it is ", file_type_name(st.st_mode),
       ", not a regular file; flowkv only replaces regular files (never a link, device, FIFO "
       "or folder): remove it or write to another path");
}

void remove_dead_writers_temps_of(const std::string& path) {
  remove_dead_writers_temps(path);
}

AtomicFile::AtomicFile(std::string path, int mode) : path_(std::move(path)), mode_(mode) {
  FLOWKV_CHECK(!path_.empty() && path_.back() != '/', "cannot write '", path_,
               "': not a file name");
  check_replaceable(path_);
  remove_dead_writers_temps(path_);
  // A name no other writer (thread or process) uses: pid and a process-wide counter, and
  // O_EXCL in case a stale file from a crashed run holds it. Mode 0600 until committed: no
  // one else reads a half-written file.
  static std::atomic<uint64_t> counter{0};
  for (int attempt = 0;; ++attempt) {
    tmp_ = path_ + std::string(kTempInfix) + std::to_string(::getpid()) + "-" +
           std::to_string(counter.fetch_add(1));
    fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd_ >= 0) break;
    const int err = errno;
    if (err != EEXIST || attempt >= 100) {
      fail("cannot write ", path_, ": cannot create a temporary file in ", folder_of(path_), ": ",
           std::strerror(err));
    }
  }
}

AtomicFile::~AtomicFile() {
  if (!committed_) discard();
}

void AtomicFile::discard() noexcept {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  if (!tmp_.empty()) ::unlink(tmp_.c_str());
  tmp_.clear();
}

void AtomicFile::fail_with(const char* what, int err) {
  discard();
  fail(what, " ", path_, ": ", std::strerror(err));
}

void AtomicFile::write(const void* data, size_t bytes) {
  FLOWKV_CHECK(fd_ >= 0 && !committed_, "cannot write ", path_, ": the file is closed");
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t w = ::write(fd_, p, bytes);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) fail_with("cannot write", w < 0 ? errno : ENOSPC);
    p += w;
    bytes -= static_cast<size_t>(w);
    size_ += w;
  }
}

void AtomicFile::skip(int64_t bytes) {
  FLOWKV_CHECK(fd_ >= 0 && !committed_, "cannot write ", path_, ": the file is closed");
  FLOWKV_CHECK(bytes >= 0, "cannot write ", path_, ": negative skip");
  if (bytes == 0) return;
  if (::lseek(fd_, static_cast<off_t>(bytes), SEEK_CUR) < 0) fail_with("cannot write", errno);
  size_ += bytes;
}

void AtomicFile::commit() {
  FLOWKV_CHECK(fd_ >= 0 && !committed_, "cannot write ", path_, ": the file is closed");
  // The size covers a trailing hole; fsync before rename so the new name never points at
  // data that is not on disk.
  if (::ftruncate(fd_, static_cast<off_t>(size_)) != 0) fail_with("cannot write", errno);
  const mode_t mode = mode_ >= 0 ? static_cast<mode_t>(mode_ & 07777) : created_file_mode();
  if (::fchmod(fd_, mode) != 0) fail_with("cannot write", errno);
  if (::fsync(fd_) != 0) fail_with("cannot sync", errno);
  // Checked again: a link or device put in the target's place since the start is not replaced.
  try {
    check_replaceable(path_);
  } catch (...) {
    discard();
    throw;
  }
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) fail_with("cannot write", errno);
  if (::rename(tmp_.c_str(), path_.c_str()) != 0) fail_with("cannot replace", errno);
  committed_ = true;
  tmp_.clear();
  if (const int err = sync_folder(folder_of(path_))) {
    fail("cannot sync the folder of ", path_, ": ", std::strerror(err));
  }
}

void write_file_atomic(const std::string& path, std::string_view bytes) {
  AtomicFile f(path);
  f.write(bytes);
  f.commit();
}

void remove_file_durably(const std::string& path) {
  if (::unlink(path.c_str()) != 0) {
    const int err = errno;
    if (err == ENOENT) return;
    fail("cannot remove ", path, ": ", std::strerror(err));
  }
  if (const int err = sync_folder(folder_of(path))) {
    fail("cannot sync the folder of ", path, ": ", std::strerror(err));
  }
}

}  // namespace flowkv
