// Atomic file writes: readers (and a crash) see the old file or the whole new one, never a
// part. The bytes go to a uniquely named temporary file in the target's folder; every write is
// checked; the file is fsynced, renamed over the target and the folder fsynced. On any failure
// the temporary file is removed, the target is left as it was, and a flowkv::Error names the
// target and the system's reason.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "flowkv/io.h"  // write_file_atomic

namespace flowkv {

// A file written in pieces, then committed. Destroying it uncommitted removes the temporary.
class AtomicFile {
 public:
  // `mode`: the committed file's permissions; -1: what a plain create gives (0666 less the
  // umask). Private data (the reference store's entries) passes 0600.
  explicit AtomicFile(std::string path, int mode = -1);
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  void write(const void* data, size_t bytes);
  void write(std::string_view bytes) { write(bytes.data(), bytes.size()); }
  // Leaves `bytes` unwritten (a hole in a sparse file; reads back as zeros).
  void skip(int64_t bytes);
  // Makes the file durable and puts it in place of the target.
  void commit();

  const std::string& path() const { return path_; }
  const std::string& temp_path() const { return tmp_; }

 private:
  [[noreturn]] void fail_with(const char* what, int err);
  void discard() noexcept;

  std::string path_, tmp_;
  int fd_ = -1;
  int64_t size_ = 0;
  bool committed_ = false;
  int mode_ = -1;
};

// Removes the temporaries `<path>.tmp-flowkv-<pid>-<n>` whose writer process is gone (what
// AtomicFile does before each write of `path`), for writers of their own temporaries under the
// same naming (the reference store's secret).
void remove_dead_writers_temps_of(const std::string& path);

// Removes a file if it exists (a missing file is not an error), then fsyncs its folder.
void remove_file_durably(const std::string& path);

}  // namespace flowkv
