#include "io/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "flowkv/error.h"

namespace flowkv {

std::shared_ptr<MappedFile> MappedFile::open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail("cannot open ", path, ": ", std::strerror(errno));
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    const int e = errno;
    ::close(fd);
    fail("cannot stat ", path, ": ", std::strerror(e));
  }
  std::shared_ptr<MappedFile> f(new MappedFile());
  f->path_ = path;
  f->size_ = st.st_size;
  if (st.st_size > 0) {
    void* p = mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      const int e = errno;
      ::close(fd);
      fail("cannot map ", path, ": ", std::strerror(e));
    }
    f->data_ = static_cast<const std::byte*>(p);
  }
  ::close(fd);
  return f;
}

MappedFile::~MappedFile() {
  if (data_) munmap(const_cast<std::byte*>(data_), static_cast<size_t>(size_));
}

std::string read_file_prefix(const std::string& path, int64_t n) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("cannot open ", path, ": ", std::strerror(errno));
  std::string buf(static_cast<size_t>(n), '\0');
  in.read(buf.data(), n);
  buf.resize(static_cast<size_t>(in.gcount()));
  return buf;
}

std::string read_text_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("cannot open ", path, ": ", std::strerror(errno));
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

int64_t file_size(const std::string& path) {
  struct stat st {};
  if (stat(path.c_str(), &st) != 0) fail("cannot stat ", path, ": ", std::strerror(errno));
  return st.st_size;
}

}  // namespace flowkv
