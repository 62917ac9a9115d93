// flowkv serve: an OpenAI-compatible images server over one diffusers pipeline folder
// (docs/serving.md). Uses the public API (include/flowkv) and cpp-httplib only.
#pragma once

#include <cstdint>
#include <string>

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
  int queue = 16;   // requests waiting for a worker beyond those
  int64_t store_ram = int64_t{2} << 30;
  std::string store_disk;
  int64_t max_body = int64_t{64} << 20;
  RequestLimits limits;
  double timeout_seconds = 600;
  double shutdown_grace_seconds = 30;
  int64_t memory_budget = 0;  // bytes reserved for running requests at once; 0: no admission
};

// Serves until SIGTERM or SIGINT, then shuts down gracefully; returns the exit status (0).
// Throws flowkv::Error when it cannot start (bad folder, address in use).
int serve(const ServeOptions& options);

}  // namespace flowkv::server
