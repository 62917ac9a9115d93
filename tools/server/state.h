// What the parts of flowkv serve share (server.h has the public entry): the server's state (one
// opened Pipeline, the store, the metrics, the admission), a request on its way (Job), and the
// functions each part offers the others. Internal to tools/server.
//
//   server.cc      start, routes, signals and shutdown
//   handlers.cc    a request's body -> a Job (uploads in memory, Pipeline::prepare), its run,
//                  the JSON answers and the error mapping
//   stream.cc      the connection: its socket watched for a client that leaves, SSE streaming
//   admission.cc   the FIFO queue, predicted memory, the stop conditions
//   metrics.cc     /metrics (Prometheus text)
#pragma once

#include <httplib.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "connection.h"
#include "flowkv/generate.h"
#include "flowkv/pipeline.h"
#include "flowkv/store.h"
#include "request.h"
#include "server.h"

namespace flowkv::server {

using Clock = std::chrono::steady_clock;

double since(Clock::time_point t0);
int64_t unix_now();

// A client's text for the log: control characters and backslashes escaped (no forged lines),
// at most 256 bytes.
std::string log_safe(const std::string& text);
// The handler runs: its connection reads under no header or body deadline any more.
inline void handling() {
  if (Connection* c = HardenedServer::current()) c->handling();
}

// ---- metrics.cc

class Metrics {
 public:
  static constexpr double kStepBuckets[] = {0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                                            1,    2.5,   5,    10,  30,   60};

  void request(const std::string& route, int status);
  void step(double seconds);
  void count(const std::string& name);
  std::atomic<int64_t> queued{0}, in_flight{0}, reserved_bytes{0};

  // The Prometheus text: the server's own figures, the store's, and the pipeline's (component
  // loads and their seconds: a resident pipeline loads each component once).
  std::string render(const ReferenceStore& store, const PipelineStats& pipeline,
                     const ConnectionRegistry& connections) const;

 private:
  mutable std::mutex m_;
  std::map<std::pair<std::string, int>, int64_t> requests_;
  std::map<std::string, int64_t> counters_;
  int64_t step_counts_[std::size(kStepBuckets)] = {};
  int64_t step_count_ = 0;
  double step_sum_ = 0;
};

// ---- admission.cc

// First come, first served: at most `workers` running, `queue` waiting, and (budget > 0) the
// running requests' predicted bytes within the budget (a request alone over it runs alone).
class Admission {
 public:
  Admission(int workers, int queue, int64_t budget, Metrics& metrics)
      : workers_(workers), queue_(queue), budget_(budget), metrics_(metrics) {}

  bool full() const;
  // Waits for its turn; `stop` is polled meanwhile. Throws ApiError 503 when the queue is
  // full, Cancelled when `stop` says so.
  void acquire(int64_t bytes, const std::function<bool()>& stop);
  void release(int64_t bytes);

 private:
  mutable std::mutex m_;
  std::condition_variable cv_;
  const int workers_, queue_;
  const int64_t budget_;
  Metrics& metrics_;
  int running_ = 0;
  int64_t reserved_ = 0;
  std::deque<uint64_t> waiting_;
  uint64_t next_ = 0;
};

// ---- the server's state (server.cc builds it)

struct State {
  State(const ServeOptions& options, Pipeline opened) : opt(options), pipeline(std::move(opened)) {}
  ServeOptions opt;
  std::string model_id;
  // Opened once at start; every request runs on it (its components stay loaded when resident).
  Pipeline pipeline;
  std::shared_ptr<ReferenceStore> store;
  Metrics metrics;
  std::unique_ptr<Admission> admission;
  std::atomic<bool> stopping{false};   // SIGTERM: no new requests
  std::atomic<bool> abort_all{false};  // grace period over: running requests are cancelled
  std::atomic<uint64_t> next_id{1};
  ConnectionRegistry* connections = nullptr;  // the server's (for /metrics)
  // The server's own paths (the model folder as given, absolute and canonical; the store's
  // folder) and the names a client sees instead, longest first.
  std::vector<std::pair<std::string, std::string>> private_paths;
  std::string redact(std::string message) const {
    for (const auto& [path, name] : private_paths) {
      for (size_t at = message.find(path); at != std::string::npos;
           at = message.find(path, at + name.size())) {
        message.replace(at, path.size(), name);
      }
    }
    return message;
  }
};

// What the log line and the metrics say about the request this thread answers.
struct Served {
  uint64_t id = 0;
  Clock::time_point start;
  int outcome = 0;  // overrides the HTTP status in the log (499: client left; a stream's error)
  std::string user;
};
extern thread_local Served t_served;

// A request from its admission to its answer. The uploads live in `prepared` (decoded once);
// nothing of a request is written to disk.
struct Job {
  uint64_t id = 0;
  bool edit = false;
  ImageRequest req;
  std::shared_ptr<const PreparedRequest> prepared;
  int64_t bytes = 0;  // predicted KV cache and activations
  int fd = -1;        // the connection's socket, -1 when not found
  Clock::time_point deadline;
  std::atomic<bool> client_gone{false}, timed_out{false}, aborted{false};

  const GenerateLayout& layout() const { return prepared->layout(); }
};

// admission.cc: the request's predicted bytes (KV cache when on, plus one forward's
// activations), refused (400) alone over --memory-budget.
int64_t admit_memory(State& s, const Job& j);
// Polled by the admission wait and by generate (per stage and per step).
bool should_stop(State& s, Job& j);

// ---- handlers.cc

struct Picture {
  std::string b64;  // the PNG, base64
  uint64_t seed = 0;
  double seconds = 0;
  GenerateResult meta;  // without pixels
};

struct Emitter {
  std::function<void(int image, const StepEvent&)> step;
  std::function<void(int image, int index, const std::string& b64)> partial;
  std::function<void(int image, const Picture&)> completed;
};

// Waits for admission, then generates the job's n pictures on the pipeline.
std::vector<Picture> run(State& s, Job& j, const Emitter& emit);
nlohmann::json usage_of(const Job& j, int images);
nlohmann::json flowkv_of(const Picture& im);
// An exception from a request -> (status, OpenAI error body); 499: the client is gone.
std::pair<int, nlohmann::json> error_of(State& s, const Job* j, std::exception_ptr ep);

void handle_images(State& s, const httplib::Request& hreq, httplib::Response& res, bool edit);

// ---- stream.cc

// Whether the peer of a connection's socket has closed it.
bool peer_closed(int fd);
// Answers the admitted streaming job: headers now, server-sent events as it runs.
void stream_images(State& s, std::shared_ptr<Job> job, httplib::Response& res);

}  // namespace flowkv::server
