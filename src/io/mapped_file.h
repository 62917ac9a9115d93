// Read-only memory map of a whole file. Shared ownership: tensors that point into the map hold
// a reference, so the map lives as long as any of them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "flowkv/io.h"  // read_file

namespace flowkv {

class MappedFile {
 public:
  static std::shared_ptr<MappedFile> open(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const std::byte* data() const { return data_; }
  int64_t size() const { return size_; }
  const std::string& path() const { return path_; }
  // Drops the process's resident pages of bytes [offset, offset + n) (rounded out to whole
  // pages). Safe at any time: the map is read-only and file-backed, so a later read faults the
  // same bytes back in from the file. Loading calls it once a tensor is consumed, so packed
  // copies and the mapped pages they came from are not resident together.
  void release(int64_t offset, int64_t n) const;

 private:
  MappedFile() = default;
  std::string path_;
  const std::byte* data_ = nullptr;
  int64_t size_ = 0;
};

// read_file (flowkv/io.h) is the one reader of files named by a user; these open the same way
// (a FIFO, device, socket or folder is an Error naming the path and what it is).
// At most `n` bytes from the start of a file, without mapping it (checkpoint headers).
std::string read_file_prefix(const std::string& path, int64_t n);
// The size of a regular file (anything else is an Error, as above).
int64_t file_size(const std::string& path);

// "a FIFO", "a symbolic link", "a character device", ... for a stat st_mode (error messages).
const char* file_type_name(uint32_t st_mode);

// What a path is, without exceptions other than flowkv::Error: a path that cannot be examined
// (a symlink loop, no permission) is an Error naming it; only "does not exist" is kNone.
enum class PathKind { kNone, kFile, kFolder, kOther };
PathKind path_kind(const std::string& path);
inline bool path_exists(const std::string& path) {
  return path_kind(path) != PathKind::kNone;
}

}  // namespace flowkv
