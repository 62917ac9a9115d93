// Admission for flowkv serve (state.h): a FIFO queue bounded by --queue, at most --workers
// running, and their predicted bytes within --memory-budget; and when a request must stop.
#include <algorithm>

#include "flowkv/predict.h"
#include "state.h"

namespace flowkv::server {

bool Admission::full() const {
  std::lock_guard<std::mutex> l(m_);
  return static_cast<int>(waiting_.size()) >= queue_ && running_ >= workers_;
}

void Admission::acquire(int64_t bytes, const std::function<bool()>& stop) {
  std::unique_lock<std::mutex> l(m_);
  if (static_cast<int>(waiting_.size()) >= queue_ && running_ >= workers_) {
    throw ApiError(503,
                   "the server is busy: " + std::to_string(running_) + " running and " +
                       std::to_string(waiting_.size()) + " waiting (--queue); retry after a while",
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

void Admission::release(int64_t bytes) {
  std::lock_guard<std::mutex> l(m_);
  --running_;
  reserved_ -= bytes;
  metrics_.reserved_bytes = reserved_;
  --metrics_.in_flight;
  cv_.notify_all();
}

// From the prepared request's token layout (no weights read) and the transformer's config.
// The weights are not in it: the pipeline holds one set for every request (resident), or loads
// one stage's component at a time (staged).
int64_t admit_memory(State& s, const Job& j) {
  const GenerateLayout& layout = j.layout();
  const GenerateRequest& g = j.prepared->request();
  PredictRequest p;
  p.model = layout.transformer;
  p.text_tokens = layout.text_tokens;
  p.target_tokens = layout.target_tokens;
  p.ref_tokens = layout.image_tokens;
  p.steps = std::max(1, g.steps);
  p.cfg = layout.cfg;
  const KVPrediction pred = predict(p);
  const int64_t kv = g.kv_cache ? pred.kv_bytes : 0;
  const int64_t bytes = kv + pred.activation_bytes;
  if (s.opt.memory_budget > 0 && bytes > s.opt.memory_budget) {
    s.metrics.count("rejected_memory");
    throw ApiError(400,
                   "the request needs about " + std::to_string(bytes) + " bytes (KV cache " +
                       std::to_string(kv) + ", activations " +
                       std::to_string(pred.activation_bytes) + ") for " +
                       std::to_string(layout.width) + "x" + std::to_string(layout.height) +
                       " with " + std::to_string(layout.image_tokens.size()) +
                       " image(s), over this server's memory budget of " +
                       std::to_string(s.opt.memory_budget) +
                       " bytes (--memory-budget); ask for a smaller size or fewer images",
                   "size", "memory_budget_exceeded");
  }
  return bytes;
}

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

}  // namespace flowkv::server
