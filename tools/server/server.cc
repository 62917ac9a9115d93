// flowkv serve (server.h): OpenAI's images API over one pipeline folder, opened once as a
// flowkv::Pipeline that every request runs on. This file: start, routes, signals, shutdown;
// state.h lists the other parts.
//
// HTTP library: cpp-httplib, Debian's libcpp-httplib-dev (0.11.4). It is maintained, packaged in
// Debian (so CI installs it with apt like every other dependency), streams server-sent events
// through a chunked content provider, refuses a body over a size limit from its Content-Length
// before reading it (set_payload_max_length), and parses multipart/form-data itself. With
// Boost.Beast we would write the server loop, keep-alive, chunked transfer and the multipart
// parser ourselves: more hostile-input code of our own. No HTTP or multipart parsing is done
// here; JSON goes through nlohmann-json.
//
// Threads: httplib runs each connection on a thread of its pool; a request generates on its
// connection's thread once the admission (a FIFO queue bounded by --queue, at most --workers
// running, their predicted bytes within --memory-budget) lets it, so errors are answered on the
// spot and a stream's events are written by the thread that makes them.
#include "server.h"

#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <set>
#include <thread>

#include "flowkv/error.h"
#include "state.h"

namespace flowkv::server {

namespace {

using nlohmann::json;

std::string route_of(const std::string& path) {
  static const std::set<std::string> kRoutes = {"/v1/images/generations", "/v1/images/edits",
                                                "/v1/models", "/health", "/metrics"};
  return kRoutes.count(path) ? path : "other";
}

}  // namespace

int serve(const ServeOptions& options) {
  FLOWKV_CHECK(options.workers >= 1 && options.workers <= 256, "--workers must be from 1 to 256");
  FLOWKV_CHECK(options.queue >= 0 && options.queue <= 65536, "--queue must be from 0 to 65536");
  // SIGINT and SIGTERM: blocked first, so that every thread started later (httplib's, the
  // kernels' pools) inherits the mask; the main thread takes them with sigwait below.
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  std::signal(SIGPIPE, SIG_IGN);
  // The pipeline folder opened once (fails fast on a folder that is not a pipeline: it reads
  // model_index.json, the configs and the tokenizer); the weights load when a request first
  // needs them and, resident, stay loaded for every later one.
  auto s = std::make_unique<State>(
      options, Pipeline::open(options.model,
                              PipelineOptions{.memory = options.memory, .dtype = options.dtype}));
  s->model_id = options.model_id;
  if (s->model_id.empty()) {
    std::filesystem::path p = std::filesystem::absolute(options.model).lexically_normal();
    if (p.filename().empty()) p = p.parent_path();
    s->model_id = p.filename().string();
  }
  {
    GenerateRequest probe;
    probe.prompt = "a";
    probe.width = probe.height = 256;
    (void)s->pipeline.prepare(probe);
  }
  StoreOptions so;
  so.ram_bytes = options.store_ram;
  so.disk_dir = options.store_disk;
  s->store = std::make_shared<ReferenceStore>(so);
  s->admission = std::make_unique<Admission>(options.workers, options.queue, options.memory_budget,
                                             s->metrics);

  httplib::Server svr;
  // Connection threads: every running and waiting request holds one, plus a few for /health and
  // /metrics; at most 512 (more connections wait in httplib's list for a thread).
  const size_t pool = static_cast<size_t>(std::min(options.workers + options.queue + 8, 512));
  svr.new_task_queue = [pool] { return new httplib::ThreadPool(pool); };
  svr.set_payload_max_length(static_cast<size_t>(options.max_body));
  svr.set_keep_alive_timeout(2);
  svr.set_read_timeout(30);
  svr.set_write_timeout(30);
  State& st = *s;

  svr.set_pre_routing_handler([&st](const httplib::Request&, httplib::Response& res) {
    t_served = Served{};
    t_served.id = st.next_id++;
    t_served.start = Clock::now();
    res.set_header("X-Request-Id", std::to_string(t_served.id));
    return httplib::Server::HandlerResponse::Unhandled;
  });
  svr.set_error_handler(
      httplib::Server::HandlerWithResponse([](const httplib::Request& req, httplib::Response& res) {
        if (!res.body.empty() || res.status == 499)
          return httplib::Server::HandlerResponse::Unhandled;
        std::string message, code;
        if (res.status == 404) {
          message = "no route " + req.method + " " + req.path.substr(0, 128);
          code = "not_found";
        } else if (res.status == 413) {
          message = "the request body is larger than this server's limit (--max-body)";
          code = "payload_too_large";
        } else if (res.status == 405) {
          message = "method " + req.method + " is not allowed on " + req.path.substr(0, 128);
          code = "method_not_allowed";
        } else {
          message = "malformed request (" + std::to_string(res.status) + ")";
          code = "bad_request";
        }
        res.set_content(error_body(message, "invalid_request_error", "", code).dump(),
                        "application/json");
        return httplib::Server::HandlerResponse::Handled;
      }));
  svr.set_exception_handler(
      [](const httplib::Request&, httplib::Response& res, std::exception_ptr) {
        res.status = 500;
        res.set_content(
            error_body("internal server error", "server_error", "", "internal_error").dump(),
            "application/json");
      });
  svr.set_logger([&st](const httplib::Request& req, const httplib::Response& res) {
    const int status = t_served.outcome ? t_served.outcome : res.status;
    st.metrics.request(route_of(req.path), status);
    std::fprintf(stderr, "request %llu %s %s %d %.3f s%s%s\n",
                 static_cast<unsigned long long>(t_served.id), req.method.c_str(),
                 route_of(req.path).c_str(), status, since(t_served.start),
                 t_served.user.empty() ? "" : " user=", t_served.user.c_str());
    t_served = Served{};
  });

  svr.Post("/v1/images/generations", [&st](const httplib::Request& req, httplib::Response& res) {
    handle_images(st, req, res, false);
  });
  svr.Post("/v1/images/edits", [&st](const httplib::Request& req, httplib::Response& res) {
    handle_images(st, req, res, true);
  });
  svr.Get("/health", [&st](const httplib::Request&, httplib::Response& res) {
    json h = {{"status", st.stopping ? "stopping" : "ok"},
              {"model", st.model_id},
              {"queued", st.metrics.queued.load()},
              {"in_flight", st.metrics.in_flight.load()}};
    res.status = st.stopping ? 503 : 200;
    res.set_content(h.dump(), "application/json");
  });
  svr.Get("/v1/models", [&st](const httplib::Request&, httplib::Response& res) {
    json m = {{"object", "list"},
              {"data", json::array({{{"id", st.model_id},
                                     {"object", "model"},
                                     {"created", 0},
                                     {"owned_by", "flowkv"}}})}};
    res.set_content(m.dump(), "application/json");
  });
  svr.Get("/metrics", [&st](const httplib::Request&, httplib::Response& res) {
    res.set_content(st.metrics.render(*st.store, st.pipeline.stats()), "text/plain; version=0.0.4");
  });
  // The routes under the other method: 405 with Allow, not 404.
  auto not_allowed = [](const char* allow) {
    return [allow](const httplib::Request&, httplib::Response& res) {
      res.status = 405;
      res.set_header("Allow", allow);
    };
  };
  svr.Get("/v1/images/generations", not_allowed("POST"));
  svr.Get("/v1/images/edits", not_allowed("POST"));
  for (const char* p : {"/health", "/v1/models", "/metrics"}) {
    svr.Post(p, not_allowed("GET"));
    svr.Put(p, not_allowed("GET"));
    svr.Delete(p, not_allowed("GET"));
  }
  for (const char* p : {"/v1/images/generations", "/v1/images/edits"}) {
    svr.Put(p, not_allowed("POST"));
    svr.Delete(p, not_allowed("POST"));
  }

  int port = options.port;
  if (port == 0) {
    port = svr.bind_to_any_port(options.host);
    FLOWKV_CHECK(port > 0, "cannot listen on ", options.host, " (any port)");
  } else {
    FLOWKV_CHECK(svr.bind_to_port(options.host, port), "cannot listen on ", options.host, ":", port,
                 " (in use, or not an address of this machine)");
  }
  std::printf("listening on http://%s:%d\n", options.host.c_str(), port);
  std::fflush(stdout);
  std::fprintf(stderr, "serving %s as '%s': %s pipeline, dtype %s, %d worker(s), queue %d\n",
               options.model.c_str(), st.model_id.c_str(), memory_policy_name(st.pipeline.memory()),
               options.dtype.c_str(), options.workers, options.queue);

  std::thread listener([&svr] { svr.listen_after_bind(); });
  int sig = 0;
  sigwait(&set, &sig);
  std::fprintf(stderr, "signal %d: shutting down (no new requests; %.0f s for those running)\n",
               sig, options.shutdown_grace_seconds);
  st.stopping = true;
  svr.stop();
  // Past the grace period, or on a second signal, running requests are stopped and answered.
  std::atomic<bool> done{false};
  std::thread watchdog([&] {
    const auto until =
        Clock::now() +
        std::chrono::milliseconds(static_cast<int64_t>(options.shutdown_grace_seconds * 1000));
    timespec tick{0, 100 * 1000 * 1000};
    while (!done && Clock::now() < until) {
      if (sigtimedwait(&set, nullptr, &tick) > 0) break;  // a second signal: stop them now
    }
    if (!done) st.abort_all = true;
  });
  listener.join();
  done = true;
  watchdog.join();
  std::fprintf(stderr, "stopped\n");
  return 0;
}

}  // namespace flowkv::server
