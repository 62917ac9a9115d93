// What the VAEs (FLUX.2's and Qwen-Image-2.1's) share when they load: the vae/ folder of a
// pipeline, and the tensor infos of in-memory weights for the same name-table check a scan gets.
#pragma once

#include <filesystem>
#include <map>
#include <string>

#include "flowkv/tensor.h"
#include "io/checkpoint.h"

namespace flowkv {

// `path` itself, or its vae/ when `path` is a pipeline folder (scan_checkpoint alone would pick
// transformer/).
inline std::string vae_folder(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::exists(fs::path(path) / "config.json", ec) &&
      fs::exists(fs::path(path) / "vae" / "config.json", ec)) {
    return (fs::path(path) / "vae").string();
  }
  return path;
}

// The infos of in-memory tensors, for check_weights (from_tensors).
inline std::map<std::string, TensorInfo> tensor_infos(
    const std::map<std::string, Tensor>& tensors) {
  std::map<std::string, TensorInfo> infos;
  for (const auto& [name, t] : tensors) {
    TensorInfo i;
    i.name = name;
    i.shape = t.shape();
    i.dtype = t.dtype();
    i.dtype_known = true;
    i.dtype_name = "F32";
    infos[name] = i;
  }
  return infos;
}

}  // namespace flowkv
