// The connection side of flowkv serve (state.h): noticing a client that leaves, and streaming a
// request's progress, partial images and pictures as server-sent events (OpenAI's
// image_generation.* / image_edit.* events, plus flowkv.progress).
#include <poll.h>
#include <sys/socket.h>

#include <cerrno>

#include "state.h"

namespace flowkv::server {

// ---- the connection's socket
// httplib 0.11.4 gives a handler no way to learn that its client left (is_connection_closed
// came in later versions); the request's Connection (connection.h) knows its socket, which is
// polled: the peer's FIN or RST shows as POLLRDHUP / POLLHUP / a zero-byte peek. A client that
// half-closes its side while waiting looks gone.

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

// ---- server-sent events

namespace {

using nlohmann::json;

std::string sse(const std::string& event, const json& data) {
  return "event: " + event + "\ndata: " + dump(data) + "\n\n";
}

}  // namespace

void stream_images(State& s, std::shared_ptr<Job> job, httplib::Response& res) {
  const std::string prefix = job->edit ? "image_edit" : "image_generation";
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
            std::to_string(j.layout().width) + "x" + std::to_string(j.layout().height);
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
        emit.completed = [&](int image, const Picture& im) {
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

}  // namespace flowkv::server
