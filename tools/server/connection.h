// The connections of flowkv serve (state.h): how bytes come off a socket, within which deadlines,
// and which connection gives way when every connection thread is taken. Internal to
// tools/server.
//
// cpp-httplib 0.11.4 (Debian's) reads a connection with a fresh 4 KiB-buffered stream per
// request (bytes a client pipelined behind the first request are lost), times out per recv()
// only (a client sending a byte every few seconds holds its thread forever), and limits a body
// by its Content-Length only (a chunked body, or one without a length, is read whole). Its
// Server lets a subclass take over a connection (process_and_close_socket is virtual,
// process_request protected), so flowkv keeps httplib's request parser, router, multipart
// parser and response writer, and owns the rest here:
//   - one buffered Connection (an httplib::Stream) per socket, kept across the requests of a
//     keep-alive connection, so pipelined requests are each answered in order;
//   - deadlines per phase: the request line and headers within --header-timeout of their first
//     byte, the body at an average of at least kMinBodyRate after a grace period, an idle
//     keep-alive connection closed after kKeepAliveSeconds;
//   - the body's raw bytes counted as they are read, whatever the transfer encoding: past the
//     limit the read fails and the request gets 413;
//   - a request refused from its headers alone (too long a Content-Length, no length, an
//     unknown Transfer-Encoding or a Content-Encoding) is answered without reading its body,
//     and the connection is closed after it;
//   - connection threads in a pool of their own; when a connection is accepted and no thread is
//     free, the connection that has waited longest for its next request's headers or body gives
//     way (its socket is shut down), so slow clients cannot starve a real one or /health.
#pragma once

#include <httplib.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <list>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace flowkv::server {

struct ConnectionLimits {
  double header_seconds = 10;        // request line + headers, from their first byte
  double keep_alive_seconds = 5;     // idle between two requests of one connection
  double body_grace_seconds = 10;    // a body may start slowly ...
  int64_t min_body_rate = 16 << 10;  // ... then must average at least this many bytes/s
  double write_seconds = 30;         // one write may wait this long for the client to read
  int64_t max_body = int64_t{64} << 20;
  int max_requests = 100;  // per connection
  size_t threads = 24;     // connection threads
};

// Why a connection stopped reading. Requests refused from their headers (kTooLarge with a
// Content-Length, kLengthRequired, kEncoding, kTransferEncoding) are answered without reading
// their body; the others happened while reading it.
enum class ReadRefusal {
  kNone,
  kTooLarge,          // 413: the body is over --max-body (declared or counted)
  kLengthRequired,    // 411: a body with neither Content-Length nor chunked encoding
  kEncoding,          // 415: Content-Encoding (compressed bodies are not taken)
  kTransferEncoding,  // 501: a Transfer-Encoding other than chunked, or with Content-Length
  kHeaderTimeout,     // 408: headers did not arrive in time
  kBodyTimeout,       // 408: the body came slower than the minimum rate
  kEvicted,           // the connection gave way to a new one
};

class ConnectionRegistry;

// One accepted socket, read through a buffer kept for the connection's whole life.
class Connection final : public httplib::Stream {
 public:
  enum class Phase { kIdle, kHeaders, kBody, kHandling };

  // `stopping`: the server stops; a connection waiting for its next request closes.
  Connection(int fd, const ConnectionLimits& limits, ConnectionRegistry& registry,
             const std::atomic<bool>& stopping);
  ~Connection() override;  // unregisters; the socket is closed by its owner afterwards
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  // httplib::Stream
  bool is_readable() const override;
  bool is_writable() const override;
  ssize_t read(char* ptr, size_t size) override;
  ssize_t write(const char* ptr, size_t size) override;
  void get_remote_ip_and_port(std::string& ip, int& port) const override;
  void get_local_ip_and_port(std::string& ip, int& port) const override;
  socket_t socket() const override { return fd_; }

  // Waits (at most keep_alive_seconds) for the first byte of the next request; false when the
  // client closed, stayed silent or the connection was evicted.
  bool wait_for_request();
  // The headers are in (httplib's setup_request): checks them for a refusal and starts the
  // body's clock and count.
  void headers_read(const httplib::Request& req);
  // The handler runs: no read deadline beyond the per-recv one.
  void handling();

  ReadRefusal refusal() const { return refusal_; }
  bool has_body() const { return has_body_; }
  // The connection must close after the current response (a refusal, an unread body).
  void close_after() { close_after_ = true; }
  bool closing() const { return close_after_ || refusal_ != ReadRefusal::kNone; }
  int64_t body_bytes() const { return body_bytes_; }

  // Called by the registry (another thread): shuts the socket down so that every read fails.
  void evict();
  bool evicted() const { return evicted_.load(); }
  Phase phase() const { return phase_.load(); }
  std::chrono::steady_clock::time_point phase_start() const;

 private:
  void set_phase(Phase p);
  // Fills the buffer; waits at most until `deadline`. <0 error/timeout, 0 EOF.
  ssize_t fill(std::chrono::steady_clock::time_point deadline, bool* timed_out);
  std::chrono::steady_clock::time_point read_deadline() const;

  const int fd_;
  const ConnectionLimits& limits_;
  ConnectionRegistry& registry_;
  const std::atomic<bool>& stopping_;
  std::vector<char> buf_;
  size_t off_ = 0, end_ = 0;
  std::atomic<Phase> phase_{Phase::kIdle};
  std::atomic<int64_t> phase_start_ns_{0};
  std::chrono::steady_clock::time_point header_deadline_;
  std::chrono::steady_clock::time_point body_start_;
  int64_t body_bytes_ = 0;
  int64_t body_limit_ = 0;
  bool has_body_ = false;
  bool close_after_ = false;
  ReadRefusal refusal_ = ReadRefusal::kNone;
  std::atomic<bool> evicted_{false};
};

// Every live connection, for eviction and the figures of /metrics.
class ConnectionRegistry {
 public:
  void add(Connection* c);
  void remove(Connection* c);
  // Shuts down the connection that has waited longest for its next request (idle, headers,
  // then body), if it has waited at least `min_wait`; false when none qualifies.
  bool evict_one(std::chrono::milliseconds min_wait);
  size_t size() const;

  std::atomic<int64_t> evicted{0}, header_timeouts{0}, body_timeouts{0}, too_large{0}, refused{0};

 private:
  mutable std::mutex m_;
  std::list<Connection*> live_;
};

// The connection threads: `threads` of them, started as needed. A connection accepted while all
// are taken waits for one, and makes the longest-waiting reading connection give way.
class ConnectionPool final : public httplib::TaskQueue {
 public:
  ConnectionPool(size_t threads, ConnectionRegistry& registry);
  ~ConnectionPool() override;
  void enqueue(std::function<void()> fn) override;
  void shutdown() override;

 private:
  void work();
  void janitor();
  const size_t max_threads_;
  ConnectionRegistry& registry_;
  std::mutex m_;
  std::condition_variable cv_;   // workers
  std::condition_variable jcv_;  // the janitor
  std::deque<std::function<void()>> jobs_;
  std::vector<std::thread> threads_;
  std::thread janitor_;
  size_t idle_ = 0;
  bool stop_ = false;
};

// httplib's Server with the connection loop above. `current()` is the connection of the
// request this thread is answering (nullptr outside a request).
class HardenedServer final : public httplib::Server {
 public:
  explicit HardenedServer(const ConnectionLimits& limits);
  ConnectionRegistry& registry() { return registry_; }
  static Connection* current();
  // Before httplib's stop(): connections idle between requests close now, not after their
  // keep-alive time.
  void stop_connections() { stopping_ = true; }

 private:
  bool process_and_close_socket(socket_t sock) override;
  ConnectionLimits limits_;
  ConnectionRegistry registry_;
  std::atomic<bool> stopping_{false};
};

// The status and message of a refusal (413, 411, 415, 501, 408).
std::pair<int, std::string> refusal_answer(ReadRefusal r, int64_t max_body);

}  // namespace flowkv::server
