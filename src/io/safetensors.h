// safetensors files: an 8-byte little-endian header length, a JSON header naming each tensor's
// dtype, shape and [begin, end) byte range in the data section, then the data.
// Every field is validated before any tensor is touched; a bad file is one clear Error.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "flowkv/tensor.h"
#include "io/mapped_file.h"

namespace flowkv {

struct TensorInfo {
  std::string name;
  std::string dtype_name;  // as written in the file ("F32", "BF16", "I64", ...)
  bool dtype_known = false;
  DType dtype = DType::kF32;
  Shape shape;
  int64_t begin = 0;  // offsets relative to the data section
  int64_t end = 0;
  std::string file;  // path of the file holding it
};

struct SafetensorsHeader {
  std::string path;
  int64_t data_start = 0;  // 8 + header length
  int64_t file_size = 0;
  std::vector<TensorInfo> tensors;  // sorted by begin offset
  std::map<std::string, std::string> metadata;
};

// Reads and validates only the header (no data is read): used by `inspect`.
SafetensorsHeader read_safetensors_header(const std::string& path);

// A validated, memory-mapped file.
class SafetensorsFile {
 public:
  static SafetensorsFile open(const std::string& path);
  const SafetensorsHeader& header() const { return header_; }
  // A tensor viewing the mapped data (kept alive by the map). Unsupported dtypes fail.
  Tensor view(const TensorInfo& info) const;
  // Drops the resident mapped pages of a tensor (see MappedFile::release); views stay valid.
  void release(const TensorInfo& info) const;
  void release_all() const;

 private:
  SafetensorsHeader header_;
  std::shared_ptr<MappedFile> map_;
};

// Parses a header from its bytes; exposed for fuzz tests.
SafetensorsHeader parse_safetensors_header(const std::string& path, const std::string& prefix,
                                           int64_t file_size);

struct TensorToWrite {
  std::string name;
  DType dtype = DType::kF32;
  Shape shape;
  const void* data = nullptr;  // nullptr: leave the bytes as a hole (a sparse file of zeros)
};

// Writes a safetensors file atomically (a temporary file renamed into place), so a failed
// write leaves nothing behind.
void write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

}  // namespace flowkv
