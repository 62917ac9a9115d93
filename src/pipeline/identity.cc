#include "pipeline/identity.h"

#include <sys/stat.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <vector>

#include "flowkv/error.h"
#include "flowkv/limits.h"

namespace flowkv::pipeline {

namespace fs = std::filesystem;

namespace {

constexpr std::streamsize kHeadBytes = 64 << 10;

std::string read_head(const fs::path& p, std::streamsize limit) {
  std::ifstream f(p, std::ios::binary);
  FLOWKV_CHECK(f, p.string(), ": cannot be read");
  std::string s(static_cast<size_t>(limit), '\0');
  f.read(s.data(), limit);
  s.resize(static_cast<size_t>(f.gcount()));
  return s;
}

void add_file(store::KeyBuilder& key, const fs::path& p, const std::string& name) {
  struct stat st {};
  FLOWKV_CHECK(::stat(p.c_str(), &st) == 0, p.string(), ": cannot be read");
  key.text("file", name).integer("size", static_cast<int64_t>(st.st_size));
  if (p.extension() == ".json") {
    FLOWKV_CHECK(st.st_size <= limits::kMaxJsonFileBytes, p.string(), ": ", st.st_size,
                 " bytes; JSON files of at most ", limits::kMaxJsonFileBytes, " are read");
    key.text("json", read_head(p, static_cast<std::streamsize>(st.st_size)));
    return;
  }
  key.integer("mtime", static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec);
  key.text("head", read_head(p, kHeadBytes));
}

}  // namespace

void add_files_identity(store::KeyBuilder& key, const std::string& label, const std::string& path) {
  key.text("component", label);
  std::error_code ec;
  if (!fs::is_directory(path, ec)) {
    add_file(key, path, fs::path(path).filename().string());
    return;
  }
  std::vector<std::string> names;
  for (fs::recursive_directory_iterator it(path, ec), end; !ec && it != end; it.increment(ec)) {
    if (it->is_regular_file(ec)) names.push_back(fs::relative(it->path(), path, ec).string());
  }
  FLOWKV_CHECK(!ec, path, ": cannot be listed (", ec.message(), ")");
  std::sort(names.begin(), names.end());
  key.integer("files", static_cast<int64_t>(names.size()));
  for (const std::string& n : names) add_file(key, fs::path(path) / n, n);
}

std::string component_identity(const std::string& path, const std::string& compute) {
  store::KeyBuilder key("identity");
  add_files_identity(key, "weights", path);
  key.text("compute", compute);
  return key.finish().hex();
}

}  // namespace flowkv::pipeline
