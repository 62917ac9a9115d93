// Shared helpers of the libFuzzer targets: a per-process scratch folder under /tmp, file
// writers, and the one rule every target follows: a flowkv::Error is the expected answer to a
// hostile input; any other exception is a bug (a foreign exception escaped the boundary), so
// the target terminates and libFuzzer saves the input.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "flowkv/error.h"

namespace flowkv::fuzz {

namespace fs = std::filesystem;

// /tmp/flowkv-fuzz-<name>-<pid>, created on first use and removed at normal exit.
class ScratchDir {
 public:
  explicit ScratchDir(const std::string& name)
      : path_(fs::temp_directory_path() /
              ("flowkv-fuzz-" + name + "-" + std::to_string(static_cast<long>(getpid())))) {
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~ScratchDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

inline void write_file(const fs::path& p, const void* data, size_t size) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f.write(static_cast<const char*>(data), static_cast<std::streamsize>(size));
  if (!f) {
    std::fprintf(stderr, "fuzz harness: cannot write %s\n", p.c_str());
    std::abort();
  }
}

inline void write_file(const fs::path& p, const std::string& s) {
  write_file(p, s.data(), s.size());
}

// Little-endian unsigned integer of `n` bytes at `data` (the input formats' length fields).
inline uint64_t read_le(const uint8_t* data, int n) {
  uint64_t v = 0;
  for (int i = n - 1; i >= 0; --i) v = (v << 8) | data[i];
  return v;
}

// Runs `fn`; a flowkv::Error is swallowed (the expected outcome). Any other exception finds no
// handler anywhere (neither here nor in libFuzzer), so std::terminate runs at the throw site,
// before any unwinding: the report names the exception (libstdc++'s terminate handler prints its
// type and what()) and the stack shows who threw it. (A noexcept wrapper or a catch-all would
// unwind first and lose that stack.)
template <class Fn>
void expect_only_flowkv_errors(Fn&& fn) {
  try {
    fn();
  } catch (const Error&) {
    // expected: a clear error naming the input
  }
}

// An invariant the code under test promises after a successful call; a violation aborts.
#define FUZZ_ASSERT(cond, ...)                                       \
  do {                                                               \
    if (!(cond)) {                                                   \
      std::fprintf(stderr, "\n*** invariant violated: %s: ", #cond); \
      std::fprintf(stderr, __VA_ARGS__);                             \
      std::fprintf(stderr, "\n");                                    \
      std::abort();                                                  \
    }                                                                \
  } while (0)

}  // namespace flowkv::fuzz
