// flowkv serve: an OpenAI-compatible images server over one diffusers pipeline folder
// (docs/serving.md). Uses the public API (include/flowkv) and cpp-httplib only.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "flowkv/pipeline.h"
#include "request.h"

namespace flowkv::server {

struct ServeOptions {
  std::string model;     // the pipeline folder
  std::string model_id;  // the id /v1/models lists; "": the folder's name
  // The pipeline opened once at start: resident keeps the text encoder, VAE and transformer
  // loaded after first use (a server's default); staged loads each per request and releases
  // it (peak memory: the largest stage); auto picks by the memory the weights take.
  MemoryPolicy memory = MemoryPolicy::kResident;
  std::string dtype = "auto";  // the transformer's compute type, fixed for the server
  std::string host = "127.0.0.1";
  int port = 8080;  // 0: any free port (the first stdout line says which)
  int workers = 1;  // requests generating at once
  int queue = 8;    // requests waiting for a worker beyond those
  int64_t store_ram = int64_t{2} << 30;
  std::string store_disk;
  int64_t max_body = int64_t{32} << 20;  // every transfer encoding, counted as it is read
  RequestLimits limits;
  // Bearer keys a request must carry (Authorization: Bearer KEY) on every route but /health;
  // empty: no authentication (a warning when the server listens beyond loopback).
  std::vector<std::string> api_keys;
  double header_timeout_seconds = 10;  // request line and headers, from their first byte
  double timeout_seconds = 600;
  double shutdown_grace_seconds = 30;
  int64_t memory_budget = 0;  // bytes reserved for running requests at once; 0: no admission
};

// The API keys from --api-key values, an --api-key-file (one a line, '#' comments; refused when
// it is not a regular file, is over 1 MiB, or others can read it) and FLOWKV_API_KEY (`env`,
// may be null; keys separated by commas). Throws flowkv::Error naming the problem; keys are
// printable ASCII without spaces, at least 16 characters.
std::vector<std::string> collect_api_keys(const std::vector<std::string>& given,
                                          const std::string& file, const char* env);

// Serves until SIGTERM or SIGINT, then shuts down gracefully; returns the exit status (0).
// Throws flowkv::Error when it cannot start (bad folder, address in use).
int serve(const ServeOptions& options);

}  // namespace flowkv::server
