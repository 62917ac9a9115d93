#include "pipeline/klein_kv.h"

#include <chrono>
#include <cstring>
#include <memory>

#include "core/checked.h"
#include "flowkv/error.h"
#include "models/flux2/layout.h"
#include "pipeline/request_limits.h"
#include "pipeline/step_caches.h"

namespace flowkv::pipeline {

namespace {

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Position ids as the Klein KV pipeline builds them (spec §5.5): text (0,0,0,l), target
// (0,y,x,0), reference i (10*(i+1), y, x, 0), row-major.
std::vector<float> grid_ids(int64_t h, int64_t w, float t) {
  std::vector<float> ids(static_cast<size_t>(h * w * 4), 0.0f);
  for (int64_t y = 0; y < h; ++y) {
    for (int64_t x = 0; x < w; ++x) {
      float* p = &ids[static_cast<size_t>((y * w + x) * 4)];
      p[0] = t, p[1] = static_cast<float>(y), p[2] = static_cast<float>(x);
    }
  }
  return ids;
}

std::vector<int64_t> ref_sizes(const KleinKVRequest& r) {
  std::vector<int64_t> s;
  for (const Reference& ref : r.refs) s.push_back(ref.height * ref.width);
  return s;
}

TokenLayout layout_of(const KleinKVRequest& r) {
  return flux2::klein_kv_layout(r.text_tokens, ref_sizes(r), r.height * r.width, r.ref_timestep);
}

CachePlan plan_of(const KleinKVRequest& r) {
  const TokenLayout l = layout_of(r);
  std::vector<int> require;
  if (r.cache_text) require.push_back(l.index_of(SegmentKind::kText));
  return plan_cache(l, r.mode == RefMode::kCached, r.text_kv_approx, require);
}

int64_t planned_kv_bytes_unchecked(const flux2::Model& m, const KleinKVRequest& r) {
  const CachePlan plan = plan_of(r);
  const TokenLayout l = layout_of(r);
  int64_t tokens = 0;
  for (size_t i = 0; i < l.segments.size(); ++i) {
    if (plan.cached[i]) tokens += l.segments[i].tokens;
  }
  return KVMemory::payload_bytes(m.kv_layers(), r.batch, tokens, m.kv_width(), m.kv_dtype());
}

// The request's sizes, its limits and its predicted memory, before anything is allocated.
void validate(const flux2::Model& m, const KleinKVRequest& r) {
  FLOWKV_CHECK(r.batch > 0 && r.text && r.text_tokens > 0 && r.noise,
               "denoise: text and noise are required");
  FLOWKV_CHECK(r.height > 0 && r.width > 0, "denoise: the target grid must be positive");
  FLOWKV_CHECK(r.steps >= 1, "denoise: at least one step, got ", r.steps);
  FLOWKV_CHECK(r.sigmas.empty() || static_cast<int>(r.sigmas.size()) == r.steps,
               "denoise: ", r.sigmas.size(), " sigmas for ", r.steps, " steps");
  int64_t tokens = checked_add(r.text_tokens, grid_tokens(r.height, r.width, "the target grid"),
                               "sequence tokens");
  for (size_t i = 0; i < r.refs.size(); ++i) {
    FLOWKV_CHECK(r.refs[i].latents, "denoise: reference ", i + 1, " has no latents");
    tokens = checked_add(tokens, grid_tokens(r.refs[i].height, r.refs[i].width, "a reference grid"),
                         "sequence tokens");
  }
  RequestSize size{.batch = r.batch,
                   .steps = r.steps,
                   .images = static_cast<int64_t>(r.refs.size()),
                   .tokens = tokens};
  check_request_limits(size);
  size.kv_bytes = planned_kv_bytes_unchecked(m, r);
  check_request_memory(flux2::cost_shape(m.config(), dtype_size(m.kv_dtype())), size);
}

}  // namespace

int64_t planned_kv_bytes(const flux2::Model& m, const KleinKVRequest& r) {
  validate(m, r);
  return planned_kv_bytes_unchecked(m, r);
}

KleinKVResult run_klein_kv(const ExecContext& ctx, const flux2::Model& m, const KleinKVRequest& r) {
  const double t_start = now();
  validate(m, r);
  const flux2::Config& c = m.config();
  KleinKVResult res;
  res.plan = plan_of(r);
  const int64_t need = planned_kv_bytes_unchecked(m, r);
  check_kv_budget(need, r.kv_budget_bytes, "the KV cache",
                  "use smaller or fewer references, or run uncached (mode kRecompute)");
  const int64_t B = r.batch, L = r.text_tokens, N = r.height * r.width, C = c.in_channels;
  const TokenLayout layout = layout_of(r);
  bool refs_cached = false;
  for (size_t i = 0; i < layout.segments.size(); ++i) {
    refs_cached |= layout.segments[i].kind == SegmentKind::kReference && res.plan.cached[i];
  }
  const bool text_cached =
      res.plan.cached[static_cast<size_t>(layout.index_of(SegmentKind::kText))];

  // Inputs that do not change over the loop: ids, the references concatenated.
  int64_t R = 0;
  for (const Reference& ref : r.refs) R += ref.height * ref.width;
  std::vector<float> txt_ids(static_cast<size_t>(L * 4), 0.0f),
      img_ids = grid_ids(r.height, r.width, 0);
  for (int64_t l = 0; l < L; ++l) txt_ids[static_cast<size_t>(l * 4 + 3)] = static_cast<float>(l);
  std::vector<float> ref_lat(static_cast<size_t>(B * R * C)), ref_ids;
  for (int64_t b = 0, off = 0; b < B; ++b) {
    for (const Reference& ref : r.refs) {
      const int64_t n = ref.height * ref.width;
      std::memcpy(&ref_lat[static_cast<size_t>(off * C)], ref.latents + b * n * C,
                  static_cast<size_t>(n * C) * 4);
      off += n;
    }
  }
  for (size_t i = 0; i < r.refs.size(); ++i) {
    const auto ids = grid_ids(r.refs[i].height, r.refs[i].width, 10.0f * static_cast<float>(i + 1));
    ref_ids.insert(ref_ids.end(), ids.begin(), ids.end());
  }
  // The request's memories: cache state belongs to the request, never to the model.
  std::unique_ptr<KVMemory> ref_mem, txt_mem;
  if (refs_cached)
    ref_mem = std::make_unique<KVMemory>(m.kv_layers(), B, R, m.kv_width(), m.kv_dtype());
  if (text_cached)
    txt_mem = std::make_unique<KVMemory>(m.kv_layers(), B, L, m.kv_width(), m.kv_dtype());
  res.kv_bytes = (ref_mem ? ref_mem->bytes() : 0) + (txt_mem ? txt_mem->bytes() : 0);

  // Schedule (spec §5.6): linspace sigmas, mu from the target token count only.
  const std::vector<double> sigmas = r.sigmas.empty() ? sched::linspace_sigmas(r.steps) : r.sigmas;
  res.mu = sched::empirical_mu(N, r.steps);
  res.schedule = sched::set_timesteps(r.scheduler, sigmas, res.mu);

  const bool bf16 = m.compute_dtype() == DType::kBF16;
  res.latents.assign(r.noise, r.noise + B * N * C);
  if (bf16) {
    for (float& v : res.latents) v = round_bf16(v);
  }
  StepCaches step_caches(r.step_caches, m.topology());
  std::vector<float> velocity(static_cast<size_t>(B * N * c.out_features()));
  std::vector<float> timestep(static_cast<size_t>(B));
  for (int k = 0; k < r.steps; ++k) {
    const bool first = k == 0;
    std::fill(timestep.begin(), timestep.end(),
              sched::model_timestep(res.schedule.timesteps[static_cast<size_t>(k)], bf16));
    flux2::ForwardArgs a;
    a.batch = B;
    a.img = res.latents.data();
    a.img_tokens = N;
    a.img_ids = img_ids.data();
    a.txt = r.text;
    a.txt_tokens = L;
    a.txt_ids = txt_ids.data();
    a.timestep = timestep.data();
    a.out = velocity.data();
    if (text_cached && first) a.txt_kv.store = txt_mem.get();
    if (text_cached && !first) a.txt_kv.memory = txt_mem.get();
    const bool refs_live = R > 0 && (!refs_cached || first);
    if (refs_live) {
      a.ref = ref_lat.data();
      a.ref_tokens = R;
      a.ref_ids = ref_ids.data();
      a.ref_timestep = r.ref_timestep;
      if (refs_cached) a.ref_kv.store = ref_mem.get();
    } else if (refs_cached) {
      a.ref_kv.memory = ref_mem.get();
    }
    cache::StepContext sc;
    sc.step = k, sc.num_steps = r.steps;
    sc.sigma = static_cast<float>(res.schedule.sigmas[static_cast<size_t>(k)]);
    sc.timestep = static_cast<float>(res.schedule.timesteps[static_cast<size_t>(k)]);
    sc.prefill = first && (refs_cached || text_cached);
    a.hooks = step_caches.at(sc);
    const double t0 = now();
    m.forward(ctx, a);
    res.step_seconds.push_back(now() - t0);
    res.transformer_seconds += res.step_seconds.back();
    sched::euler_step(res.latents.data(), velocity.data(), B * N * C,
                      res.schedule.sigmas[static_cast<size_t>(k)],
                      res.schedule.sigmas[static_cast<size_t>(k + 1)], bf16);
    if (r.observe) r.observe(k, velocity.data(), res.latents.data());
    if (r.on_step) r.on_step(k + 1, r.steps);
  }
  res.step_caches = step_caches.stats();
  res.loop_seconds = now() - t_start;
  return res;
}

}  // namespace flowkv::pipeline
