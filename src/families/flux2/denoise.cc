// FLUX.2 Klein's request as the denoising loop drives it. Klein KV (diffusers
// pipeline_flux2_klein_kv.py): one branch; with the cache, step 0 computes the references and
// stores their K/V, later steps splice them from the request's memory; the uncached baseline
// recomputes them every step under the same rules. Klein 4B / 9B (pipeline_flux2_klein.py):
// the references join the target's image stream at every step.
#include <memory>

#include "core/checked.h"
#include "families/adapters.h"
#include "families/family.h"
#include "families/flux2/cost.h"
#include "flowkv/error.h"
#include "models/flux2/layout.h"
#include "models/flux2/model.h"
#include "pipeline/request_limits.h"

namespace flowkv::families {

namespace {

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

void check3(const Tensor& t, const char* what) {
  FLOWKV_CHECK(t.defined() && t.ndim() == 3 && t.dtype() == DType::kF32, what,
               " must be an F32 [B, tokens, channels] tensor");
}

class Flux2Adapter final : public pipeline::DenoiseAdapter {
 public:
  Flux2Adapter(const flux2::Model& m, const DenoiseInputs& in, const DenoiseOptions& o,
               Flux2References rule)
      : m_(m), in_(in), opts_(o), joint_(rule == Flux2References::kJoint) {
    check_inputs();
    layout_ = joint_ ? joint_layout(L(), ref_sizes(), N())
                     : flux2::klein_kv_layout(L(), ref_sizes(), N(), kRefTimestep);
    std::vector<int> require;
    if (o.cache_text) require.push_back(layout_.index_of(SegmentKind::kText));
    plan_ = plan_cache(layout_, o.mode == KVMode::kCached, o.text_kv_approx, require);
    for (size_t i = 0; i < layout_.segments.size(); ++i) {
      refs_cached_ |= layout_.segments[i].kind == SegmentKind::kReference && plan_.cached[i];
    }
    text_cached_ = plan_.cached[static_cast<size_t>(layout_.index_of(SegmentKind::kText))];
  }

  void validate() const override;
  int64_t planned_kv_bytes() const override;
  std::string kv_name() const override { return "the KV cache"; }
  std::string kv_advice() const override {
    return "use smaller or fewer references, or run uncached (mode kRecompute)";
  }
  int64_t batch() const override { return in_.noise.dim(0); }
  int64_t tokens() const override { return N(); }
  int64_t channels() const override { return m_.config().in_channels; }
  int64_t grid_height() const override { return in_.height; }
  int64_t grid_width() const override { return in_.width; }
  const float* noise() const override { return in_.noise.f32(); }
  bool bf16() const override { return m_.compute_dtype() == DType::kBF16; }
  sched::FlowMatchConfig scheduler() const override { return sched::flux2_scheduler_config(); }
  // mu from the target token count only (spec §5.6).
  double mu(int steps, const sched::FlowMatchConfig&) const override {
    return sched::empirical_mu(N(), steps);
  }
  cache::Topology topology() const override { return flux2_topology(m_); }

  int prepare(bool separate) override;
  bool cfg() const override { return false; }
  bool batched_cfg() const override { return false; }
  float cfg_scale() const override { return 1.0f; }
  int64_t kv_bytes() const override {
    return (ref_mem_ ? ref_mem_->bytes() : 0) + (txt_mem_ ? txt_mem_->bytes() : 0);
  }
  bool approximate() const override { return plan_.approximate; }
  bool prefill(int, int) const override {
    return (ref_mem_ && !ref_mem_->complete()) || (txt_mem_ && !txt_mem_->complete());
  }
  void forward(const ExecContext& ctx, int branch, const pipeline::StepCall& call) override;
  float* velocity(int) override { return velocity_.data(); }
  // The references' memory (Klein KV): it reads the references only.
  int shared_memories() const override { return ref_mem_ ? 1 : 0; }
  void describe_memory(int, store::KeyBuilder& key) const override;
  std::shared_ptr<KVMemory> memory(int) const override { return ref_mem_; }
  void adopt_memory(int, std::shared_ptr<KVMemory> m) override { ref_mem_ = std::move(m); }

 private:
  static constexpr float kRefTimestep = 0.0f;  // references are modulated from t = 0
  int64_t N() const { return in_.height * in_.width; }
  int64_t L() const { return in_.prompt.embeds.dim(1); }
  std::vector<int64_t> ref_sizes() const {
    std::vector<int64_t> s;
    for (const ReferenceLatents& r : in_.references) s.push_back(r.height * r.width);
    return s;
  }
  void check_inputs() const;
  void gather_references();
  void forward_joint(const ExecContext& ctx, const pipeline::StepCall& call, flux2::ForwardArgs& a);

  const flux2::Model& m_;
  const DenoiseInputs& in_;
  DenoiseOptions opts_;
  bool joint_;  // references appended to the target's tokens (Flux2KleinPipeline)
  TokenLayout layout_;
  CachePlan plan_;
  bool refs_cached_ = false, text_cached_ = false;
  int64_t R_ = 0;  // reference tokens, all references
  std::vector<float> txt_ids_, img_ids_, ref_ids_, timestep_, velocity_;
  std::vector<float> joint_rows_, joint_ids_, joint_velocity_;  // [target, refs] (joint rule)
  std::shared_ptr<KVMemory> ref_mem_, txt_mem_;  // the request's memories, never the model's
};

// Shapes and dtypes of the tensors, before any size is trusted.
void Flux2Adapter::check_inputs() const {
  const flux2::Config& c = m_.config();
  FLOWKV_CHECK(!in_.negative.embeds.defined(),
               "FLUX.2 Klein's loop has no unconditional branch: leave the negative prompt empty");
  FLOWKV_CHECK(in_.prompt.slots.empty() && !in_.prompt.mask.defined(),
               "FLUX.2 takes its prompt as embeddings only (no slots, no mask)");
  check3(in_.prompt.embeds, "text");
  check3(in_.noise, "noise");
  const int64_t b = in_.noise.dim(0);
  FLOWKV_CHECK(in_.noise.dim(1) == pipeline::grid_tokens(in_.height, in_.width, "the target grid"),
               "noise has ", in_.noise.dim(1), " tokens for a ", in_.height, "x", in_.width,
               " grid");
  FLOWKV_CHECK(in_.noise.dim(2) == c.in_channels, "noise has ", in_.noise.dim(2),
               " channels; this model takes ", c.in_channels);
  FLOWKV_CHECK(in_.prompt.embeds.dim(0) == b && in_.prompt.embeds.dim(2) == c.joint_attention_dim,
               "text is ", shape_str(in_.prompt.embeds.shape()), "; expected [", b, ", L, ",
               c.joint_attention_dim, "]");
  for (size_t i = 0; i < in_.references.size(); ++i) {
    const ReferenceLatents& ref = in_.references[i];
    check3(ref.latents, "reference latents");
    FLOWKV_CHECK(ref.latents.dim(0) == b &&
                     ref.latents.dim(1) ==
                         pipeline::grid_tokens(ref.height, ref.width, "a reference grid") &&
                     ref.latents.dim(2) == c.in_channels,
                 "reference ", i + 1, " is ", shape_str(ref.latents.shape()), "; expected [", b,
                 ", ", ref.height, "*", ref.width, ", ", c.in_channels, "]");
  }
}

int64_t Flux2Adapter::planned_kv_bytes() const {
  int64_t tokens = 0;
  for (size_t i = 0; i < layout_.segments.size(); ++i) {
    if (plan_.cached[i]) tokens += layout_.segments[i].tokens;
  }
  return KVMemory::payload_bytes(m_.kv_layers(), batch(), tokens, m_.kv_width(), m_.kv_dtype());
}

// The request's sizes, its limits and its predicted memory, before anything is allocated.
void Flux2Adapter::validate() const {
  FLOWKV_CHECK(L() > 0, "denoise: the prompt needs at least one token");
  pipeline::RequestSize size{
      .batch = batch(),
      .steps = opts_.sigmas.empty() ? opts_.steps : static_cast<int64_t>(opts_.sigmas.size()),
      .images = static_cast<int64_t>(in_.references.size()),
      .tokens = pipeline::sum_tokens(L(), ref_sizes(), N())};
  pipeline::check_request_limits(size);
  size.kv_bytes = planned_kv_bytes();
  const flux2::Config& c = m_.config();
  pipeline::check_request_memory(flux2::cost_shape(c, dtype_size(m_.kv_dtype())), size);
}

// The references' token count and ids (their latents are passed as they are, one segment each).
void Flux2Adapter::gather_references() {
  for (const ReferenceLatents& ref : in_.references) R_ += ref.height * ref.width;
  for (size_t i = 0; i < in_.references.size(); ++i) {
    const ReferenceLatents& r = in_.references[i];
    const auto ids = grid_ids(r.height, r.width, 10.0f * static_cast<float>(i + 1));
    ref_ids_.insert(ref_ids_.end(), ids.begin(), ids.end());
  }
}

int Flux2Adapter::prepare(bool) {
  const int64_t B = batch();
  txt_ids_.assign(static_cast<size_t>(L() * 4), 0.0f);
  for (int64_t l = 0; l < L(); ++l) txt_ids_[static_cast<size_t>(l * 4 + 3)] = float(l);
  img_ids_ = grid_ids(in_.height, in_.width, 0);
  gather_references();
  if (refs_cached_)
    ref_mem_ = std::make_shared<KVMemory>(m_.kv_layers(), B, R_, m_.kv_width(), m_.kv_dtype());
  if (text_cached_)
    txt_mem_ = std::make_shared<KVMemory>(m_.kv_layers(), B, L(), m_.kv_width(), m_.kv_dtype());
  velocity_.resize(static_cast<size_t>(B * N() * m_.config().out_features()));
  timestep_.resize(static_cast<size_t>(B));
  if (joint_ && R_ > 0) {
    joint_rows_.resize(static_cast<size_t>(B * (N() + R_) * channels()));
    joint_ids_ = img_ids_;
    joint_ids_.insert(joint_ids_.end(), ref_ids_.begin(), ref_ids_.end());
    joint_velocity_.resize(static_cast<size_t>(B * (N() + R_) * m_.config().out_features()));
  }
  return 1;
}

// Flux2KleinPipeline: the references' latents follow the target's in one image stream
// ([target, ref 1 .. ref k], the step's time, every token reading every token); the velocity
// is the target's rows of the output.
void Flux2Adapter::forward_joint(const ExecContext& ctx, const pipeline::StepCall& call,
                                 flux2::ForwardArgs& a) {
  const int64_t B = batch(), C = channels(), T = N() + R_, out = m_.config().out_features();
  for (int64_t b = 0; b < B; ++b) {
    float* dst = joint_rows_.data() + b * T * C;
    std::copy_n(call.latents + b * N() * C, N() * C, dst);
    dst += N() * C;
    for (const ReferenceLatents& ref : in_.references) {
      const int64_t n = ref.height * ref.width * C;
      std::copy_n(ref.latents.f32() + b * n, n, dst);
      dst += n;
    }
  }
  a.segments.push_back({.kind = SegmentKind::kTarget,
                        .name = "target",
                        .rows = joint_rows_.data(),
                        .tokens = T,
                        .ids = joint_ids_.data()});
  a.out = joint_velocity_.data();
  m_.forward(ctx, a);
  for (int64_t b = 0; b < B; ++b) {
    std::copy_n(joint_velocity_.data() + b * T * out, N() * out, velocity_.data() + b * N() * out);
  }
}

// Klein KV's references: modulated at t = 0, reading each other only, each at its offset
// 10 * (i + 1); the text is not read.
void Flux2Adapter::describe_memory(int, store::KeyBuilder& key) const {
  key.text("rule", "flux2 klein-kv references").real("reference time", kRefTimestep);
  key.integer("references", static_cast<int64_t>(in_.references.size()));
  for (size_t i = 0; i < in_.references.size(); ++i) {
    const ReferenceLatents& r = in_.references[i];
    key.real("offset", 10.0 * static_cast<double>(i + 1));
    key.integer("height", r.height).integer("width", r.width).tensor("latents", r.latents);
  }
}

void Flux2Adapter::forward(const ExecContext& ctx, int, const pipeline::StepCall& call) {
  std::fill(timestep_.begin(), timestep_.end(), call.timestep);
  flux2::ForwardArgs a;
  a.batch = batch();
  // Text: cached only under text-kv-approx.
  a.segments.push_back(
      {.kind = SegmentKind::kText,
       .name = "text",
       .rows = in_.prompt.embeds.f32(),
       .tokens = L(),
       .ids = txt_ids_.data(),
       .kv = loop_route(text_cached_, txt_mem_ && txt_mem_->complete(), txt_mem_.get())});
  a.timestep = timestep_.data();
  a.hooks = call.hooks;
  if (joint_ && R_ > 0) return forward_joint(ctx, call, a);
  // References: one stream with one memory over all of them.
  const SegmentKV ref_kv =
      loop_route(refs_cached_, ref_mem_ && ref_mem_->complete(), ref_mem_.get());
  for (size_t i = 0, off = 0; i < in_.references.size(); ++i) {
    const ReferenceLatents& ref = in_.references[i];
    a.segments.push_back({.kind = SegmentKind::kReference,
                          .name = "ref " + std::to_string(i + 1),
                          .rows = ref.latents.f32(),
                          .tokens = ref.height * ref.width,
                          .ids = ref_ids_.data() + off * 4,
                          .time = {.fixed = true, .timestep = kRefTimestep},
                          .kv = ref_kv});
    off += static_cast<size_t>(ref.height * ref.width);
  }
  a.segments.push_back({.kind = SegmentKind::kTarget,
                        .name = "target",
                        .rows = call.latents,
                        .tokens = N(),
                        .ids = img_ids_.data()});
  a.out = velocity_.data();
  m_.forward(ctx, a);
}

}  // namespace

std::unique_ptr<pipeline::DenoiseAdapter> flux2_adapter(const flux2::Model& m,
                                                        const DenoiseInputs& in,
                                                        const DenoiseOptions& opts,
                                                        Flux2References refs) {
  return std::make_unique<Flux2Adapter>(m, in, opts, refs);
}

}  // namespace flowkv::families
