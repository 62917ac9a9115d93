// flowkv serve (server.h): OpenAI's images API over one pipeline folder.
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

#include <arpa/inet.h>
#include <dirent.h>
#include <httplib.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>
#include <vector>

#include "flowkv/error.h"
#include "flowkv/generate.h"
#include "flowkv/limits.h"
#include "flowkv/predict.h"
#include "flowkv/runtime.h"
#include "flowkv/store.h"
#include "spng.h"
#include "turbojpeg.h"

namespace flowkv::server {

namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

double since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string base64(const std::string& in) {
  static const char* kAlphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  out.reserve((in.size() + 2) / 3 * 4);
  size_t i = 0;
  for (; i + 2 < in.size(); i += 3) {
    const uint32_t v = (uint32_t(uint8_t(in[i])) << 16) | (uint32_t(uint8_t(in[i + 1])) << 8) |
                       uint32_t(uint8_t(in[i + 2]));
    out += kAlphabet[(v >> 18) & 63];
    out += kAlphabet[(v >> 12) & 63];
    out += kAlphabet[(v >> 6) & 63];
    out += kAlphabet[v & 63];
  }
  if (i < in.size()) {
    uint32_t v = uint32_t(uint8_t(in[i])) << 16;
    if (i + 1 < in.size()) v |= uint32_t(uint8_t(in[i + 1])) << 8;
    out += kAlphabet[(v >> 18) & 63];
    out += kAlphabet[(v >> 12) & 63];
    out += i + 1 < in.size() ? kAlphabet[(v >> 6) & 63] : '=';
    out += '=';
  }
  return out;
}

std::string read_whole(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  FLOWKV_CHECK(f, "cannot read ", path);
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

// A request's own folder for its uploads and PNGs: mode 0700 (mkdtemp), removed with the job.
class TempDir {
 public:
  TempDir() {
    std::string base = std::filesystem::temp_directory_path().string() + "/flowkv-serve-XXXXXX";
    std::vector<char> buf(base.begin(), base.end());
    buf.push_back('\0');
    if (!::mkdtemp(buf.data()))
      throw ApiError(500, "cannot create a temporary folder", "", "", "server_error");
    path_ = buf.data();
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// An uploaded image's size from its header, through the image libraries (libspng, libjpeg-turbo)
// that flowkv itself decodes with; refused when neither reads it.
std::pair<int64_t, int64_t> image_header_size(const std::string& bytes, const std::string& what) {
  if (bytes.size() >= 8 && std::memcmp(bytes.data(), "\x89PNG\r\n\x1a\n", 8) == 0) {
    spng_ctx* ctx = spng_ctx_new(0);
    if (!ctx) throw ApiError(500, "out of memory", "", "", "server_error");
    spng_ihdr ihdr{};
    const int rc_buf = spng_set_png_buffer(ctx, bytes.data(), bytes.size());
    const int rc = rc_buf ? rc_buf : spng_get_ihdr(ctx, &ihdr);
    spng_ctx_free(ctx);
    if (rc) {
      throw ApiError(400, what + ": not a readable PNG (" + spng_strerror(rc) + ")", "image",
                     "invalid_image");
    }
    return {ihdr.width, ihdr.height};
  }
  if (bytes.size() >= 3 && static_cast<uint8_t>(bytes[0]) == 0xFF &&
      static_cast<uint8_t>(bytes[1]) == 0xD8) {
    tjhandle h = tjInitDecompress();
    if (!h) throw ApiError(500, "cannot start the JPEG decoder", "", "", "server_error");
    int w = 0, hh = 0, sub = 0, cs = 0;
    const int rc =
        tjDecompressHeader3(h, reinterpret_cast<const unsigned char*>(bytes.data()),
                            static_cast<unsigned long>(bytes.size()), &w, &hh, &sub, &cs);
    tjDestroy(h);
    if (rc != 0) {
      throw ApiError(400, what + ": not a readable JPEG", "image", "invalid_image");
    }
    return {w, hh};
  }
  throw ApiError(400, what + ": not a PNG or JPEG image", "image", "invalid_image_format");
}

// ---- the connection's socket -------------------------------------------------------------
// httplib 0.11.4 gives a handler no way to learn that its client left (is_connection_closed
// came in later versions), so a request finds its connection's socket among the process's
// descriptors by its address pair and polls it: the peer's FIN or RST shows as POLLRDHUP /
// POLLHUP / a zero-byte peek. A client that half-closes its side while waiting looks gone.

uint16_t port_of(const sockaddr_storage& a) {
  if (a.ss_family == AF_INET) return ntohs(reinterpret_cast<const sockaddr_in&>(a).sin_port);
  if (a.ss_family == AF_INET6) return ntohs(reinterpret_cast<const sockaddr_in6&>(a).sin6_port);
  return 0;
}

std::string ip_of(const sockaddr_storage& a) {
  char buf[INET6_ADDRSTRLEN] = {0};
  if (a.ss_family == AF_INET) {
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in&>(a).sin_addr, buf, sizeof buf);
  } else if (a.ss_family == AF_INET6) {
    inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6&>(a).sin6_addr, buf, sizeof buf);
  }
  return buf;
}

int find_connection_socket(const httplib::Request& req) {
  DIR* d = ::opendir("/proc/self/fd");
  if (!d) return -1;
  int found = -1;
  while (dirent* e = ::readdir(d)) {
    char* end = nullptr;
    const long fd = std::strtol(e->d_name, &end, 10);
    if (end == e->d_name || *end != '\0' || fd < 0) continue;
    struct stat st {};
    if (::fstat(static_cast<int>(fd), &st) != 0 || !S_ISSOCK(st.st_mode)) continue;
    sockaddr_storage local{}, peer{};
    socklen_t ll = sizeof local, pl = sizeof peer;
    if (::getsockname(static_cast<int>(fd), reinterpret_cast<sockaddr*>(&local), &ll) != 0 ||
        ::getpeername(static_cast<int>(fd), reinterpret_cast<sockaddr*>(&peer), &pl) != 0) {
      continue;
    }
    if (port_of(local) == req.local_port && port_of(peer) == req.remote_port &&
        ip_of(peer) == req.remote_addr) {
      found = static_cast<int>(fd);
      break;
    }
  }
  ::closedir(d);
  return found;
}

bool peer_closed(int fd) {
  if (fd < 0) return false;
  pollfd p{fd, static_cast<short>(POLLIN | POLLRDHUP), 0};
  if (::poll(&p, 1, 0) <= 0) return false;
  if (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) return true;
  if (p.revents & POLLIN) {
    char c;
    const ssize_t n = ::recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
    return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
  }
  return false;
}

// ---- metrics ----------------------------------------------------------------------------------

class Metrics {
 public:
  static constexpr double kStepBuckets[] = {0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                                            1,    2.5,   5,    10,  30,   60};

  void request(const std::string& route, int status) {
    std::lock_guard<std::mutex> l(m_);
    ++requests_[{route, status}];
  }
  void step(double seconds) {
    std::lock_guard<std::mutex> l(m_);
    for (size_t i = 0; i < std::size(kStepBuckets); ++i) {
      if (seconds <= kStepBuckets[i]) ++step_counts_[i];
    }
    ++step_count_;
    step_sum_ += seconds;
  }
  void count(const std::string& name) {
    std::lock_guard<std::mutex> l(m_);
    ++counters_[name];
  }
  std::atomic<int64_t> queued{0}, in_flight{0}, reserved_bytes{0};

  std::string render(const ReferenceStore& store) const {
    std::ostringstream o;
    std::lock_guard<std::mutex> l(m_);
    o << "# HELP flowkv_requests_total HTTP requests answered, by route and status.\n"
      << "# TYPE flowkv_requests_total counter\n";
    for (const auto& [k, v] : requests_) {
      o << "flowkv_requests_total{route=\"" << k.first << "\",status=\"" << k.second << "\"} " << v
        << "\n";
    }
    const std::pair<const char*, const char*> kCounters[] = {
        {"cancelled", "requests stopped because their client left"},
        {"timeouts", "requests stopped by --timeout"},
        {"rejected_queue_full", "requests refused because the queue was full"},
        {"rejected_memory", "requests refused because they alone exceed --memory-budget"},
        {"images", "images generated"},
        {"shutdown_aborted", "requests stopped by a shutdown past its grace period"}};
    for (const auto& [name, help] : kCounters) {
      auto it = counters_.find(name);
      o << "# HELP flowkv_" << name << "_total " << help << ".\n# TYPE flowkv_" << name
        << "_total counter\nflowkv_" << name << "_total "
        << (it == counters_.end() ? 0 : it->second) << "\n";
    }
    o << "# HELP flowkv_queue_depth Requests waiting for a worker.\n# TYPE flowkv_queue_depth "
         "gauge\nflowkv_queue_depth "
      << queued.load() << "\n";
    o << "# HELP flowkv_in_flight Requests generating now.\n# TYPE flowkv_in_flight gauge\n"
      << "flowkv_in_flight " << in_flight.load() << "\n";
    o << "# HELP flowkv_reserved_bytes Predicted bytes of the running requests.\n"
      << "# TYPE flowkv_reserved_bytes gauge\nflowkv_reserved_bytes " << reserved_bytes.load()
      << "\n";
    o << "# HELP flowkv_step_seconds Wall time of one denoising step.\n"
      << "# TYPE flowkv_step_seconds histogram\n";
    for (size_t i = 0; i < std::size(kStepBuckets); ++i) {
      o << "flowkv_step_seconds_bucket{le=\"" << kStepBuckets[i] << "\"} " << step_counts_[i]
        << "\n";
    }
    o << "flowkv_step_seconds_bucket{le=\"+Inf\"} " << step_count_ << "\n"
      << "flowkv_step_seconds_sum " << step_sum_ << "\nflowkv_step_seconds_count " << step_count_
      << "\n";
    const StoreStats s = store.stats();
    const std::pair<const char*, int64_t> kStore[] = {{"hits", s.hits},
                                                      {"disk_hits", s.disk_hits},
                                                      {"misses", s.misses},
                                                      {"insertions", s.insertions},
                                                      {"evictions", s.evictions},
                                                      {"rejected", s.rejected},
                                                      {"disk_writes", s.disk_writes},
                                                      {"disk_evictions", s.disk_evictions},
                                                      {"disk_errors", s.disk_errors}};
    for (const auto& [name, v] : kStore) {
      o << "# TYPE flowkv_store_" << name << "_total counter\nflowkv_store_" << name << "_total "
        << v << "\n";
    }
    const std::pair<const char*, int64_t> kStoreGauges[] = {{"entries", s.entries},
                                                            {"bytes", s.bytes},
                                                            {"pinned", s.pinned},
                                                            {"pinned_bytes", s.pinned_bytes},
                                                            {"disk_entries", s.disk_entries},
                                                            {"disk_bytes", s.disk_bytes}};
    for (const auto& [name, v] : kStoreGauges) {
      o << "# TYPE flowkv_store_" << name << " gauge\nflowkv_store_" << name << " " << v << "\n";
    }
    o << "# HELP flowkv_store_kind Reference store figures per kind of entry.\n"
      << "# TYPE flowkv_store_kind gauge\n";
    for (const char* kind : {"kv", "latents", "prompt"}) {
      StoreKindStats k;
      if (auto it = s.kinds.find(kind); it != s.kinds.end()) k = it->second;
      const std::pair<const char*, int64_t> f[] = {
          {"hits", k.hits}, {"misses", k.misses}, {"entries", k.entries}, {"bytes", k.bytes}};
      for (const auto& [name, v] : f) {
        o << "flowkv_store_kind{kind=\"" << kind << "\",figure=\"" << name << "\"} " << v << "\n";
      }
    }
    o << "# HELP flowkv_peak_rss_bytes The process's peak resident memory.\n"
      << "# TYPE flowkv_peak_rss_bytes gauge\nflowkv_peak_rss_bytes " << peak_rss() << "\n";
    return o.str();
  }

 private:
  mutable std::mutex m_;
  std::map<std::pair<std::string, int>, int64_t> requests_;
  std::map<std::string, int64_t> counters_;
  int64_t step_counts_[std::size(kStepBuckets)] = {};
  int64_t step_count_ = 0;
  double step_sum_ = 0;
};

// ---- admission ----------------------------------------------------------------------------------

class Admission {
 public:
  Admission(int workers, int queue, int64_t budget, Metrics& metrics)
      : workers_(workers), queue_(queue), budget_(budget), metrics_(metrics) {}

  bool full() const {
    std::lock_guard<std::mutex> l(m_);
    return static_cast<int>(waiting_.size()) >= queue_ && running_ >= workers_;
  }

  // Waits for its turn (first come, first served); `stop` is polled meanwhile. Throws
  // ApiError 503 when the queue is full, Cancelled when `stop` says so.
  void acquire(int64_t bytes, const std::function<bool()>& stop) {
    std::unique_lock<std::mutex> l(m_);
    if (static_cast<int>(waiting_.size()) >= queue_ && running_ >= workers_) {
      throw ApiError(503,
                     "the server is busy: " + std::to_string(running_) + " running and " +
                         std::to_string(waiting_.size()) +
                         " waiting (--queue); retry after a while",
                     "", "queue_full", "server_error");
    }
    const uint64_t ticket = next_++;
    waiting_.push_back(ticket);
    ++metrics_.queued;
    while (true) {
      if (waiting_.front() == ticket && running_ < workers_ &&
          (budget_ <= 0 || reserved_ + bytes <= budget_ || running_ == 0)) {
        waiting_.pop_front();
        --metrics_.queued;
        ++running_;
        reserved_ += bytes;
        metrics_.reserved_bytes = reserved_;
        ++metrics_.in_flight;
        cv_.notify_all();
        return;
      }
      cv_.wait_for(l, std::chrono::milliseconds(100));
      l.unlock();
      const bool stopped = stop();
      l.lock();
      if (stopped) {
        waiting_.erase(std::find(waiting_.begin(), waiting_.end(), ticket));
        --metrics_.queued;
        cv_.notify_all();
        throw Cancelled("stopped while waiting in the queue");
      }
    }
  }

  void release(int64_t bytes) {
    std::lock_guard<std::mutex> l(m_);
    --running_;
    reserved_ -= bytes;
    metrics_.reserved_bytes = reserved_;
    --metrics_.in_flight;
    cv_.notify_all();
  }

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

// ---- requests -----------------------------------------------------------------------------------

struct State {
  ServeOptions opt;
  std::string model_id;
  std::shared_ptr<ReferenceStore> store;
  Metrics metrics;
  std::unique_ptr<Admission> admission;
  std::atomic<bool> stopping{false};   // SIGTERM: no new requests
  std::atomic<bool> abort_all{false};  // grace period over: running requests are cancelled
  std::atomic<uint64_t> next_id{1};
};

// What the log line and the metrics say about the request this thread answers.
struct Served {
  uint64_t id = 0;
  Clock::time_point start;
  int outcome = 0;  // overrides the HTTP status in the log (499: client left; a stream's error)
  std::string user;
};
thread_local Served t_served;

struct Job {
  uint64_t id = 0;
  bool edit = false;
  ImageRequest req;
  std::unique_ptr<TempDir> dir;
  GenerateLayout layout;
  int64_t bytes = 0;
  int fd = -1;
  Clock::time_point deadline;
  std::atomic<bool> client_gone{false}, timed_out{false}, aborted{false};
};

// Polled by the admission wait and by generate (per stage and per step).
bool should_stop(State& s, Job& j) {
  if (j.client_gone || peer_closed(j.fd)) {
    j.client_gone = true;
    return true;
  }
  if (s.abort_all) {
    j.aborted = true;
    return true;
  }
  if (Clock::now() > j.deadline) {
    j.timed_out = true;
    return true;
  }
  return false;
}

// Reads and checks a request; `job` is set first, so that an error names uploads as the
// client knows them.
void prepare(State& s, const httplib::Request& hreq, bool edit, std::shared_ptr<Job>& job) {
  if (s.stopping) {
    throw ApiError(503, "the server is shutting down", "", "shutting_down", "server_error");
  }
  job = std::make_shared<Job>();
  job->id = t_served.id;
  job->edit = edit;
  json body;
  std::vector<std::pair<std::string, const httplib::MultipartFormData*>> images;
  if (edit) {
    if (!hreq.is_multipart_form_data()) {
      throw ApiError(400, "/v1/images/edits takes multipart/form-data (image[] files and fields)",
                     "", "invalid_content_type");
    }
    std::multimap<std::string, std::string> fields;
    for (const auto& [name, part] : hreq.files) {
      if (name == "image" || name == "image[]") {
        images.push_back({name, &part});
      } else if (!part.filename.empty()) {
        throw ApiError(400,
                       "unexpected file field '" + name.substr(0, 64) + "'; images go in image[]",
                       name.substr(0, 64), "unknown_parameter");
      } else {
        fields.emplace(name, part.content);
      }
    }
    body = form_fields_to_json(fields);
  } else {
    if (hreq.is_multipart_form_data()) {
      throw ApiError(400, "/v1/images/generations takes a JSON body (application/json)", "",
                     "invalid_content_type");
    }
    body = json::parse(hreq.body, nullptr, false);
    if (body.is_discarded()) {
      throw ApiError(400, "the request body is not valid JSON", "", "invalid_json");
    }
  }
  job->req = parse_request(body, edit, s.opt.limits);
  ImageRequest& r = job->req;
  t_served.user = r.user;
  if (!r.model.empty() && r.model != s.model_id) {
    throw ApiError(400,
                   "model '" + r.model.substr(0, 128) +
                       "' is not served here; this server serves '" + s.model_id + "'",
                   "model", "model_not_found");
  }
  if (edit) {
    if (images.empty())
      throw ApiError(400, "an edit needs at least one image (image[])", "image",
                     "missing_required");
    if (static_cast<int>(images.size()) > s.opt.limits.max_references) {
      throw ApiError(400,
                     std::to_string(images.size()) + " images, over this server's limit of " +
                         std::to_string(s.opt.limits.max_references) + " (--max-references)",
                     "image", "too_many_images");
    }
  }
  job->dir = std::make_unique<TempDir>();
  for (size_t i = 0; i < images.size(); ++i) {
    const std::string what =
        "image " + std::to_string(i + 1) + " (" + images[i].second->filename.substr(0, 64) + ")";
    const std::string& bytes = images[i].second->content;
    const auto [w, h] = image_header_size(bytes, what);
    if (w <= 0 || h <= 0 || w * h > s.opt.limits.max_image_pixels) {
      throw ApiError(400,
                     what + " is " + std::to_string(w) + "x" + std::to_string(h) +
                         ", over this server's limit of " +
                         std::to_string(s.opt.limits.max_image_pixels) +
                         " pixels (--max-image-pixels)",
                     "image", "image_too_large");
    }
    const std::string path = job->dir->path() + "/image" + std::to_string(i);
    std::ofstream f(path, std::ios::binary);
    f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    f.close();
    if (!f) throw ApiError(500, "cannot store an uploaded image", "", "", "server_error");
    r.generate.references.push_back(path);
  }
  // The token layout (tokenizer and image headers, no weights) and the predicted bytes.
  job->layout = generate_layout(s.opt.model, r.generate);
  PredictRequest p;
  p.model = job->layout.transformer;
  p.text_tokens = job->layout.text_tokens;
  p.target_tokens = job->layout.target_tokens;
  p.ref_tokens = job->layout.image_tokens;
  p.steps = std::max(1, r.generate.steps);
  p.cfg = job->layout.cfg;
  const KVPrediction pred = predict(p);
  job->bytes = (r.generate.kv_cache ? pred.kv_bytes : 0) + pred.activation_bytes;
  if (s.opt.memory_budget > 0 && job->bytes > s.opt.memory_budget) {
    s.metrics.count("rejected_memory");
    throw ApiError(400,
                   "the request needs about " + std::to_string(job->bytes) + " bytes (KV cache " +
                       std::to_string(r.generate.kv_cache ? pred.kv_bytes : 0) + ", activations " +
                       std::to_string(pred.activation_bytes) + ") for " +
                       std::to_string(job->layout.width) + "x" +
                       std::to_string(job->layout.height) + " with " +
                       std::to_string(job->layout.image_tokens.size()) +
                       " image(s), over this server's memory budget of " +
                       std::to_string(s.opt.memory_budget) +
                       " bytes (--memory-budget); ask for a smaller size or fewer images",
                   "size", "memory_budget_exceeded");
  }
  job->fd = find_connection_socket(hreq);
  job->deadline =
      Clock::now() + std::chrono::microseconds(static_cast<int64_t>(s.opt.timeout_seconds * 1e6));
}

struct Image {
  std::string b64;
  uint64_t seed = 0;
  double seconds = 0;
  GenerateResult meta;  // without pixels
};

struct Emitter {
  std::function<void(int image, const StepEvent&)> step;
  std::function<void(int image, int index, const std::string& b64)> partial;
  std::function<void(int image, const Image&)> completed;
};

std::string png_b64(const Job& j, const std::string& name, const GenerateResult& r) {
  const std::string path = j.dir->path() + "/" + name + ".png";
  save_png(path, r);
  std::string b = base64(read_whole(path));
  std::error_code ec;
  std::filesystem::remove(path, ec);
  return b;
}

std::vector<Image> run(State& s, Job& j, const Emitter& emit) {
  s.admission->acquire(j.bytes, [&] { return should_stop(s, j); });
  struct Release {
    State& s;
    int64_t bytes;
    ~Release() { s.admission->release(bytes); }
  } release{s, j.bytes};
  std::vector<Image> out;
  for (int i = 0; i < j.req.n; ++i) {
    GenerateRequest g = j.req.generate;
    g.seed = j.req.generate.seed + static_cast<uint64_t>(i);
    GenerateControl c;
    c.cancelled = [&] { return should_stop(s, j); };
    c.on_step = [&](const StepEvent& e) {
      s.metrics.step(e.seconds);
      if (emit.step) emit.step(i, e);
    };
    c.previews = j.req.stream ? j.req.partial_images : 0;
    if (emit.partial) {
      c.on_preview = [&](int index, const StepEvent&, const GenerateResult& preview) {
        emit.partial(i, index, png_b64(j, "preview", preview));
      };
    }
    c.store = s.store;
    const auto t0 = Clock::now();
    GenerateResult r = generate(s.opt.model, g, {}, c);
    Image im;
    im.seed = g.seed;
    im.b64 = png_b64(j, "image" + std::to_string(i), r);
    im.seconds = since(t0);
    r.pixels.clear();
    r.pixels.shrink_to_fit();
    im.meta = std::move(r);
    s.metrics.count("images");
    if (emit.completed) emit.completed(i, im);
    out.push_back(std::move(im));
  }
  return out;
}

json usage_of(const Job& j, int images) {
  int64_t image_tokens = 0;
  for (int64_t t : j.layout.image_tokens) image_tokens += t;
  const int64_t in = j.layout.text_tokens + image_tokens;
  const int64_t out = j.layout.target_tokens * images;
  return json{{"input_tokens", in},
              {"input_tokens_details",
               {{"text_tokens", j.layout.text_tokens}, {"image_tokens", image_tokens}}},
              {"output_tokens", out},
              {"total_tokens", in + out}};
}

json flowkv_of(const Image& im) {
  json stages = json::array();
  for (const StageReport& st : im.meta.stages) {
    stages.push_back({{"name", st.name}, {"seconds", st.seconds}, {"detail", st.detail}});
  }
  return json{{"seed", im.seed},
              {"seconds", im.seconds},
              {"width", im.meta.width},
              {"height", im.meta.height},
              {"channels", im.meta.channels},
              {"store_hits", im.meta.store_hits},
              {"store_misses", im.meta.store_misses},
              {"prompt_truncated", im.meta.prompt_truncated},
              {"stages", stages}};
}

std::string store_keys_header(const std::vector<Image>& images) {
  std::set<std::string> keys;
  for (const Image& im : images) keys.insert(im.meta.store_keys.begin(), im.meta.store_keys.end());
  std::string h;
  for (const std::string& k : keys) h += (h.empty() ? "" : ",") + k;
  return h;
}

std::string seconds_text(double s) {
  char b[32];
  std::snprintf(b, sizeof b, "%g", s);
  return b;
}

// The library names an uploaded image by the file it was stored as; the client knows it as
// "image N". The server's temporary paths stay out of its answers.
std::string scrub(const Job* j, std::string message) {
  if (!j || !j->dir) return message;
  const std::vector<std::string>& refs = j->req.generate.references;
  for (size_t i = refs.size(); i-- > 0;) {
    const std::string name = "image " + std::to_string(i + 1);
    for (size_t at; (at = message.find(refs[i])) != std::string::npos;) {
      message.replace(at, refs[i].size(), name);
    }
  }
  for (size_t at; (at = message.find(j->dir->path())) != std::string::npos;) {
    message.replace(at, j->dir->path().size(), "(upload)");
  }
  return message;
}

// An exception from a request -> (status, OpenAI error body); 499: the client is gone.
std::pair<int, json> error_of(State& s, const Job* j, std::exception_ptr ep) {
  try {
    std::rethrow_exception(ep);
  } catch (const ApiError& e) {
    if (e.code == "queue_full") s.metrics.count("rejected_queue_full");
    return {e.status, error_body(e.what(), e.type, e.param, e.code)};
  } catch (const Cancelled& e) {
    if (j && j->timed_out) {
      s.metrics.count("timeouts");
      return {504, error_body("the request ran past this server's time limit of " +
                                  seconds_text(s.opt.timeout_seconds) + " s (--timeout)",
                              "server_error", "", "timeout")};
    }
    if (j && j->aborted) {
      s.metrics.count("shutdown_aborted");
      return {503, error_body("the server is shutting down; the request was stopped",
                              "server_error", "", "shutting_down")};
    }
    s.metrics.count("cancelled");
    return {499, json()};
  } catch (const KVBudgetError& e) {
    return {503, error_body(scrub(j, e.what()), "server_error", "", "memory_budget")};
  } catch (const Error& e) {
    return {400, error_body(scrub(j, e.what()), "invalid_request_error", "", "invalid_request")};
  } catch (const std::exception& e) {
    std::fprintf(stderr, "request %llu: internal error: %s\n",
                 static_cast<unsigned long long>(t_served.id), e.what());
    return {500, error_body("internal server error", "server_error", "", "internal_error")};
  } catch (...) {
    return {500, error_body("internal server error", "server_error", "", "internal_error")};
  }
}

void send_error(httplib::Response& res, int status, const json& body) {
  res.status = status;
  if (status == 503) res.set_header("Retry-After", "5");
  res.set_content(body.dump(), "application/json");
}

std::string sse(const std::string& event, const json& data) {
  return "event: " + event + "\ndata: " + data.dump() + "\n\n";
}

void handle_images(State& s, const httplib::Request& hreq, httplib::Response& res, bool edit) {
  std::shared_ptr<Job> job;
  try {
    prepare(s, hreq, edit, job);
    if (!job->req.stream) {
      const std::vector<Image> images = run(s, *job, {});
      json data = json::array();
      json extra = json::array();
      for (const Image& im : images) {
        data.push_back({{"b64_json", im.b64}});
        extra.push_back(flowkv_of(im));
      }
      const Image& last = images.back();
      json body = {
          {"created", unix_now()},
          {"data", data},
          {"output_format", "png"},
          {"size", std::to_string(last.meta.width) + "x" + std::to_string(last.meta.height)},
          {"usage", usage_of(*job, job->req.n)},
          {"flowkv", {{"request_id", job->id}, {"images", extra}}}};
      res.status = 200;
      if (const std::string k = store_keys_header(images); !k.empty())
        res.set_header("X-Flowkv-Store-Keys", k);
      res.set_content(body.dump(), "application/json");
      return;
    }
    if (s.admission->full()) {
      throw ApiError(503, "the server is busy (--queue is full); retry after a while", "",
                     "queue_full", "server_error");
    }
  } catch (...) {
    auto [status, body] = error_of(s, job.get(), std::current_exception());
    if (status == 499) {
      t_served.outcome = 499;
      res.status = 499;  // never reaches the client: it is gone
      res.set_header("Connection", "close");
      return;
    }
    send_error(res, status, body);
    return;
  }
  // A stream: headers now, events as the request runs.
  const std::string prefix = edit ? "image_edit" : "image_generation";
  res.status = 200;
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");
  res.set_chunked_content_provider(
      "text/event-stream", [&s, job, prefix](size_t, httplib::DataSink& sink) {
        Job& j = *job;
        auto write = [&](const std::string& text) {
          if (j.client_gone) return;
          if (!sink.write(text.data(), text.size())) j.client_gone = true;
        };
        const std::string size_text =
            std::to_string(j.layout.width) + "x" + std::to_string(j.layout.height);
        auto common = [&](json e) {
          e["size"] = size_text;
          e["quality"] = "auto";
          e["background"] = "auto";
          e["output_format"] = "png";
          e["created_at"] = unix_now();
          return e;
        };
        Emitter emit;
        if (j.req.progress_events) {
          emit.step = [&](int image, const StepEvent& e) {
            write(sse("flowkv.progress", {{"type", "flowkv.progress"},
                                          {"image_index", image},
                                          {"step", e.step},
                                          {"steps", e.steps},
                                          {"seconds", e.seconds},
                                          {"cached", e.conditioning_cached},
                                          {"from_store", e.from_store}}));
          };
        }
        emit.partial = [&](int, int index, const std::string& b64) {
          write(sse(prefix + ".partial_image", common({{"type", prefix + ".partial_image"},
                                                       {"b64_json", b64},
                                                       {"partial_image_index", index}})));
        };
        emit.completed = [&](int image, const Image& im) {
          json e = common({{"type", prefix + ".completed"}, {"b64_json", im.b64}});
          e["size"] = std::to_string(im.meta.width) + "x" + std::to_string(im.meta.height);
          e["usage"] = usage_of(j, 1);
          e["flowkv"] = flowkv_of(im);
          e["flowkv"]["image_index"] = image;
          e["flowkv"]["store_keys"] = im.meta.store_keys;
          write(sse(prefix + ".completed", e));
        };
        try {
          run(s, j, emit);
        } catch (...) {
          auto [status, body] = error_of(s, &j, std::current_exception());
          t_served.outcome = status;
          if (status != 499) {
            // OpenAI's streams report a failure as an "error" event carrying the error object.
            write(sse("error", body));
          }
        }
        if (j.client_gone) {
          if (!t_served.outcome) t_served.outcome = 499;
          return false;
        }
        sink.done();
        return true;
      });
}

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
  auto s = std::make_unique<State>();
  s->opt = options;
  s->model_id = options.model_id;
  if (s->model_id.empty()) {
    std::filesystem::path p = std::filesystem::absolute(options.model).lexically_normal();
    if (p.filename().empty()) p = p.parent_path();
    s->model_id = p.filename().string();
  }
  // Fails fast on a folder that is not a pipeline: reads model_index.json and the tokenizer.
  {
    GenerateRequest probe;
    probe.prompt = "a";
    probe.width = probe.height = 256;
    (void)generate_layout(options.model, probe);
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
    res.set_content(st.metrics.render(*st.store), "text/plain; version=0.0.4");
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
  std::fprintf(stderr, "serving %s as '%s': %d worker(s), queue %d\n", options.model.c_str(),
               st.model_id.c_str(), options.workers, options.queue);

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
