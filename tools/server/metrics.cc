// /metrics for flowkv serve (state.h): the server's counters and gauges, the reference store's
// and the pipeline's, in Prometheus' text format (version 0.0.4).
#include <sstream>
#include <tuple>

#include "flowkv/runtime.h"
#include "state.h"

namespace flowkv::server {

void Metrics::request(const std::string& route, int status) {
  std::lock_guard<std::mutex> l(m_);
  ++requests_[{route, status}];
}

void Metrics::step(double seconds) {
  std::lock_guard<std::mutex> l(m_);
  for (size_t i = 0; i < std::size(kStepBuckets); ++i) {
    if (seconds <= kStepBuckets[i]) ++step_counts_[i];
  }
  ++step_count_;
  step_sum_ += seconds;
}

void Metrics::count(const std::string& name) {
  std::lock_guard<std::mutex> l(m_);
  ++counters_[name];
}

namespace {

void render_store(std::ostringstream& o, const StoreStats& s) {
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
    o << "# TYPE flowkv_store_" << name << "_total counter\nflowkv_store_" << name << "_total " << v
      << "\n";
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
}

// Pipeline::stats(): with the resident policy the loads stop after the first request that
// needs each component; staged, every request loads its components again.
void render_pipeline(std::ostringstream& o, const PipelineStats& p) {
  o << "# HELP flowkv_component_loads_total Pipeline components (text encoder, VAE, transformer) "
       "loaded since start.\n"
    << "# TYPE flowkv_component_loads_total counter\nflowkv_component_loads_total "
    << p.component_loads << "\n";
  o << "# HELP flowkv_component_load_seconds_total Seconds spent loading pipeline components.\n"
    << "# TYPE flowkv_component_load_seconds_total counter\nflowkv_component_load_seconds_total "
    << p.load_seconds << "\n";
  o << "# HELP flowkv_resident_components Pipeline components loaded now.\n"
    << "# TYPE flowkv_resident_components gauge\nflowkv_resident_components "
    << p.resident_components << "\n";
  o << "# HELP flowkv_pipeline_requests_total Generations the pipeline finished.\n"
    << "# TYPE flowkv_pipeline_requests_total counter\nflowkv_pipeline_requests_total "
    << p.requests << "\n";
}

void render_connections(std::ostringstream& o, const ConnectionRegistry& c) {
  const std::tuple<const char*, const char*, int64_t> kCounters[] = {
      {"evicted", "connections shut down to free a thread for a new one (slow readers first)",
       c.evicted.load()},
      {"header_timeouts", "requests whose headers did not arrive within --header-timeout",
       c.header_timeouts.load()},
      {"body_timeouts", "request bodies that arrived slower than the minimum rate",
       c.body_timeouts.load()},
      {"too_large", "request bodies refused over --max-body (declared or counted)",
       c.too_large.load()},
      {"refused", "requests refused from their headers (no length, an encoding)",
       c.refused.load()}};
  for (const auto& [name, help, v] : kCounters) {
    o << "# HELP flowkv_connection_" << name << "_total " << help << ".\n# TYPE flowkv_connection_"
      << name << "_total counter\nflowkv_connection_" << name << "_total " << v << "\n";
  }
  o << "# HELP flowkv_connections Open client connections.\n# TYPE flowkv_connections gauge\n"
    << "flowkv_connections " << c.size() << "\n";
}

}  // namespace

std::string Metrics::render(const ReferenceStore& store, const PipelineStats& pipeline,
                            const ConnectionRegistry& connections) const {
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
      {"shutdown_aborted", "requests stopped by a shutdown past its grace period"},
      {"unauthorized", "requests refused for a missing or wrong API key"}};
  for (const auto& [name, help] : kCounters) {
    auto it = counters_.find(name);
    o << "# HELP flowkv_" << name << "_total " << help << ".\n# TYPE flowkv_" << name
      << "_total counter\nflowkv_" << name << "_total " << (it == counters_.end() ? 0 : it->second)
      << "\n";
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
    o << "flowkv_step_seconds_bucket{le=\"" << kStepBuckets[i] << "\"} " << step_counts_[i] << "\n";
  }
  o << "flowkv_step_seconds_bucket{le=\"+Inf\"} " << step_count_ << "\n"
    << "flowkv_step_seconds_sum " << step_sum_ << "\nflowkv_step_seconds_count " << step_count_
    << "\n";
  render_store(o, store.stats());
  render_pipeline(o, pipeline);
  render_connections(o, connections);
  o << "# HELP flowkv_peak_rss_bytes The process's peak resident memory.\n"
    << "# TYPE flowkv_peak_rss_bytes gauge\nflowkv_peak_rss_bytes " << peak_rss() << "\n";
  return o.str();
}

}  // namespace flowkv::server
