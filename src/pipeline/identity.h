// The identity of weights on disk, for the reference store's keys: what decides a component's
// outputs without reading all of its bytes. A folder's (or file's) files, recursively, in name
// order: JSON files (configs, tokenizers, model_index.json) whole; every other file by its name,
// size, modification time (nanoseconds) and first 64 KiB (a safetensors or GGUF header, which
// names every tensor with its offset). Rewriting a weight file changes its time, so a new
// revision gets new keys; two copies of the same files in different places share keys.
#pragma once

#include <string>

#include "cache/ref_store.h"

namespace flowkv::pipeline {

// Adds `path`'s identity to a key under `label`.
void add_files_identity(store::KeyBuilder& key, const std::string& label, const std::string& path);

// A component's identity as a hex digest: its files and the type it computes in.
std::string component_identity(const std::string& path, const std::string& compute);

}  // namespace flowkv::pipeline
