// The connections of flowkv serve: buffered reads under per-phase deadlines, body limits for
// every transfer encoding, and a connection pool in which slow clients give way (connection.h).
#include "connection.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace flowkv::server {

namespace {

using Clock = std::chrono::steady_clock;

constexpr size_t kBufferBytes = 16 << 10;
// A read or write with no deadline of its phase still waits at most this long for the peer.
constexpr double kIdleIoSeconds = 30;

thread_local Connection* t_current = nullptr;

Clock::time_point after(double seconds) {
  return Clock::now() + std::chrono::microseconds(static_cast<int64_t>(seconds * 1e6));
}

// Milliseconds to wait for `deadline`, capped so that a waiting thread looks again now and then.
int wait_ms(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  return static_cast<int>(std::clamp<int64_t>(left.count(), 0, 250));
}

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

bool all_digits(const std::string& s) {
  return !s.empty() && s.size() <= 19 &&
         std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

void address_of(const sockaddr_storage& a, std::string& ip, int& port) {
  char buf[INET6_ADDRSTRLEN] = {0};
  if (a.ss_family == AF_INET) {
    const auto& in = reinterpret_cast<const sockaddr_in&>(a);
    inet_ntop(AF_INET, &in.sin_addr, buf, sizeof buf);
    port = ntohs(in.sin_port);
  } else if (a.ss_family == AF_INET6) {
    const auto& in6 = reinterpret_cast<const sockaddr_in6&>(a);
    inet_ntop(AF_INET6, &in6.sin6_addr, buf, sizeof buf);
    port = ntohs(in6.sin6_port);
  }
  ip = buf;
}

}  // namespace

// ---- Connection

Connection::Connection(int fd, const ConnectionLimits& limits, ConnectionRegistry& registry,
                       const std::atomic<bool>& stopping)
    : fd_(fd), limits_(limits), registry_(registry), stopping_(stopping), buf_(kBufferBytes) {
  set_phase(Phase::kIdle);
  registry_.add(this);
}

Connection::~Connection() {
  registry_.remove(this);
}

void Connection::set_phase(Phase p) {
  phase_start_ns_ =
      std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
  phase_ = p;
}

Clock::time_point Connection::phase_start() const {
  return Clock::time_point(std::chrono::nanoseconds(phase_start_ns_.load()));
}

void Connection::evict() {
  evicted_ = true;
  ::shutdown(fd_, SHUT_RDWR);
}

Clock::time_point Connection::read_deadline() const {
  switch (phase_.load()) {
    case Phase::kHeaders:
      return header_deadline_;
    case Phase::kBody:
      return body_start_ +
             std::chrono::microseconds(static_cast<int64_t>(
                 (limits_.body_grace_seconds +
                  static_cast<double>(body_bytes_) / static_cast<double>(limits_.min_body_rate)) *
                 1e6));
    default:
      return after(kIdleIoSeconds);
  }
}

ssize_t Connection::fill(Clock::time_point deadline, bool* timed_out) {
  *timed_out = false;
  while (true) {
    if (evicted_ || (stopping_ && phase_ == Phase::kIdle)) return -1;
    const int ms = wait_ms(deadline);
    if (ms <= 0 && Clock::now() >= deadline) {
      *timed_out = true;
      return -1;
    }
    pollfd p{fd_, POLLIN, 0};
    const int r = ::poll(&p, 1, ms);
    if (r < 0) {
      if (errno == EINTR) continue;
      return -1;
    }
    if (r == 0) continue;
    const ssize_t n = ::recv(fd_, buf_.data(), buf_.size(), 0);
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
      return -1;
    }
    off_ = 0;
    end_ = static_cast<size_t>(n);
    return n;
  }
}

bool Connection::is_readable() const {
  if (off_ < end_) return true;
  pollfd p{fd_, POLLIN, 0};
  return ::poll(&p, 1, 0) > 0;
}

bool Connection::is_writable() const {
  pollfd p{fd_, POLLOUT, 0};
  return !evicted_ && ::poll(&p, 1, static_cast<int>(limits_.write_seconds * 1000)) > 0 &&
         (p.revents & POLLOUT);
}

ssize_t Connection::read(char* ptr, size_t size) {
  if (refusal_ != ReadRefusal::kNone || size == 0) return -1;
  if (off_ == end_) {
    bool timed_out = false;
    const ssize_t n = fill(read_deadline(), &timed_out);
    if (n <= 0) {
      if (timed_out && phase_ == Phase::kHeaders) {
        refusal_ = ReadRefusal::kHeaderTimeout;
        ++registry_.header_timeouts;
      } else if (timed_out && phase_ == Phase::kBody) {
        refusal_ = ReadRefusal::kBodyTimeout;
        ++registry_.body_timeouts;
      } else if (evicted_) {
        refusal_ = ReadRefusal::kEvicted;
      }
      return n;
    }
  }
  const size_t n = std::min(size, end_ - off_);
  if (phase_ == Phase::kBody) {
    if (body_bytes_ + static_cast<int64_t>(n) > body_limit_) {
      refusal_ = ReadRefusal::kTooLarge;
      ++registry_.too_large;
      return -1;
    }
    body_bytes_ += static_cast<int64_t>(n);
  }
  std::memcpy(ptr, buf_.data() + off_, n);
  off_ += n;
  return static_cast<ssize_t>(n);
}

ssize_t Connection::write(const char* ptr, size_t size) {
  const auto deadline = after(limits_.write_seconds);
  while (true) {
    if (evicted_) return -1;
    const ssize_t n = ::send(fd_, ptr, size, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n >= 0) return n;
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) return -1;
    const int ms = wait_ms(deadline);
    if (ms <= 0 && Clock::now() >= deadline) return -1;
    pollfd p{fd_, POLLOUT, 0};
    if (::poll(&p, 1, ms) < 0 && errno != EINTR) return -1;
  }
}

void Connection::get_remote_ip_and_port(std::string& ip, int& port) const {
  sockaddr_storage a{};
  socklen_t l = sizeof a;
  port = 0;
  ip.clear();
  if (::getpeername(fd_, reinterpret_cast<sockaddr*>(&a), &l) == 0) address_of(a, ip, port);
}

void Connection::get_local_ip_and_port(std::string& ip, int& port) const {
  sockaddr_storage a{};
  socklen_t l = sizeof a;
  port = 0;
  ip.clear();
  if (::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &l) == 0) address_of(a, ip, port);
}

bool Connection::wait_for_request() {
  set_phase(Phase::kIdle);
  refusal_ = ReadRefusal::kNone;
  has_body_ = false;
  body_bytes_ = 0;
  if (off_ == end_) {
    bool timed_out = false;
    if (fill(after(limits_.keep_alive_seconds), &timed_out) <= 0) return false;
  }
  header_deadline_ = after(limits_.header_seconds);
  set_phase(Phase::kHeaders);
  return true;
}

void Connection::headers_read(const httplib::Request& req) {
  body_start_ = Clock::now();
  body_bytes_ = 0;
  body_limit_ = 0;
  set_phase(Phase::kBody);
  auto refuse = [&](ReadRefusal r) {
    if (refusal_ == ReadRefusal::kNone) {
      refusal_ = r;
      ++(r == ReadRefusal::kTooLarge ? registry_.too_large : registry_.refused);
    }
  };
  const size_t te_count = req.get_header_value_count("Transfer-Encoding");
  const size_t cl_count = req.get_header_value_count("Content-Length");
  const std::string te = lower(req.get_header_value("Transfer-Encoding"));
  const std::string cl = req.get_header_value("Content-Length");
  const std::string ce = lower(req.get_header_value("Content-Encoding"));
  // (DELETE usually has no body and no length; httplib reads none then, and neither do we.)
  const bool wants_body = req.method == "POST" || req.method == "PUT" || req.method == "PATCH";
  if (te_count > 0) {
    has_body_ = true;
    // Chunked framing adds a few bytes a chunk; the data itself is held to max_body by the
    // handlers. Anything but a single "chunked" (or chunked beside a Content-Length: the classic
    // request-smuggling pair) is refused.
    if (te_count > 1 || te != "chunked" || cl_count > 0) refuse(ReadRefusal::kTransferEncoding);
    body_limit_ = limits_.max_body + limits_.max_body / 8 + (64 << 10);
  } else if (cl_count > 0) {
    if (cl_count > 1 || !all_digits(cl)) {
      refuse(ReadRefusal::kTransferEncoding);
    } else {
      const int64_t n = std::stoll(cl);
      has_body_ = n > 0;
      body_limit_ = n;
      if (n > limits_.max_body) refuse(ReadRefusal::kTooLarge);
    }
  } else if (wants_body) {
    refuse(ReadRefusal::kLengthRequired);
  }
  if (has_body_ && !ce.empty() && ce != "identity") refuse(ReadRefusal::kEncoding);
}

void Connection::handling() {
  set_phase(Phase::kHandling);
}

// ---- ConnectionRegistry

void ConnectionRegistry::add(Connection* c) {
  std::lock_guard<std::mutex> l(m_);
  live_.push_back(c);
}

void ConnectionRegistry::remove(Connection* c) {
  std::lock_guard<std::mutex> l(m_);
  live_.remove(c);
}

size_t ConnectionRegistry::size() const {
  std::lock_guard<std::mutex> l(m_);
  return live_.size();
}

bool ConnectionRegistry::evict_one(std::chrono::milliseconds min_wait) {
  std::lock_guard<std::mutex> l(m_);
  const auto latest = Clock::now() - min_wait;
  // Connections waiting for a request or its headers first, then those reading a body; those
  // whose handler runs (generating, queued, streaming) never give way.
  for (const bool bodies : {false, true}) {
    Connection* oldest = nullptr;
    for (Connection* c : live_) {
      const Connection::Phase p = c->phase();
      const bool candidate =
          bodies ? p == Connection::Phase::kBody
                 : (p == Connection::Phase::kIdle || p == Connection::Phase::kHeaders);
      if (!candidate || c->evicted() || c->phase_start() > latest) continue;
      if (!oldest || c->phase_start() < oldest->phase_start()) oldest = c;
    }
    if (oldest) {
      oldest->evict();
      ++evicted;
      return true;
    }
  }
  return false;
}

// ---- ConnectionPool

ConnectionPool::ConnectionPool(size_t threads, ConnectionRegistry& registry)
    : max_threads_(std::max<size_t>(threads, 2)), registry_(registry) {
  janitor_ = std::thread([this] { janitor(); });
}

ConnectionPool::~ConnectionPool() {
  shutdown();
}

void ConnectionPool::enqueue(std::function<void()> fn) {
  std::lock_guard<std::mutex> l(m_);
  jobs_.push_back(std::move(fn));
  if (idle_ >= jobs_.size()) {
    cv_.notify_one();
  } else if (threads_.size() < max_threads_) {
    threads_.emplace_back([this] { work(); });
  } else {
    jcv_.notify_one();  // the janitor makes a reading connection give way
  }
}

void ConnectionPool::work() {
  while (true) {
    std::function<void()> job;
    {
      std::unique_lock<std::mutex> l(m_);
      ++idle_;
      cv_.wait(l, [this] { return stop_ || !jobs_.empty(); });
      --idle_;
      if (jobs_.empty()) return;  // stopping, nothing left
      job = std::move(jobs_.front());
      jobs_.pop_front();
    }
    job();
  }
}

void ConnectionPool::janitor() {
  std::unique_lock<std::mutex> l(m_);
  while (!stop_) {
    jcv_.wait_for(l, std::chrono::milliseconds(50));
    if (stop_) break;
    const size_t waiting = jobs_.size() > idle_ ? jobs_.size() - idle_ : 0;
    if (waiting == 0 || threads_.size() < max_threads_) continue;
    l.unlock();
    // One connection gives way per accepted connection that waits for a thread; one that has
    // waited for its headers for less than 100 ms is most likely a real client mid-request.
    for (size_t i = 0; i < waiting; ++i) {
      if (!registry_.evict_one(std::chrono::milliseconds(100))) break;
    }
    l.lock();
  }
}

void ConnectionPool::shutdown() {
  std::vector<std::thread> threads;
  {
    std::lock_guard<std::mutex> l(m_);
    if (stop_ && threads_.empty() && !janitor_.joinable()) return;
    stop_ = true;
    threads.swap(threads_);
  }
  cv_.notify_all();
  jcv_.notify_all();
  for (std::thread& t : threads) t.join();
  if (janitor_.joinable()) janitor_.join();
}

// ---- HardenedServer

HardenedServer::HardenedServer(const ConnectionLimits& limits) : limits_(limits) {
  new_task_queue = [this] { return new ConnectionPool(limits_.threads, registry_); };
  // httplib's own Content-Length check stays as a second line; the Connection refuses first.
  set_payload_max_length(static_cast<size_t>(limits_.max_body));
  set_keep_alive_max_count(static_cast<size_t>(limits_.max_requests));
  set_keep_alive_timeout(static_cast<time_t>(limits_.keep_alive_seconds));
}

Connection* HardenedServer::current() {
  return t_current;
}

bool HardenedServer::process_and_close_socket(socket_t sock) {
  bool ret = false;
  {
    Connection c(sock, limits_, registry_, stopping_);
    t_current = &c;
    for (int i = 0; i < limits_.max_requests && svr_sock_ != INVALID_SOCKET; ++i) {
      if (!c.wait_for_request()) break;
      bool closed = false;
      const bool last = i + 1 == limits_.max_requests;
      ret = process_request(c, last, closed, [&c](httplib::Request& r) { c.headers_read(r); });
      if (!ret || closed || c.closing()) break;
    }
    t_current = nullptr;
  }
  ::shutdown(sock, SHUT_RDWR);
  ::close(sock);
  return ret;
}

std::pair<int, std::string> refusal_answer(ReadRefusal r, int64_t max_body) {
  switch (r) {
    case ReadRefusal::kTooLarge:
      return {413, "the request body is larger than this server's limit of " +
                       std::to_string(max_body) + " bytes (--max-body)"};
    case ReadRefusal::kLengthRequired:
      return {411, "a request body needs a Content-Length header (or chunked Transfer-Encoding)"};
    case ReadRefusal::kEncoding:
      return {415,
              "compressed request bodies (Content-Encoding) are not accepted; send the body "
              "uncompressed"};
    case ReadRefusal::kTransferEncoding:
      return {400,
              "the body's length is ambiguous: use one Content-Length of decimal digits, or "
              "Transfer-Encoding: chunked alone"};
    case ReadRefusal::kHeaderTimeout:
      return {408, "the request's headers did not arrive in time"};
    case ReadRefusal::kBodyTimeout:
      return {408, "the request body arrived too slowly"};
    case ReadRefusal::kEvicted:
      return {503, "the server is busy; the connection gave way to another"};
    case ReadRefusal::kNone:
      break;
  }
  return {400, "malformed request"};
}

}  // namespace flowkv::server
