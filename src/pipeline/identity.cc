#include "pipeline/identity.h"

#include <sys/stat.h>

#include <algorithm>
#include <filesystem>
#include <vector>

#include "flowkv/error.h"
#include "flowkv/limits.h"
#include "io/mapped_file.h"

namespace flowkv::pipeline {

namespace fs = std::filesystem;

namespace {

constexpr int64_t kHeadBytes = 64 << 10;

void add_file(store::KeyBuilder& key, const fs::path& p, const std::string& name) {
  struct stat st {};
  FLOWKV_CHECK(::stat(p.c_str(), &st) == 0, p.string(), ": cannot be read");
  if (p.extension() == ".json") {
    // The whole text, read (and checked regular, within the limit) by the one reader.
    const std::string text = read_file(p.string(), limits::kMaxJsonFileBytes);
    key.text("file", name).integer("size", static_cast<int64_t>(text.size())).text("json", text);
    return;
  }
  key.text("file", name).integer("size", static_cast<int64_t>(st.st_size));
  key.integer("mtime", static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec);
  key.text("head", read_file_prefix(p.string(), kHeadBytes));
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
