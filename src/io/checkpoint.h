// Checkpoint discovery: a diffusers-format transformer folder (config.json plus one
// safetensors file or a sharded set with its index), a pipeline folder holding one
// (`transformer/`), a single .safetensors file (the original BFL layout, no config), or a single
// .gguf file (ggml's format, possibly block-quantized; no config, the tensor names tell).
// `scan_checkpoint` reads headers only; `CheckpointReader` maps the data.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "flowkv/tensor.h"
#include "io/gguf.h"
#include "io/json.h"
#include "io/safetensors.h"

namespace flowkv {

struct CheckpointScan {
  std::string path;                           // the transformer folder, or the single file
  bool single_file = false;                   // a lone .safetensors or .gguf (no config.json)
  std::shared_ptr<const GgufHeader> gguf;     // a lone .gguf: its header (metadata, tensors)
  std::optional<Json> config;                 // config.json, when the folder has one
  std::vector<std::string> files;             // safetensors files, in shard order
  std::map<std::string, TensorInfo> tensors;  // every tensor of every file, by name
  std::vector<std::string> problems;          // non-fatal findings (reported by inspect)
};

// Strict: the first unreadable file, index or config is an Error. Lenient (inspect): every
// such problem is recorded in `problems` and the rest is still scanned.
CheckpointScan scan_checkpoint(const std::string& path, bool lenient = false);

// Writes a diffusers-format folder: config.json and the tensors, in one file or, past
// max_shard_bytes, as numbered shards with their index. Files are written atomically; a tensor
// with data == nullptr becomes a hole in a sparse file.
void write_diffusers_folder(const std::string& dir, const Json& config,
                            const std::vector<TensorToWrite>& tensors,
                            int64_t max_shard_bytes = int64_t{5} << 30);

// What a model expects to find: its one name table.

struct ExpectedTensor {
  std::string name;
  Shape shape;
};

// A folder of the table's tensors, every one all zeros of `dtype` (holes of sparse files).
void write_zero_folder(const std::string& dir, const Json& config,
                       const std::vector<ExpectedTensor>& table, DType dtype);

// Checks the bytes the table's weights will occupy once loaded (`held_bytes` of each: packed f32,
// or as stored) against the memory budget before anything is packed; `what` names the model.
void check_weights_fit(const std::vector<ExpectedTensor>& table,
                       const std::function<int64_t(const ExpectedTensor&)>& held_bytes,
                       const std::string& what);

// Compares the files with the table. Returns one line per problem (missing, unexpected,
// wrong shape, a dtype flowkv cannot read, a block-quantized dtype on a tensor that is not a
// 2-D weight); empty when everything matches. Quantized 2-D weights (GGUF) are accepted.
std::vector<std::string> check_against_table(const std::map<std::string, TensorInfo>& tensors,
                                             const std::vector<ExpectedTensor>& expected);

// One more than the largest block index among tensor names "<prefix><index>.<...>" (0 when
// none): the block count of a checkpoint without a config. An index beyond flowkv's block limit
// is an Error naming the tensor.
int64_t count_blocks(const std::map<std::string, TensorInfo>& tensors, const std::string& prefix);

// The tensor of that name, or nullptr.
const TensorInfo* find_tensor(const std::map<std::string, TensorInfo>& tensors,
                              const std::string& name);

// Joins problem lines into one error message, listing at most `max_lines` of them.
std::string format_problems(const std::string& headline, const std::vector<std::string>& lines,
                            size_t max_lines = 40);

// Maps the files of a scan and hands out tensor views. For a GGUF scan the names are the keys of
// scan.tensors, which a loader may have renamed (TensorInfo::name keeps the stored name).
//
// Residency: loaders consume tensors one at a time (pack a copy, or keep the view). Each get()
// drops the resident mapped pages of the tensor the previous get() returned, and the reader's
// destructor drops all of them, so a load never holds a packed copy and its source pages
// together beyond one tensor. Views stay valid: dropped pages fault back in from the file.
class CheckpointReader {
 public:
  explicit CheckpointReader(const CheckpointScan& scan);
  ~CheckpointReader();
  CheckpointReader(const CheckpointReader&) = delete;
  CheckpointReader& operator=(const CheckpointReader&) = delete;
  Tensor get(const std::string& name) const;
  bool has(const std::string& name) const { return index_.count(name) > 0; }

 private:
  std::vector<SafetensorsFile> files_;
  std::shared_ptr<const GgufFile> gguf_;  // a lone .gguf instead of safetensors files
  std::map<std::string, std::pair<size_t, TensorInfo>> index_;
  mutable const std::pair<size_t, TensorInfo>* last_ = nullptr;
};

}  // namespace flowkv
