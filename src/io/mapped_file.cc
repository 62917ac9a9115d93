#include "io/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "flowkv/error.h"
#include "flowkv/limits.h"

namespace flowkv {

namespace {

// Opens a regular file for reading. O_NONBLOCK keeps open() from hanging on a FIFO; the
// S_ISREG check then refuses FIFOs, devices (/dev/zero) and folders before anything is read.
struct RegularFile {
  int fd = -1;
  int64_t size = 0;
  explicit RegularFile(const std::string& path) {
    fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) fail("cannot open ", path, ": ", std::strerror(errno));
    struct stat st {};
    if (fstat(fd, &st) != 0) {
      const int e = errno;
      ::close(fd);
      fail("cannot stat ", path, ": ", std::strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
      ::close(fd);
      fail(path, ": not a regular file (a folder, device, FIFO or socket); give a file");
    }
    size = st.st_size;
  }
  ~RegularFile() {
    if (fd >= 0) ::close(fd);
  }
  RegularFile(const RegularFile&) = delete;
  RegularFile& operator=(const RegularFile&) = delete;

  // Reads up to n bytes from the start.
  std::string read_prefix(const std::string& path, int64_t n) const {
    std::string buf(static_cast<size_t>(std::min(n, size)), '\0');
    size_t got = 0;
    while (got < buf.size()) {
      const ssize_t r = ::pread(fd, buf.data() + got, buf.size() - got, static_cast<off_t>(got));
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) fail("cannot read ", path, ": ", std::strerror(errno));
      if (r == 0) break;  // the file shrank while we read it
      got += static_cast<size_t>(r);
    }
    buf.resize(got);
    return buf;
  }
};

}  // namespace

std::shared_ptr<MappedFile> MappedFile::open(const std::string& path) {
  const RegularFile file(path);
  std::shared_ptr<MappedFile> f(new MappedFile());
  f->path_ = path;
  f->size_ = file.size;
  if (file.size > 0) {
    void* p = mmap(nullptr, static_cast<size_t>(file.size), PROT_READ, MAP_PRIVATE, file.fd, 0);
    if (p == MAP_FAILED) fail("cannot map ", path, ": ", std::strerror(errno));
    f->data_ = static_cast<const std::byte*>(p);
  }
  return f;
}

void MappedFile::release(int64_t offset, int64_t n) const {
  if (!data_ || n <= 0 || offset < 0 || offset >= size_) return;
  static const int64_t page = sysconf(_SC_PAGESIZE);
  const int64_t begin = offset / page * page;
  const int64_t end = std::min(size_, offset + std::min(n, size_ - offset));
  // Advice only: a failure leaves the pages resident, which costs memory, not correctness.
  (void)madvise(const_cast<std::byte*>(data_) + begin, static_cast<size_t>(end - begin),
                MADV_DONTNEED);
}

MappedFile::~MappedFile() {
  if (data_) munmap(const_cast<std::byte*>(data_), static_cast<size_t>(size_));
}

std::string read_file_prefix(const std::string& path, int64_t n) {
  return RegularFile(path).read_prefix(path, n);
}

std::string read_text_file(const std::string& path) {
  const RegularFile file(path);
  FLOWKV_CHECK(file.size <= limits::kMaxJsonFileBytes, path, ": ", file.size,
               " bytes is larger than the ", limits::kMaxJsonFileBytes,
               "-byte limit for a text file flowkv reads whole");
  return file.read_prefix(path, file.size);
}

PathKind path_kind(const std::string& path) {
  struct stat st {};
  if (stat(path.c_str(), &st) != 0) {
    if (errno == ENOENT || errno == ENOTDIR) return PathKind::kNone;
    fail(path, ": ", std::strerror(errno));
  }
  if (S_ISREG(st.st_mode)) return PathKind::kFile;
  return S_ISDIR(st.st_mode) ? PathKind::kFolder : PathKind::kOther;
}

int64_t file_size(const std::string& path) {
  return RegularFile(path).size;
}

}  // namespace flowkv
