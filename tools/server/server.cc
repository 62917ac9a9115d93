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

#include <fcntl.h>
#include <pthread.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
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

void send_refusal(httplib::Response& res, int status, const std::string& message) {
  static const std::map<int, std::string> kCodes = {
      {408, "request_timeout"},      {411, "length_required"}, {413, "payload_too_large"},
      {415, "unsupported_encoding"}, {400, "bad_request"},     {503, "server_busy"}};
  auto it = kCodes.find(status);
  res.status = status;
  res.set_header("Connection", "close");
  res.set_content(dump(error_body(message, status == 503 ? "server_error" : "invalid_request_error",
                                  "", it == kCodes.end() ? "bad_request" : it->second)),
                  "application/json");
}

// Constant time in the length of the configured key, whatever the presented one is.
bool same_key(const std::string& presented, const std::string& key) {
  volatile unsigned char diff = presented.size() != key.size() ? 1 : 0;
  for (size_t i = 0; i < key.size(); ++i) {
    const char p = i < presented.size() ? presented[i] : 0;
    diff = static_cast<unsigned char>(diff | static_cast<unsigned char>(p ^ key[i]));
  }
  return diff == 0;
}

// The key a request presents: "Authorization: Bearer KEY" ("" when there is none).
std::string presented_key(const httplib::Request& req) {
  const std::string h = req.get_header_value("Authorization");
  if (h.size() < 7) return {};
  std::string scheme = h.substr(0, 7);
  for (char& c : scheme) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (scheme != "bearer ") return {};
  size_t b = 7;
  while (b < h.size() && h[b] == ' ') ++b;
  return h.substr(b);
}

// /health answers anyone (load balancers, orchestrators); every other route needs a key when
// the server has any.
bool authorized(const State& st, const httplib::Request& req) {
  if (st.opt.api_keys.empty() || req.path == "/health") return true;
  const std::string key = presented_key(req);
  bool ok = false;
  for (const std::string& k : st.opt.api_keys) ok |= !key.empty() && same_key(key, k);
  return ok;
}

// OpenAI's answer to a missing or wrong key (401, invalid_request_error), the key not echoed.
void unauthorized(State& st, const httplib::Request& req, httplib::Response& res) {
  st.metrics.count("unauthorized");
  res.status = 401;
  res.set_header("WWW-Authenticate", "Bearer");
  const bool missing = presented_key(req).empty();
  const std::string message =
      missing ? "You didn't provide an API key. Send it in an Authorization header as "
                "'Authorization: Bearer YOUR_KEY' (flowkv serve --api-key / --api-key-file)."
              : "Incorrect API key provided.";
  res.set_content(
      dump(error_body(message, "invalid_request_error", "", missing ? "" : "invalid_api_key")),
      "application/json");
}

bool loopback(const std::string& host) {
  return host == "127.0.0.1" || host == "localhost" || host == "::1" || host.rfind("127.", 0) == 0;
}

}  // namespace

std::vector<std::string> collect_api_keys(const std::vector<std::string>& given,
                                          const std::string& file, const char* env) {
  std::vector<std::string> keys;
  auto add = [&keys](std::string key, const std::string& from) {
    while (!key.empty() && (key.back() == '\r' || key.back() == ' ' || key.back() == '\t'))
      key.pop_back();
    size_t b = 0;
    while (b < key.size() && (key[b] == ' ' || key[b] == '\t')) ++b;
    key = key.substr(b);
    if (key.empty() || key[0] == '#') return;
    FLOWKV_CHECK(key.size() >= 16 && key.size() <= 512, from,
                 ": an API key must have 16 to 512 characters (e.g. openssl rand -hex 32)");
    for (const char c : key) {
      FLOWKV_CHECK(c > 0x20 && c < 0x7f, from,
                   ": an API key is printable ASCII without spaces or control characters");
    }
    keys.push_back(std::move(key));
  };
  for (const std::string& k : given) add(k, "--api-key");
  if (env) {
    std::string all = env;
    for (size_t start = 0; start <= all.size();) {
      size_t end = all.find(',', start);
      if (end == std::string::npos) end = all.size();
      add(all.substr(start, end - start), "FLOWKV_API_KEY");
      start = end + 1;
    }
  }
  if (!file.empty()) {
    const int fd = ::open(file.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    FLOWKV_CHECK(fd >= 0, "--api-key-file ", file, ": cannot open it (", std::strerror(errno), ")");
    struct stat st {};
    std::string text;
    const bool ok = ::fstat(fd, &st) == 0;
    const bool regular = ok && S_ISREG(st.st_mode);
    const bool small = ok && st.st_size <= (1 << 20);
    const bool private_mode = ok && (st.st_mode & 077) == 0;
    if (regular && small && private_mode) {
      text.resize(static_cast<size_t>(st.st_size));
      size_t got = 0;
      while (got < text.size()) {
        const ssize_t n = ::read(fd, text.data() + got, text.size() - got);
        if (n <= 0) break;
        got += static_cast<size_t>(n);
      }
      text.resize(got);
    }
    ::close(fd);
    FLOWKV_CHECK(regular, "--api-key-file ", file, ": not a regular file");
    FLOWKV_CHECK(small, "--api-key-file ", file, ": over 1 MiB; a key file holds a few keys");
    FLOWKV_CHECK(private_mode, "--api-key-file ", file, ": others can read it (mode ", std::oct,
                 (st.st_mode & 0777), std::dec, "); chmod 600 it");
    size_t start = 0;
    int line = 1;
    while (start < text.size()) {
      size_t end = text.find('\n', start);
      if (end == std::string::npos) end = text.size();
      add(text.substr(start, end - start),
          "--api-key-file " + file + " line " + std::to_string(line));
      start = end + 1;
      ++line;
    }
    FLOWKV_CHECK(!keys.empty(), "--api-key-file ", file, ": holds no key");
  }
  return keys;
}

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
    namespace fs = std::filesystem;
    std::error_code ec;
    auto add = [&](const std::string& path, const std::string& name) {
      if (path.size() > 1) s->private_paths.emplace_back(path, name);
    };
    const std::string model_name = "<model " + s->model_id + ">";
    for (const std::string& given : {options.model, options.store_disk}) {
      if (given.empty()) continue;
      const std::string name = given == options.model ? model_name : "<store>";
      add(fs::absolute(given, ec).lexically_normal().string(), name);
      add(fs::weakly_canonical(given, ec).string(), name);
      add(given, name);
    }
    std::sort(s->private_paths.begin(), s->private_paths.end(),
              [](const auto& a, const auto& b) { return a.first.size() > b.first.size(); });
  }
  {
    // A small request checks what opening cannot (tokenizer, scheduler) before any client
    // comes. An editing pipeline (Qwen-Image-Edit-Plus) refuses one without a picture: then
    // the same with a plain one.
    GenerateRequest probe;
    probe.prompt = "a";
    probe.width = probe.height = 256;
    try {
      (void)s->pipeline.prepare(probe);
    } catch (const Error&) {
      GenerateRequest with_picture = probe;
      with_picture.images.push_back(
          {.name = "probe", .encoded = {}, .decoded = Image::blank(256, 256, "probe")});
      try {
        (void)s->pipeline.prepare(with_picture);
      } catch (const Error&) {
        (void)s->pipeline.prepare(probe);  // the text-only request's error names the problem
      }
    }
  }
  StoreOptions so;
  so.ram_bytes = options.store_ram;
  so.disk_dir = options.store_disk;
  s->store = std::make_shared<ReferenceStore>(so);
  s->admission = std::make_unique<Admission>(options.workers, options.queue, options.memory_budget,
                                             s->metrics);

  ConnectionLimits limits;
  limits.max_body = options.max_body;
  limits.header_seconds = options.header_timeout_seconds;
  // Connection threads: every running and waiting request holds one, plus 16 for reading new
  // requests, /health and /metrics; when all are taken, the slowest reader gives way.
  limits.threads = static_cast<size_t>(std::min(options.workers + options.queue + 16, 1024));
  HardenedServer svr(limits);
  svr.set_read_timeout(30);
  svr.set_write_timeout(30);
  State& st = *s;
  st.connections = &svr.registry();

  // Before any route: the request refused from its headers (answered without reading its body),
  // and the API key.
  svr.set_pre_routing_handler([&st](const httplib::Request& req, httplib::Response& res) {
    t_served = Served{};
    t_served.id = st.next_id++;
    t_served.start = Clock::now();
    res.set_header("X-Request-Id", std::to_string(t_served.id));
    Connection* c = HardenedServer::current();
    if (c && c->refusal() != ReadRefusal::kNone) {
      const auto [status, message] = refusal_answer(c->refusal(), st.opt.max_body);
      send_refusal(res, status, message);
      return httplib::Server::HandlerResponse::Handled;
    }
    if (!authorized(st, req)) {
      unauthorized(st, req, res);
      if (c) c->close_after();
      return httplib::Server::HandlerResponse::Handled;
    }
    return httplib::Server::HandlerResponse::Unhandled;
  });
  // "Expect: 100-continue": a refused or unauthenticated request is answered before its body.
  svr.set_expect_100_continue_handler([&st](const httplib::Request& req, httplib::Response&) {
    Connection* c = HardenedServer::current();
    if (c && c->refusal() != ReadRefusal::kNone)
      return refusal_answer(c->refusal(), st.opt.max_body).first;
    return authorized(st, req) ? 100 : 401;
  });
  svr.set_error_handler(httplib::Server::HandlerWithResponse(
      [&st](const httplib::Request& req, httplib::Response& res) {
        if (!res.body.empty() || res.status == 499)
          return httplib::Server::HandlerResponse::Unhandled;
        // A body that stopped arriving, or went over the limit while read (chunked): the
        // connection says why; httplib only knows the read failed.
        if (Connection* c = HardenedServer::current(); c && c->refusal() != ReadRefusal::kNone) {
          const auto [status, message] = refusal_answer(c->refusal(), st.opt.max_body);
          send_refusal(res, status, message);
          return httplib::Server::HandlerResponse::Handled;
        }
        if (res.status == 401) {
          unauthorized(st, req, res);
          return httplib::Server::HandlerResponse::Handled;
        }
        std::string message, code;
        if (res.status == 404) {
          message = "no route " + req.method + " " + req.path.substr(0, 128);
          code = "not_found";
        } else if (res.status == 413) {
          message = "the request body is larger than this server's limit of " +
                    std::to_string(st.opt.max_body) + " bytes (--max-body)";
          code = "payload_too_large";
        } else if (res.status == 405) {
          message = "method " + req.method + " is not allowed on " + req.path.substr(0, 128);
          code = "method_not_allowed";
        } else {
          message = "malformed request (" + std::to_string(res.status) + ")";
          code = "bad_request";
        }
        res.set_content(dump(error_body(message, "invalid_request_error", "", code)),
                        "application/json");
        return httplib::Server::HandlerResponse::Handled;
      }));
  svr.set_exception_handler([](const httplib::Request&, httplib::Response& res,
                               std::exception_ptr ep) {
    try {
      std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "request %llu: internal error: %s\n",
                   static_cast<unsigned long long>(t_served.id), log_safe(e.what()).c_str());
    } catch (...) {
      std::fprintf(stderr, "request %llu: internal error\n",
                   static_cast<unsigned long long>(t_served.id));
    }
    res.status = 500;
    res.set_content(dump(error_body("internal server error", "server_error", "", "internal_error")),
                    "application/json");
  });
  svr.set_logger([&st](const httplib::Request& req, const httplib::Response& res) {
    const int status = t_served.outcome ? t_served.outcome : res.status;
    st.metrics.request(route_of(req.path), status);
    // A body the route did not read (an error, a GET with a body) is not left to be taken for
    // the next request: the connection closes.
    if (Connection* c = HardenedServer::current();
        c && c->has_body() && (res.status >= 400 || req.method == "GET" || req.method == "HEAD")) {
      c->close_after();
    }
    std::fprintf(stderr, "request %llu %s %s %d %.3f s%s%s\n",
                 static_cast<unsigned long long>(t_served.id), log_safe(req.method).c_str(),
                 route_of(req.path).c_str(), status, since(t_served.start),
                 t_served.user.empty() ? "" : " user=", log_safe(t_served.user).c_str());
    t_served = Served{};
  });

  svr.Post("/v1/images/generations", [&st](const httplib::Request& req, httplib::Response& res) {
    handle_images(st, req, res, false);
  });
  svr.Post("/v1/images/edits", [&st](const httplib::Request& req, httplib::Response& res) {
    handle_images(st, req, res, true);
  });
  svr.Get("/health", [&st](const httplib::Request&, httplib::Response& res) {
    handling();
    json h = {{"status", st.stopping ? "stopping" : "ok"},
              {"model", st.model_id},
              {"queued", st.metrics.queued.load()},
              {"in_flight", st.metrics.in_flight.load()}};
    res.status = st.stopping ? 503 : 200;
    res.set_content(dump(h), "application/json");
  });
  svr.Get("/v1/models", [&st](const httplib::Request&, httplib::Response& res) {
    handling();
    json m = {{"object", "list"},
              {"data", json::array({{{"id", st.model_id},
                                     {"object", "model"},
                                     {"created", 0},
                                     {"owned_by", "flowkv"}}})}};
    res.set_content(dump(m), "application/json");
  });
  svr.Get("/metrics", [&st](const httplib::Request&, httplib::Response& res) {
    handling();
    res.set_content(st.metrics.render(*st.store, st.pipeline.stats(), *st.connections),
                    "text/plain; version=0.0.4");
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
  if (!loopback(options.host) && options.api_keys.empty()) {
    std::fprintf(stderr,
                 "WARNING: listening on %s without an API key: anyone who can reach this address "
                 "can generate on this machine and read /metrics. Give --api-key-file FILE (or "
                 "FLOWKV_API_KEY) to require 'Authorization: Bearer KEY', or listen on "
                 "127.0.0.1.\n",
                 options.host.c_str());
  }
  std::printf("listening on http://%s:%d\n", options.host.c_str(), port);
  std::fflush(stdout);
  std::fprintf(stderr,
               "serving %s as '%s': %s pipeline, dtype %s, %d worker(s), queue %d, %zu API "
               "key(s)\n",
               options.model.c_str(), st.model_id.c_str(), memory_policy_name(st.pipeline.memory()),
               options.dtype.c_str(), options.workers, options.queue, options.api_keys.size());

  std::thread listener([&svr] { svr.listen_after_bind(); });
  int sig = 0;
  sigwait(&set, &sig);
  std::fprintf(stderr, "signal %d: shutting down (no new requests; %.0f s for those running)\n",
               sig, options.shutdown_grace_seconds);
  st.stopping = true;
  svr.stop_connections();
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
