// NucleusMoE-Image's request as the denoising loop drives it (diffusers 0.42.1
// pipeline_nucleusmoe_image.py): the image tokens are the only queries; the prompt enters every
// block as keys and values. With the exact cache (kCached) each branch's text K/V are computed
// at the first step and spliced from its memory after that (TextKVCacheConfig), keyed on the
// prompt's content and the target's grid (text RoPE positions start past the grid), never on a
// buffer's address. True CFG rescales the guided velocity to the conditional one's norm per
// token; the model predicts x0 - noise, so each branch's output is negated before the loop
// sees it (the pipeline negates after guidance: both are linear and sign-symmetric, so the
// result is the same bit for bit). Both branches run as one batched forward when their prompts
// have the same length and no step cache keeps state per branch.
#include <algorithm>
#include <memory>

#include "core/checked.h"
#include "families/adapters.h"
#include "families/family.h"
#include "families/nucleus/cost.h"
#include "flowkv/error.h"
#include "models/nucleus/model.h"
#include "pipeline/request_limits.h"

namespace flowkv::families {

namespace {

using Prompt = PromptRows;

struct Branch {
  int64_t batch = 0;  // B per prompt times the prompts in this forward
  std::vector<const Prompt*> prompts;
  std::vector<float> text, img, out, timestep;
  std::vector<uint8_t> valid;
  std::shared_ptr<KVMemory> memory;  // the text K/V of every block (kCached)
  nucleus::Args args;                // set once; each call sets its rows, route and hooks
};

class NucleusAdapter final : public pipeline::DenoiseAdapter {
 public:
  NucleusAdapter(const nucleus::Model& m, const DenoiseInputs& in, const DenoiseOptions& o)
      : m_(m), in_(in), opts_(o) {
    check_inputs();
    const TokenLayout layout = nucleus_layout(prompt_.len, tokens());
    std::vector<int> require;
    if (o.cache_text) require.push_back(layout.index_of(SegmentKind::kText));
    const CachePlan plan = plan_cache(layout, o.mode == KVMode::kCached, o.text_kv_approx, require);
    cached_ = plan.cached[0];
  }

  void validate() const override;
  int64_t planned_kv_bytes() const override;
  std::string kv_name() const override {
    return cfg() ? "the text K/V cache (one per CFG branch)" : "the text K/V cache";
  }
  std::string kv_advice() const override {
    return "shorten the prompt, or run uncached (mode kRecompute)";
  }
  int64_t batch() const override { return in_.noise.dim(0); }
  int64_t tokens() const override { return target_.tokens(); }
  int64_t channels() const override { return m_.config().in_channels; }
  int64_t grid_height() const override { return target_.h; }
  int64_t grid_width() const override { return target_.w; }
  const float* noise() const override { return in_.noise.f32(); }
  bool bf16() const override { return m_.compute_dtype() == DType::kBF16; }
  // FlowMatchEulerDiscreteScheduler's class defaults (static shift 1): the pipeline folder's
  // scheduler_config.json replaces them.
  sched::FlowMatchConfig scheduler() const override { return {}; }
  double mu(int, const sched::FlowMatchConfig& cfg) const override {
    return sched::linear_mu(tokens(), cfg);
  }
  cache::Topology topology() const override { return nucleus_topology(m_); }

  int prepare(bool separate) override;
  bool cfg() const override { return negative_.text && in_.cfg_scale > 1.0f; }
  bool batched_cfg() const override { return batched_; }
  float cfg_scale() const override { return in_.cfg_scale; }
  bool cfg_rescale() const override { return true; }
  int64_t kv_bytes() const override;
  bool approximate() const override { return false; }
  bool prefill(int branch, int) const override {
    const Branch& br = branches_[static_cast<size_t>(branch)];
    return br.memory && !br.memory->complete();
  }
  void forward(const ExecContext& ctx, int branch, const pipeline::StepCall& call) override;
  float* velocity(int branch) override { return branches_[static_cast<size_t>(branch)].out.data(); }
  int shared_memories() const override { return cached_ ? static_cast<int>(branches_.size()) : 0; }
  void describe_memory(int i, store::KeyBuilder& key) const override;
  std::shared_ptr<KVMemory> memory(int i) const override {
    return branches_[static_cast<size_t>(i)].memory;
  }
  void adopt_memory(int i, std::shared_ptr<KVMemory> m) override {
    branches_[static_cast<size_t>(i)].memory = std::move(m);
  }

 private:
  void check_inputs();
  Prompt prompt(const PromptEmbeds& p) const;
  void fill(Branch& br, std::initializer_list<const Prompt*> prompts) const;

  const nucleus::Model& m_;
  const DenoiseInputs& in_;
  DenoiseOptions opts_;
  Prompt prompt_, negative_;
  ImageGrid target_;
  std::vector<Branch> branches_;
  bool batched_ = false;
  bool cached_ = false;
};

Prompt NucleusAdapter::prompt(const PromptEmbeds& p) const {
  FLOWKV_CHECK(p.slots.empty(), "NucleusMoE-Image's prompt has no image slots");
  return prompt_rows(p, batch(), m_.config().joint_attention_dim);
}

void NucleusAdapter::check_inputs() {
  FLOWKV_CHECK(in_.references.empty(), "NucleusMoE-Image takes no reference images (got ",
               in_.references.size(), ")");
  (void)check_latents(in_, m_.config().in_channels, "reference-image");
  prompt_ = prompt(in_.prompt);
  if (in_.negative.embeds.defined()) negative_ = prompt(in_.negative);
  target_ = {in_.height, in_.width};
}

int64_t NucleusAdapter::planned_kv_bytes() const {
  if (!cached_) return 0;
  int64_t rows = prompt_.len;
  if (cfg()) rows += negative_.len;  // one memory per branch
  return KVMemory::payload_bytes(m_.kv_layers(), batch(), rows, m_.kv_width(), m_.kv_dtype());
}

// The request's sizes, its limits and its predicted memory, before anything is allocated.
void NucleusAdapter::validate() const {
  const int64_t rows = std::max(prompt_.len, negative_.text ? negative_.len : 0);
  pipeline::RequestSize size{
      .batch = cfg() && opts_.batch_cfg ? checked_mul(batch(), 2, "batch") : batch(),
      .steps = opts_.sigmas.empty() ? opts_.steps : static_cast<int64_t>(opts_.sigmas.size()),
      .images = 0,
      .tokens = pipeline::sum_tokens(rows, {}, tokens())};
  pipeline::check_request_limits(size);
  size.kv_bytes = planned_kv_bytes();
  pipeline::check_request_memory(
      nucleus::cost_shape(m_.config(), tokens(), dtype_size(m_.kv_dtype())), size);
}

// One forward's text rows (and validity) for `prompts` stacked along the batch.
void NucleusAdapter::fill(Branch& br, std::initializer_list<const Prompt*> prompts) const {
  const auto& c = m_.config();
  const int64_t B = batch(), N = tokens();
  br.prompts.assign(prompts.begin(), prompts.end());
  br.batch = B * static_cast<int64_t>(prompts.size());
  const Prompt& first = **prompts.begin();
  StackedPrompts stacked = stack_prompts(br.prompts, B, c.joint_attention_dim);
  br.text = std::move(stacked.text);
  br.valid = std::move(stacked.valid);
  br.img.resize(static_cast<size_t>(br.batch * N * c.in_channels));
  br.out.resize(static_cast<size_t>(br.batch * N * c.in_channels));
  br.timestep.resize(static_cast<size_t>(br.batch));
  nucleus::Args& a = br.args;
  a.batch = br.batch;
  a.segments.push_back({.kind = SegmentKind::kText,
                        .name = "text",
                        .rows = br.text.data(),
                        .tokens = first.len,
                        .valid = br.valid.empty() ? nullptr : br.valid.data()});
  a.segments.push_back({.kind = SegmentKind::kTarget,
                        .name = "target",
                        .rows = br.img.data(),
                        .tokens = N,
                        .grid = target_});
  a.timestep = br.timestep.data();
  a.out = br.out.data();
  if (cached_) {
    br.memory = std::make_shared<KVMemory>(m_.kv_layers(), br.batch, first.len, m_.kv_width(),
                                           m_.kv_dtype());
  }
}

int NucleusAdapter::prepare(bool separate) {
  batched_ = cfg() && opts_.batch_cfg && !separate && prompt_.len == negative_.len;
  return plan_cfg_branches(
      branches_, batched_, cfg(), &prompt_, &negative_,
      [this](Branch& br, std::initializer_list<const Prompt*> prompts) { fill(br, prompts); });
}

int64_t NucleusAdapter::kv_bytes() const {
  return memories_bytes(branches_);
}

// The branch's text K/V: each prompt's rows and validity, and the target's grid (the text's
// RoPE positions start past it). The weights' identity is the key's prefix.
void NucleusAdapter::describe_memory(int i, store::KeyBuilder& key) const {
  const Branch& br = branches_[static_cast<size_t>(i)];
  const auto& c = m_.config();
  key.text("rule", "nucleusmoe-image text kv");
  key.integer("prompts", static_cast<int64_t>(br.prompts.size()));
  for (const Prompt* p : br.prompts) {
    key.integer("rows", p->len);
    key.bytes("text", p->text, static_cast<size_t>(batch() * p->len * c.joint_attention_dim) * 4);
    key.bytes("valid", p->valid.data(), p->valid.size());
  }
  key.integer("grid h", target_.h).integer("grid w", target_.w);
}

void NucleusAdapter::forward(const ExecContext& ctx, int branch, const pipeline::StepCall& call) {
  Branch& br = branches_[static_cast<size_t>(branch)];
  const int64_t n = batch() * tokens() * channels();
  for (int64_t r = 0; r < br.batch / batch(); ++r)  // the same latents for every prompt
    std::copy(call.latents, call.latents + n, br.img.data() + r * n);
  std::fill(br.timestep.begin(), br.timestep.end(), call.timestep);
  nucleus::Args a = br.args;
  a.segments[0].kv =
      loop_route(br.memory != nullptr, br.memory && br.memory->complete(), br.memory.get());
  a.hooks = call.hooks;
  m_.forward(ctx, a);
  for (float& v : br.out) v = -v;  // noise_pred = -noise_pred
}

}  // namespace

std::unique_ptr<pipeline::DenoiseAdapter> nucleus_adapter(const nucleus::Model& m,
                                                          const DenoiseInputs& in,
                                                          const DenoiseOptions& opts) {
  return std::make_unique<NucleusAdapter>(m, in, opts);
}

}  // namespace flowkv::families
