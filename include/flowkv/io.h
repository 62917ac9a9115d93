// Writing files safely.
#pragma once

#include <string>
#include <string_view>

namespace flowkv {

// Writes `bytes` to `path` atomically: readers (and a crash) see the old file or the whole new
// one. The bytes go to a temporary file in the same folder, every write is checked, the file
// is fsynced and renamed over `path`, and the folder is fsynced. On failure (full disk, no
// permission, `path` is a folder) the temporary file is removed, an existing file at `path` is
// left intact, and a flowkv::Error names `path` and the reason.
void write_file_atomic(const std::string& path, std::string_view bytes);

}  // namespace flowkv
