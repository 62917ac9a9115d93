#include "io/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "flowkv/error.h"

namespace flowkv {

namespace {

std::string label(const std::string& what, const std::string& path) {
  return what.empty() ? path : what + " " + path;
}

void refuse_unless_regular(const struct stat& st, const std::string& what,
                           const std::string& path) {
  if (!S_ISREG(st.st_mode)) {
    fail(label(what, path), ": not a regular file (it is ", file_type_name(st.st_mode),
         "); give a file");
  }
}

// A regular file opened for reading. stat() first, so that a device or FIFO is refused without
// being opened at all (opening some devices has effects); O_NONBLOCK keeps open() from hanging
// on a FIFO swapped in after the stat; fstat() of the opened descriptor is what counts.
struct RegularFile {
  int fd = -1;
  int64_t size = 0;
  RegularFile(const std::string& path, const std::string& what) {
    struct stat st {};
    if (::stat(path.c_str(), &st) == 0) refuse_unless_regular(st, what, path);
    fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) fail("cannot open ", label(what, path), ": ", std::strerror(errno));
    if (::fstat(fd, &st) != 0) {
      const int e = errno;
      ::close(fd);
      fail("cannot stat ", label(what, path), ": ", std::strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
      ::close(fd);
      refuse_unless_regular(st, what, path);
    }
    size = st.st_size;
  }
  ~RegularFile() {
    if (fd >= 0) ::close(fd);
  }
  RegularFile(const RegularFile&) = delete;
  RegularFile& operator=(const RegularFile&) = delete;

  // Reads into buf from offset 0 until it is full or the file ends; returns the bytes read.
  size_t read_into(char* buf, size_t n, const std::string& what, const std::string& path) const {
    size_t got = 0;
    while (got < n) {
      const ssize_t r = ::pread(fd, buf + got, n - got, static_cast<off_t>(got));
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) fail("cannot read ", label(what, path), ": ", std::strerror(errno));
      if (r == 0) break;
      got += static_cast<size_t>(r);
    }
    return got;
  }
};

}  // namespace

const char* file_type_name(uint32_t st_mode) {
  switch (st_mode & S_IFMT) {
    case S_IFREG:
      return "a regular file";
    case S_IFDIR:
      return "a folder";
    case S_IFLNK:
      return "a symbolic link";
    case S_IFIFO:
      return "a FIFO (named pipe)";
    case S_IFCHR:
      return "a character device";
    case S_IFBLK:
      return "a block device";
    case S_IFSOCK:
      return "a socket";
    default:
      return "not a file";
  }
}

std::shared_ptr<MappedFile> MappedFile::open(const std::string& path) {
  const RegularFile file(path, "");
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
  const RegularFile file(path, "");
  std::string buf(static_cast<size_t>(std::clamp<int64_t>(n, 0, file.size)), '\0');
  buf.resize(file.read_into(buf.data(), buf.size(), "", path));  // shorter if the file shrank
  return buf;
}

std::string read_file(const std::string& path, int64_t max_bytes, const std::string& what) {
  const RegularFile file(path, what);
  FLOWKV_CHECK(file.size <= max_bytes, label(what, path), " is ", file.size,
               " bytes, more than the limit of ", max_bytes, " bytes");
  std::string buf(static_cast<size_t>(file.size), '\0');
  // One byte more than fstat said: a file still being written shows here.
  buf.push_back('\0');
  const size_t got = file.read_into(buf.data(), buf.size(), what, path);
  FLOWKV_CHECK(got + 1 == buf.size(), label(what, path), ": the file ",
               got < static_cast<size_t>(file.size) ? "shrank" : "grew", " while it was read (",
               file.size, " bytes when opened); read it again once nothing writes to it");
  buf.pop_back();
  return buf;
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
  return RegularFile(path, "").size;
}

}  // namespace flowkv
