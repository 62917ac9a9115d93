// serve: an OpenAI-compatible images server over one pipeline folder (tools/server,
// docs/serving.md).
#include <cstdio>
#include <cstdlib>

#include "commands.h"
#include "flowkv/error.h"
#include "flowkv/limits.h"
#include "flowkv/pipeline.h"
#include "measure.h"
#include "server.h"

namespace flowkv::cli {

namespace {

struct ServeArgs {
  server::ServeOptions o;
  std::string store_ram = "2G", max_body = "32M", memory_budget, memory = "resident";
  std::vector<std::string> api_keys;
  std::string api_key_file;
};

}  // namespace

void add_serve(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "serve",
      "Serve a diffusers pipeline folder over HTTP with OpenAI's images API\n"
      "(POST /v1/images/generations, POST /v1/images/edits, streaming with server-sent events)\n"
      "plus GET /health, /v1/models and /metrics (Prometheus). The folder is opened once; with\n"
      "--memory resident (the default) its components load on the first request and stay\n"
      "loaded for every later one. Nothing is written to disk per request. Prints\n"
      "\"listening on URL\" as its first line; SIGTERM or SIGINT stop it gracefully. See\n"
      "docs/serving.md.");
  auto* a = new ServeArgs;
  server::ServeOptions& o = a->o;
  cmd->add_option("--model", o.model, "pipeline folder")->required();
  cmd->add_option("--memory", a->memory,
                  "the pipeline's components between requests: resident (loaded on first use and "
                  "kept for every later request), staged (each stage loads its component and "
                  "releases it: every request loads the weights again, peak memory the largest "
                  "stage), auto (resident when the weights fit 3/4 of the machine's memory)")
      ->capture_default_str()
      ->check(CLI::IsMember({"resident", "staged", "auto"}));
  cmd->add_option("--dtype", o.dtype,
                  "the transformer's compute type for every request (a request may leave dtype "
                  "out or repeat it)")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "f32", "bf16", "int8"}));
  cmd->add_option("--model-id", o.model_id,
                  "the model's id in /v1/models and requests (default: the folder's name)");
  cmd->add_option("--host", o.host, "address to listen on")->capture_default_str();
  cmd->add_option("--port", o.port, "port (0: any free port)")
      ->capture_default_str()
      ->check(CLI::Range(0, 65535));
  cmd->add_option("--workers", o.workers,
                  "requests generating at once (the kernels already use every core)")
      ->capture_default_str()
      ->check(CLI::Range(1, 256));
  cmd->add_option("--queue", o.queue, "requests waiting for a worker; beyond, 503 with Retry-After")
      ->capture_default_str()
      ->check(CLI::Range(0, 65536));
  cmd->add_option("--store-ram", a->store_ram,
                  "reference store in memory: conditioning latents, prompt embeddings, K/V")
      ->capture_default_str();
  cmd->add_option("--store-disk", o.store_disk, "reference store's disk tier (a folder)");
  cmd->add_option("--api-key", a->api_keys,
                  "a key requests must present as 'Authorization: Bearer KEY' on every route but "
                  "/health (repeatable; visible in the process list: prefer --api-key-file or "
                  "FLOWKV_API_KEY)");
  cmd->add_option("--api-key-file", a->api_key_file,
                  "a file of keys, one a line ('#' starts a comment); readable by its owner only");
  cmd->add_option("--max-body", a->max_body,
                  "largest request body, whatever its transfer encoding: a larger Content-Length "
                  "gets 413 before the body is read, a chunked body 413 once it passes the limit")
      ->capture_default_str();
  cmd->add_option("--header-timeout", o.header_timeout_seconds,
                  "seconds a request's line and headers may take from their first byte (slow "
                  "clients are cut off: 408); a body must then arrive at 16 KiB/s on average "
                  "after 10 s")
      ->capture_default_str()
      ->check(CLI::Range(0.1, 3600.0));
  cmd->add_option("--max-image-pixels", o.limits.max_image_pixels,
                  "largest output size, in pixels (the default suits a 2-core CPU)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, limits::kMaxImagePixels));
  cmd->add_option("--max-upload-pixels", o.limits.max_upload_pixels,
                  "largest uploaded image, in pixels (read from its header before decoding)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, limits::kMaxImagePixels));
  cmd->add_option("--max-steps", o.limits.max_steps, "most denoising steps a request may ask")
      ->capture_default_str()
      ->check(CLI::Range(1, 10000));
  cmd->add_option("--max-references", o.limits.max_references, "most images one edit may upload")
      ->capture_default_str()
      ->check(CLI::Range(1, static_cast<int>(limits::kMaxReferences)));
  cmd->add_option("--max-n", o.limits.max_n, "most images one request may ask (n)")
      ->capture_default_str()
      ->check(CLI::Range(1, 64));
  cmd->add_option("--timeout", o.timeout_seconds,
                  "seconds a request may take, waiting included; then it is stopped (504)")
      ->capture_default_str()
      ->check(CLI::Range(0.1, 1e6));
  cmd->add_option("--shutdown-grace", o.shutdown_grace_seconds,
                  "on SIGTERM, seconds running requests get to finish before they are stopped")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1e6));
  cmd->add_option("--memory-budget", a->memory_budget,
                  "bytes the running requests' predicted KV caches and activations may take "
                  "together, e.g. 8G: a request alone over it is refused (400), others wait "
                  "(default: no admission by memory)");
  cmd->callback([a] {
    std::exit(guarded([&] {
      a->o.memory = parse_memory_policy(a->memory);
      a->o.store_ram = parse_bytes(a->store_ram, "--store-ram");
      a->o.max_body = parse_bytes(a->max_body, "--max-body");
      FLOWKV_CHECK(a->o.max_body >= 1024, "--max-body must be at least 1K");
      if (!a->memory_budget.empty()) {
        a->o.memory_budget = parse_bytes(a->memory_budget, "--memory-budget");
      }
      a->o.api_keys =
          server::collect_api_keys(a->api_keys, a->api_key_file, std::getenv("FLOWKV_API_KEY"));
      return server::serve(a->o);
    }));
  });
}

}  // namespace flowkv::cli
