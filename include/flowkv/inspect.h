// `flowkv inspect`: what a checkpoint is and what is wrong with it, from its headers alone
// (no weight is read, so a real-size checkpoint inspects in milliseconds), and optionally from
// its values (NaN and infinity).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace flowkv {

// One component of a pipeline folder (model_index.json): its class and what its files hold.
struct ComponentReport {
  std::string name;        // "transformer", "text_encoder", "tokenizer", "vae", "scheduler"
  std::string class_name;  // as model_index.json names it
  int64_t parameters = 0;
  std::map<std::string, int64_t> bytes_by_dtype;  // weights as stored
  std::string note;  // what else is known ("tokenizer.json 11.4 MB", "missing", ...)
};

struct InspectReport {
  std::string path;
  std::string layout;   // "diffusers folder", "diffusers folder, N shards", "BFL single file",
                        // "single .gguf file"
  std::string family;   // "FLUX.2", or "unknown"
  std::string variant;  // e.g. "FLUX.2 Klein 9B (or Klein 9B KV: same architecture)"
  int64_t files = 0;
  int64_t tensors = 0;
  int64_t parameters = 0;
  std::map<std::string, int64_t> bytes_by_dtype;
  std::map<std::string, int64_t> tensors_by_dtype;  // tensor count per stored type
  // A GGUF file's metadata, one "key = value" line each (long arrays abbreviated).
  std::vector<std::string> metadata;
  std::string config_json;  // the config in effect (from config.json, or inferred from shapes)
  // Memory to load and run it (predicted, nothing loaded): the weights as flowkv holds them
  // (f32 packed; bf16, f16 and GGUF blocks as stored), and one request (memory_request): its KV
  // caches and its activations. Load and requests are refused over the memory budget.
  int64_t held_weight_bytes = 0;
  std::string memory_request;
  int64_t request_kv_bytes = 0, request_activation_bytes = 0;
  bool config_inferred = false;
  // A pipeline folder: its class and every component (the transformer's figures are the
  // report's own), and whether they fit together (mismatches are problems).
  std::string pipeline_class;
  std::vector<ComponentReport> components;
  std::vector<std::string> problems;  // every problem found; empty when the files are sound
  bool ok() const { return problems.empty(); }
};

struct InspectOptions {
  // Also read every weight and report each tensor holding NaN or infinity (reads the whole
  // checkpoint: seconds per GB instead of milliseconds).
  bool check_values = false;
};

InspectReport inspect(const std::string& path, const InspectOptions& opts = {});
std::string format_report(const InspectReport& r);

}  // namespace flowkv
