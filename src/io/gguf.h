// GGUF files (ggml / llama.cpp, versions 2 and 3; docs/gguf.md in ggml): a little-endian header
// (magic "GGUF", version, tensor count, metadata count), typed metadata key/values, tensor infos
// (name, dims in ggml order, ggml type, offset into the data section), padding to
// general.alignment (default 32), then the data section.
// Every field is validated before use, and no size read from the file is allocated before it is
// checked against the bytes that remain; a bad file is one flowkv::Error naming the file and field.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "io/mapped_file.h"
#include "io/safetensors.h"  // TensorInfo, TensorToWrite

namespace flowkv {

enum class GgufType : uint32_t {
  kU8 = 0,
  kI8 = 1,
  kU16 = 2,
  kI16 = 3,
  kU32 = 4,
  kI32 = 5,
  kF32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kU64 = 10,
  kI64 = 11,
  kF64 = 12,
};
std::string_view gguf_type_name(GgufType t);

// One metadata value. Scalars: integers (and bool) in `i` (signed types and bool) or `u`
// (unsigned types), floats in `f`, a string in `s`. Arrays (type kArray, elements of
// `array_type`, never nested): the matching vector `ai`, `au`, `af` or `as`.
struct GgufValue {
  GgufType type = GgufType::kU8;
  GgufType array_type = GgufType::kU8;
  int64_t i = 0;
  uint64_t u = 0;
  double f = 0;
  std::string s;
  std::vector<int64_t> ai;
  std::vector<uint64_t> au;
  std::vector<double> af;
  std::vector<std::string> as;

  static GgufValue string(std::string v);
  static GgufValue u32(uint32_t v);
  static GgufValue u64(uint64_t v);
  static GgufValue i32(int32_t v);
  static GgufValue f32(float v);
  static GgufValue boolean(bool v);
  static GgufValue strings(std::vector<std::string> v);
  static GgufValue i32s(std::vector<int64_t> v);

  int64_t array_size() const;
  // Short display ("42", "\"text\"", "[1, 2, 3, ... 150000 items]").
  std::string summary(int max_items = 8) const;
};

using GgufMetadata = std::vector<std::pair<std::string, GgufValue>>;

struct GgufHeader {
  std::string path;
  uint32_t version = 3;
  int64_t alignment = 32;  // general.alignment
  int64_t data_start = 0;  // absolute offset of the data section
  int64_t file_size = 0;
  GgufMetadata metadata;            // in file order
  std::vector<TensorInfo> tensors;  // in file order; begin/end relative to data_start,
                                    // shape in PyTorch order (ggml's dims reversed)
  const GgufValue* find(std::string_view key) const;
};

// The name of a ggml type id ("Q4_K", "IQ2_XXS", ...; "type 99" for an id ggml does not have).
std::string ggml_type_name(uint32_t id);
// The ggml type id of a DType.
uint32_t ggml_type_of(DType t);

// Parses and validates a GGUF header from the first `size` bytes of a file of `file_size`
// bytes (tensor ranges are checked against file_size). Exposed for fuzz tests.
GgufHeader parse_gguf_header(const std::string& path, const void* data, int64_t size,
                             int64_t file_size);

// Reads and validates the header of a file (maps it; tensor data is not read).
GgufHeader read_gguf_header(const std::string& path);

// A validated, memory-mapped GGUF file.
class GgufFile {
 public:
  static GgufFile open(const std::string& path);
  const GgufHeader& header() const { return header_; }
  // A tensor viewing the mapped data (kept alive by the map), in its stored type.
  Tensor view(const TensorInfo& info) const;
  // The tensor of that name; fails naming it when there is none.
  Tensor view(std::string_view name) const;
  // Drops the resident mapped pages of a tensor, or of the whole file (MappedFile::release);
  // views stay valid.
  void release(const TensorInfo& info) const;
  void release_all() const;

 private:
  GgufHeader header_;
  std::shared_ptr<MappedFile> map_;
};

// ggml allows 4 dimensions. write_gguf stores a tensor of 5 to 8 (a Conv3d weight) folded to 4,
// its leading sizes multiplied into one and the innermost three kept (rows unchanged), and
// records its PyTorch shape as metadata "flowkv.shape.<tensor name>" (an INT64 array);
// parse_gguf_header checks that key against the stored tensor and restores the shape, so flowkv
// reads the tensor back as written (other readers see the folded 4-D tensor).
inline constexpr const char* kGgufShapeKey = "flowkv.shape.";

// Writes a GGUF v3 file atomically (a temporary renamed into place). Metadata keys must be
// unique; general.alignment, if given, must be a power-of-two U32 and sets the data alignment.
// Tensor shapes are in PyTorch order (written reversed, ggml order; more than 4 dimensions
// folded as above); quantized tensors hold dtype_bytes(dtype, numel) bytes of ggml blocks.
void write_gguf(const std::string& path, const GgufMetadata& metadata,
                const std::vector<TensorToWrite>& tensors);

}  // namespace flowkv
