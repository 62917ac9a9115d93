// flowkv serve's connection layer (tools/server/connection.h) in-process, over loopback sockets:
// pipelined requests, bodies over the limit in every transfer encoding, refusals from the
// headers, header deadlines and slow readers giving way to new connections. It runs under ASan +
// UBSan (scripts/sanitize.sh), where the whole-server client tests (server.hostile) do not.
#include "connection.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <memory>
#include <regex>
#include <string>
#include <thread>
#include <vector>

namespace flowkv::server {
namespace {

using namespace std::chrono_literals;

// A HardenedServer on a free loopback port with two routes: GET /ping and POST /echo (the body's
// size back), the refusals answered as the real server answers them.
class TestServer {
 public:
  explicit TestServer(ConnectionLimits limits) : svr_(limits) {
    svr_.set_pre_routing_handler([](const httplib::Request&, httplib::Response& res) {
      Connection* c = HardenedServer::current();
      if (c && c->refusal() != ReadRefusal::kNone) {
        res.status = refusal_answer(c->refusal(), 0).first;
        res.set_content("refused", "text/plain");
        return httplib::Server::HandlerResponse::Handled;
      }
      return httplib::Server::HandlerResponse::Unhandled;
    });
    svr_.set_error_handler([](const httplib::Request&, httplib::Response& res) {
      if (Connection* c = HardenedServer::current(); c && c->refusal() != ReadRefusal::kNone)
        res.status = refusal_answer(c->refusal(), 0).first;
    });
    svr_.set_logger([](const httplib::Request&, const httplib::Response& res) {
      if (Connection* c = HardenedServer::current(); c && c->has_body() && res.status >= 400)
        c->close_after();
    });
    svr_.Get("/ping", [](const httplib::Request& req, httplib::Response& res) {
      if (Connection* c = HardenedServer::current()) c->handling();
      res.set_content("pong " + req.get_header_value("X-N"), "text/plain");
    });
    svr_.Post("/echo", [](const httplib::Request& req, httplib::Response& res) {
      if (Connection* c = HardenedServer::current()) c->handling();
      res.set_content(std::to_string(req.body.size()), "text/plain");
    });
    port_ = svr_.bind_to_any_port("127.0.0.1");
    thread_ = std::thread([this] { svr_.listen_after_bind(); });
  }
  ~TestServer() {
    svr_.stop_connections();
    svr_.stop();
    thread_.join();
  }
  int port() const { return port_; }
  ConnectionRegistry& registry() { return svr_.registry(); }

 private:
  HardenedServer svr_;
  int port_ = 0;
  std::thread thread_;
};

int connect_to(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  return fd;
}

// Sends what it can (the server may close early); false once the peer stopped taking bytes.
bool send_all(int fd, const std::string& s) {
  size_t off = 0;
  while (off < s.size()) {
    const ssize_t n = ::send(fd, s.data() + off, s.size() - off, MSG_NOSIGNAL);
    if (n <= 0) return false;
    off += static_cast<size_t>(n);
  }
  return true;
}

// Everything until the peer closes, or `limit` passes.
std::string read_all(int fd, std::chrono::milliseconds limit = 10s) {
  std::string out;
  const auto until = std::chrono::steady_clock::now() + limit;
  char buf[65536];
  while (std::chrono::steady_clock::now() < until) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 100) <= 0) continue;
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

std::vector<int> statuses(const std::string& responses) {
  std::vector<int> out;
  static const std::regex kStatus("HTTP/1\\.1 (\\d{3})");
  for (auto it = std::sregex_iterator(responses.begin(), responses.end(), kStatus);
       it != std::sregex_iterator(); ++it) {
    out.push_back(std::stoi((*it)[1]));
  }
  return out;
}

ConnectionLimits small_limits() {
  ConnectionLimits l;
  l.max_body = 64 << 10;
  l.header_seconds = 1;
  l.keep_alive_seconds = 2;
  l.threads = 4;
  return l;
}

TEST(ServerConnection, PipelinedRequestsAreEachAnswered) {
  TestServer s(small_limits());
  const int fd = connect_to(s.port());
  std::string reqs;
  for (int i = 0; i < 50; ++i)
    reqs += "GET /ping HTTP/1.1\r\nHost: x\r\nX-N: " + std::to_string(i) + "\r\n\r\n";
  reqs += "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello";
  reqs += "GET /ping HTTP/1.1\r\nHost: x\r\nX-N: last\r\nConnection: close\r\n\r\n";
  ASSERT_TRUE(send_all(fd, reqs));
  const std::string out = read_all(fd);
  ::close(fd);
  EXPECT_EQ(statuses(out), std::vector<int>(52, 200));
  EXPECT_NE(out.find("pong 49"), std::string::npos);
  EXPECT_NE(out.find("\r\n\r\n5"), std::string::npos);
  EXPECT_NE(out.find("pong last"), std::string::npos);
}

TEST(ServerConnection, ChunkedBodyOverTheLimitIsCutOff) {
  TestServer s(small_limits());
  const int fd = connect_to(s.port());
  send_all(fd, "POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n");
  const std::string chunk = "4000\r\n" + std::string(0x4000, 'x') + "\r\n";
  size_t sent = 0;
  for (int i = 0; i < 4096 && send_all(fd, chunk); ++i) sent += chunk.size();  // up to 64 MiB
  const std::string out = read_all(fd);
  ::close(fd);
  EXPECT_EQ(statuses(out), std::vector<int>{413}) << out.substr(0, 200);
  EXPECT_LT(sent, size_t{16} << 20);  // the server stopped reading long before
  EXPECT_GE(s.registry().too_large.load(), 1);
}

TEST(ServerConnection, ChunkedBodyWithinTheLimitIsRead) {
  TestServer s(small_limits());
  const int fd = connect_to(s.port());
  send_all(fd,
           "POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
           "Connection: close\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n");
  const std::string out = read_all(fd);
  ::close(fd);
  EXPECT_EQ(statuses(out), std::vector<int>{200});
  EXPECT_NE(out.find("\r\n\r\n11"), std::string::npos) << out;
}

TEST(ServerConnection, RefusalsFromTheHeadersCloseTheConnection) {
  TestServer s(small_limits());
  const std::pair<std::string, int> cases[] = {
      {"Content-Length: 1000000\r\n", 413},
      {"", 411},
      {"Content-Length: 4\r\nContent-Encoding: gzip\r\n", 415},
      {"Transfer-Encoding: chunked\r\nContent-Length: 4\r\n", 400},
      {"Transfer-Encoding: gzip, chunked\r\n", 400},
      {"Content-Length: 4\r\nContent-Length: 5\r\n", 400},
      {"Content-Length: -4\r\n", 400},
  };
  for (const auto& [headers, status] : cases) {
    const int fd = connect_to(s.port());
    // A second request behind the refused one is never taken as its body's continuation.
    send_all(fd, "POST /echo HTTP/1.1\r\nHost: x\r\n" + headers +
                     "\r\nabcdGET /ping HTTP/1.1\r\nHost: x\r\n\r\n");
    const std::string out = read_all(fd);
    ::close(fd);
    EXPECT_EQ(statuses(out), std::vector<int>{status}) << headers << out.substr(0, 300);
  }
}

TEST(ServerConnection, SlowHeadersTimeOut) {
  TestServer s(small_limits());
  const int fd = connect_to(s.port());
  const auto t0 = std::chrono::steady_clock::now();
  send_all(fd, "GET /ping HTTP/1.1\r\n");
  std::string out;
  for (int i = 0; i < 30; ++i) {  // a header line every 200 ms, for 6 s at most
    if (!send_all(fd, "X-Slow: a\r\n")) break;
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 200) > 0) {
      out = read_all(fd, 1s);
      break;
    }
  }
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ::close(fd);
  EXPECT_LT(took, 4.0);
  EXPECT_GE(s.registry().header_timeouts.load(), 1);
}

TEST(ServerConnection, SlowReadersGiveWayToNewConnections) {
  TestServer s(small_limits());  // 4 connection threads
  std::vector<int> slow;
  for (int i = 0; i < 12; ++i) {
    slow.push_back(connect_to(s.port()));
    send_all(slow.back(), "GET /ping HTTP/1.1\r\n");
  }
  std::this_thread::sleep_for(300ms);
  for (int round = 0; round < 3; ++round) {
    const auto t0 = std::chrono::steady_clock::now();
    const int fd = connect_to(s.port());
    send_all(fd, "GET /ping HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    const std::string out = read_all(fd, 5s);
    ::close(fd);
    EXPECT_EQ(statuses(out), std::vector<int>{200}) << round;
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 1.5);
  }
  EXPECT_GE(s.registry().evicted.load(), 1);
  for (int fd : slow) ::close(fd);
}

}  // namespace
}  // namespace flowkv::server
