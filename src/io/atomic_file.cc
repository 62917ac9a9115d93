#include "io/atomic_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "flowkv/error.h"

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

}  // namespace

AtomicFile::AtomicFile(std::string path) : path_(std::move(path)) {
  FLOWKV_CHECK(!path_.empty() && path_.back() != '/', "cannot write '", path_,
               "': not a file name");
  // A name no other writer (thread or process) uses: pid and a process-wide counter, and
  // O_EXCL in case a stale file from a crashed run holds it.
  static std::atomic<uint64_t> counter{0};
  for (int attempt = 0;; ++attempt) {
    tmp_ = path_ + ".tmp-flowkv-" + std::to_string(::getpid()) + "-" +
           std::to_string(counter.fetch_add(1));
    fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
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
  if (::fsync(fd_) != 0) fail_with("cannot sync", errno);
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
