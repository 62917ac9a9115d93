// Reading and writing files safely.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include "flowkv/dtype.h"

namespace flowkv {

// Reads a whole file named by a user (prompts files, images, JSON configs, tokenizers): the
// one reader for them. The path is opened with O_NONBLOCK, so a FIFO cannot block the open,
// and must be a regular file: a FIFO, device (/dev/zero), socket or folder is an Error naming
// the path and what it is, before any byte is read. A file of more than max_bytes is refused
// before anything is read or allocated; then exactly the size fstat gave is read, and a file
// that grows or shrinks meanwhile is an Error. Errors read "<what> <path>: ..." (`what` may be
// empty: "image", "--prompts file").
std::string read_file(const std::string& path, int64_t max_bytes, const std::string& what = "");

// Writes `bytes` to `path` atomically: readers (and a crash) see the old file or the whole new
// one. The bytes go to a temporary file in the same folder, every write is checked, the file
// is fsynced and renamed over `path`, and the folder is fsynced. On failure (full disk, no
// permission, `path` is a folder) the temporary file is removed, an existing file at `path` is
// left intact, and a flowkv::Error names `path` and the reason. The temporary
// ("<path>.tmp-flowkv-<pid>-<n>") is created with mode 0600 and given 0666 less the umask on
// commit; a write removes the temporaries of `path` whose writer process no longer exists
// (killed mid-write), so a crash leaves nothing the next write of the file does not clean up.
// A target that exists and is not a regular file (a symbolic link, even a dangling one, a
// device, a FIFO, a folder) is refused the same way and left as it is: a rename would replace
// the link itself or, as root, the device node.
void write_file_atomic(const std::string& path, std::string_view bytes);
// The check write_file_atomic makes of its target, for a command to make before its work:
// an Error naming `path` and what it is, unless it is absent or a regular file.
void check_replaceable(const std::string& path);

// What quantize_checkpoint wrote.
struct QuantizeReport {
  int64_t tensors = 0;
  int64_t quantized = 0;  // tensors written as the requested type
  int64_t fallback = 0;   // 2-D tensors whose rows are not whole blocks of it (Q8_0 or F16)
  int64_t bytes_in = 0;   // tensor bytes read
  int64_t bytes_out = 0;  // tensor bytes written
};

// Writes a GGUF file from a checkpoint (a diffusers transformer or pipeline folder, a
// .safetensors file, or a .gguf file). Naming convention: every tensor keeps its name in the
// source (diffusers names for diffusers folders, BFL names for BFL single files), so the file
// loads through the same name tables. 2-D weights become `type` (F16, BF16 or a GGUF quantized
// type), ggml's reference quantizers; a matrix whose rows are not whole blocks of `type` falls
// back to Q8_0, then F16. Everything else (norm scales, biases) is F32. The source's
// config.json, when it has one, travels as the metadata string "flowkv.config", with
// general.architecture = the detected family. Written atomically; progress(done, total) is
// called after each tensor.
QuantizeReport quantize_checkpoint(const std::string& in, const std::string& out, DType type,
                                   const std::function<void(int64_t, int64_t)>& progress = {});

}  // namespace flowkv
