// Helpers of the file and bad-input tests: a temporary folder removed with its contents, whole
// files read and written, and an expectation that a call fails with a flowkv::Error whose
// message holds given fragments.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <sstream>
#include <string>
#include <vector>

#include "flowkv/error.h"

namespace flowkv::test {

class TempDir {
 public:
  TempDir() {
    path_ = std::filesystem::temp_directory_path() /
            ("flowkv_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter_++));
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string file(const std::string& name) const { return (path_ / name).string(); }
  const std::filesystem::path& path() const { return path_; }
  // Every entry of the folder (or of a subfolder), sorted.
  std::vector<std::string> list(const std::string& sub = "") const {
    std::vector<std::string> names;
    for (const auto& e : std::filesystem::directory_iterator(path_ / sub)) {
      names.push_back(e.path().filename().string());
    }
    std::sort(names.begin(), names.end());
    return names;
  }

 private:
  std::filesystem::path path_;
  static inline int counter_ = 0;
};

inline void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

inline std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// A safetensors file's bytes: the 8-byte length, the header text, `data_bytes` zero bytes.
inline std::string safetensors_bytes(const std::string& header, size_t data_bytes) {
  std::string s(8, '\0');
  const uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) s[static_cast<size_t>(i)] = static_cast<char>(n >> (8 * i));
  return s + header + std::string(data_bytes, '\0');
}

// Expects an Error whose message contains every fragment (any other exception fails the test).
template <class Fn>
void expect_error(Fn&& fn, std::initializer_list<std::string> fragments) {
  try {
    fn();
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    for (const std::string& f : fragments) {
      EXPECT_NE(std::string(e.what()).find(f), std::string::npos)
          << "message \"" << e.what() << "\" lacks \"" << f << "\"";
    }
  }
}

}  // namespace flowkv::test
