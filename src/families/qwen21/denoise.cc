// Qwen-Image-2.1's request as the denoising loop drives it (diffusers pipeline_qwenimage21.py):
// the first step prefills the prefix (text and condition images) and stores its K/V, later
// steps run only the target; one cache per CFG branch; both branches run as one batched
// forward when their token layouts match and no step cache keeps state per branch.
#include <algorithm>
#include <initializer_list>
#include <memory>

#include "core/checked.h"
#include "families/adapters.h"
#include "families/family.h"
#include "families/qwen21/cost.h"
#include "flowkv/error.h"
#include "models/qwen_image/model21.h"
#include "pipeline/request_limits.h"

namespace flowkv::families {

namespace {

// A prompt as the model takes it: rows, slots, validity bytes (owned).
struct Prompt {
  const float* text = nullptr;  // [B, L, context_in_dim]
  int64_t len = 0;
  const uint8_t* slots = nullptr;  // [L] or nullptr
  std::vector<uint8_t> valid;      // [B, L] or empty: all valid
};

bool same_layout(const Prompt& a, const Prompt& b) {
  if (a.len != b.len) return false;
  for (int64_t i = 0; i < a.len; ++i) {
    if ((a.slots && a.slots[i]) != (b.slots && b.slots[i])) return false;
  }
  return true;
}

// One branch's (or the batched pair's) inputs as the model takes them, owning what had to be
// concatenated, and its memory.
struct Branch {
  int64_t batch = 0;
  std::vector<float> text, cond;  // only when two prompts are batched together
  std::vector<uint8_t> valid;
  qwen::Args21 args;
  std::shared_ptr<KVMemory> memory;
  std::vector<const Prompt*> prompts;  // in batch order: what the prefix reads
  std::vector<float> out, target_in, timestep;
};

class Qwen21Adapter final : public pipeline::DenoiseAdapter {
 public:
  Qwen21Adapter(const qwen::Model21& m, const DenoiseInputs& in, const DenoiseOptions& o)
      : m_(m), in_(in), opts_(o) {
    check_inputs();
  }

  void validate() const override;
  int64_t planned_kv_bytes() const override;
  std::string kv_name() const override {
    return cfg() ? "the prefix KV cache (one cache per CFG branch)" : "the prefix KV cache";
  }
  std::string kv_advice() const override {
    return "shorten the prompt or the condition images, or run uncached (mode kRecompute)";
  }
  int64_t batch() const override { return in_.noise.dim(0); }
  int64_t tokens() const override { return target_.tokens(); }
  int64_t channels() const override { return m_.config().in_channels; }
  int64_t grid_height() const override { return target_.h; }
  int64_t grid_width() const override { return target_.w; }
  const float* noise() const override { return in_.noise.f32(); }
  bool bf16() const override { return m_.compute_dtype() == DType::kBF16; }
  sched::FlowMatchConfig scheduler() const override { return sched::qwen_image_scheduler_config(); }
  double mu(int, const sched::FlowMatchConfig& cfg) const override {
    return sched::linear_mu(tokens(), cfg);
  }
  cache::Topology topology() const override { return qwen21_topology(m_); }

  int prepare(bool separate) override;
  bool cfg() const override { return negative_.text && in_.cfg_scale > 1.0f; }
  bool batched_cfg() const override { return batched_; }
  float cfg_scale() const override { return in_.cfg_scale; }
  int64_t kv_bytes() const override;
  bool approximate() const override { return false; }
  bool prefill(int branch, int) const override {
    const Branch& br = branches_[static_cast<size_t>(branch)];
    return br.memory && !br.memory->complete();
  }
  void forward(const ExecContext& ctx, int branch, const pipeline::StepCall& call) override;
  float* velocity(int branch) override { return branches_[static_cast<size_t>(branch)].out.data(); }
  // One prefix memory per branch: the prefix reads its own text and the conditions only.
  int shared_memories() const override { return cached() ? static_cast<int>(branches_.size()) : 0; }
  void describe_memory(int i, store::KeyBuilder& key) const override;
  std::shared_ptr<KVMemory> memory(int i) const override {
    return branches_[static_cast<size_t>(i)].memory;
  }
  void adopt_memory(int i, std::shared_ptr<KVMemory> m) override {
    branches_[static_cast<size_t>(i)].memory = std::move(m);
  }

 private:
  bool cached() const { return opts_.mode == KVMode::kCached && m_.config().causal_condition; }
  int64_t prefix_tokens(const Prompt& p) const {
    return qwen::build_layout21(p.len, p.slots, grids_, target_).P;
  }
  void check_inputs();
  Prompt prompt(const PromptEmbeds& p) const;
  void fill(Branch& br, std::initializer_list<const Prompt*> prompts) const;

  const qwen::Model21& m_;
  const DenoiseInputs& in_;
  DenoiseOptions opts_;
  Prompt prompt_, negative_;
  std::vector<qwen::Grid> grids_;
  qwen::Grid target_;
  std::vector<float> cond_;  // condition latents concatenated per batch element
  std::vector<Branch> branches_;
  bool batched_ = false;
};

Prompt Qwen21Adapter::prompt(const PromptEmbeds& p) const {
  const auto& c = m_.config();
  const int64_t B = batch();
  FLOWKV_CHECK(p.embeds.defined() && p.embeds.ndim() == 3 && p.embeds.dtype() == DType::kF32 &&
                   p.embeds.dim(0) == B && p.embeds.dim(2) == c.context_in_dim,
               "prompt embeddings must be F32 [", B, ", L, ", c.context_in_dim, "], got ",
               p.embeds.defined() ? shape_str(p.embeds.shape()) : std::string("none"));
  const int64_t L = p.embeds.dim(1);
  FLOWKV_CHECK(p.slots.empty() || static_cast<int64_t>(p.slots.size()) == L, "the slot mask has ",
               p.slots.size(), " entries for ", L, " prompt rows");
  Prompt out{p.embeds.f32(), L, p.slots.empty() ? nullptr : p.slots.data(), {}};
  if (p.mask.defined()) {
    FLOWKV_CHECK(p.mask.numel() == B * L, "prompt mask has ", p.mask.numel(), " values for ", B,
                 " x ", L, " rows");
    const Tensor f = p.mask.to_f32();
    for (int64_t i = 0; i < f.numel(); ++i) out.valid.push_back(f.f32()[i] != 0);
  }
  return out;
}

// Shapes of the tensors, before any size is trusted.
void Qwen21Adapter::check_inputs() {
  grids_ = check_latents(in_, m_.config().in_channels, "condition-image");
  prompt_ = prompt(in_.prompt);
  if (in_.negative.embeds.defined()) negative_ = prompt(in_.negative);
  target_ = {in_.height, in_.width};
}

int64_t Qwen21Adapter::planned_kv_bytes() const {
  if (!cached()) return 0;
  int64_t tokens = prefix_tokens(prompt_);
  if (cfg()) tokens += prefix_tokens(negative_);  // one cache per branch
  return KVMemory::payload_bytes(m_.kv_layers(), batch(), tokens, m_.kv_width(), m_.kv_dtype());
}

// The request's sizes, its limits and its predicted memory, before anything is allocated.
void Qwen21Adapter::validate() const {
  // Text rows, condition-image tokens and the target: at least the sequence's length.
  std::vector<int64_t> images;
  for (const qwen::Grid& g : grids_) images.push_back(g.tokens());
  const int64_t rows = std::max(prompt_.len, negative_.text ? negative_.len : 0);
  pipeline::RequestSize size{
      .batch = cfg() && opts_.batch_cfg ? checked_mul(batch(), 2, "batch") : batch(),
      .steps = opts_.sigmas.empty() ? opts_.steps : static_cast<int64_t>(opts_.sigmas.size()),
      .images = static_cast<int64_t>(grids_.size()),
      .tokens = pipeline::sum_tokens(rows, images, tokens())};
  pipeline::check_request_limits(size);
  size.kv_bytes = planned_kv_bytes();
  const auto& c = m_.config();
  pipeline::check_request_memory(qwen::cost_shape(c, dtype_size(m_.kv_dtype())), size);
}

void Qwen21Adapter::fill(Branch& br, std::initializer_list<const Prompt*> prompts) const {
  const auto& c = m_.config();
  const int64_t B = batch(), n = static_cast<int64_t>(prompts.size());
  const Prompt& first = **prompts.begin();
  const float* cond = cond_.empty() ? nullptr : cond_.data();
  br.batch = B * n;
  br.prompts.assign(prompts.begin(), prompts.end());
  qwen::Args21& a = br.args;
  a.batch = br.batch;
  const float* text = first.text;  // [B*n, L, context_in_dim] rows, validity, conditions
  const uint8_t* text_valid = first.valid.empty() ? nullptr : first.valid.data();
  const float* conds = cond;
  if (n > 1) {
    bool any_mask = false;
    for (const Prompt* p : prompts) any_mask |= !p->valid.empty();
    for (const Prompt* p : prompts) {
      br.text.insert(br.text.end(), p->text, p->text + B * p->len * c.context_in_dim);
      if (any_mask) {
        if (!p->valid.empty())
          br.valid.insert(br.valid.end(), p->valid.begin(), p->valid.end());
        else
          br.valid.insert(br.valid.end(), static_cast<size_t>(B * p->len), 1);
      }
      if (cond) br.cond.insert(br.cond.end(), cond_.begin(), cond_.end());
    }
    text = br.text.data();
    text_valid = any_mask ? br.valid.data() : nullptr;
    conds = cond ? br.cond.data() : nullptr;
  }
  // [text, conditions..., target]: the conditions are views of the concatenated latents; the
  // target's rows and the prefix's route are set per call.
  const SegmentTime prefix_time = m_.prefix_time();
  a.segments.push_back({.kind = SegmentKind::kText,
                        .name = "text",
                        .rows = text,
                        .tokens = first.len,
                        .slots = first.slots,
                        .valid = text_valid,
                        .time = prefix_time});
  int64_t n_cond = 0, off = 0;
  for (const qwen::Grid& g : grids_) n_cond += g.tokens();
  for (size_t i = 0; i < grids_.size(); ++i) {
    a.segments.push_back({.kind = SegmentKind::kReference,
                          .name = "condition " + std::to_string(i + 1),
                          .rows = conds + off * c.in_channels,
                          .tokens = grids_[i].tokens(),
                          .batch_rows = n_cond,
                          .grid = grids_[i],
                          .time = prefix_time});
    off += grids_[i].tokens();
  }
  a.segments.push_back(
      {.kind = SegmentKind::kTarget, .name = "target", .tokens = tokens(), .grid = target_});
  br.out.resize(static_cast<size_t>(br.batch * tokens() * c.out_features()));
  if (cached()) {
    br.memory = std::make_shared<KVMemory>(m_.kv_layers(), br.batch, prefix_tokens(first),
                                           m_.kv_width(), m_.kv_dtype());
  }
}

// Branches: cond alone, or cond and uncond (batched when their layouts match).
int Qwen21Adapter::prepare(bool separate) {
  const int64_t B = batch(), C = channels();
  for (int64_t b = 0; b < B; ++b) {  // the conditions concatenated per batch element
    for (const ReferenceLatents& ref : in_.references) {
      const int64_t n = ref.height * ref.width * C;
      cond_.insert(cond_.end(), ref.latents.f32() + b * n, ref.latents.f32() + (b + 1) * n);
    }
  }
  batched_ = cfg() && opts_.batch_cfg && !separate && same_layout(prompt_, negative_);
  return plan_cfg_branches(
      branches_, batched_, cfg(), &prompt_, &negative_,
      [this](Branch& br, std::initializer_list<const Prompt*> prompts) { fill(br, prompts); });
}

int64_t Qwen21Adapter::kv_bytes() const {
  return memories_bytes(branches_);
}

// The branch's prefix [text, conditions]: each prompt's rows, validity and image slots, the
// condition latents with their grids, and the prefix's modulation time.
void Qwen21Adapter::describe_memory(int i, store::KeyBuilder& key) const {
  const Branch& br = branches_[static_cast<size_t>(i)];
  const auto& c = m_.config();
  const SegmentTime t = m_.prefix_time();
  key.text("rule", "qwen-image-2.1 causal prefix");
  key.integer("time fixed", t.fixed ? 1 : 0).real("time", t.timestep);
  key.integer("prompts", static_cast<int64_t>(br.prompts.size()));
  for (const Prompt* p : br.prompts) {
    key.integer("rows", p->len);
    key.bytes("text", p->text, static_cast<size_t>(batch() * p->len * c.context_in_dim) * 4);
    key.bytes("valid", p->valid.data(), p->valid.size());
    key.bytes("slots", p->slots, p->slots ? static_cast<size_t>(p->len) : 0);
  }
  for (const qwen::Grid& g : grids_) key.integer("grid h", g.h).integer("grid w", g.w);
  key.bytes("conditions", cond_.data(), cond_.size() * 4);
}

void Qwen21Adapter::forward(const ExecContext& ctx, int branch, const pipeline::StepCall& call) {
  Branch& br = branches_[static_cast<size_t>(branch)];
  const int64_t reps = br.batch / batch();  // the same latents for every prompt in the batch
  const int64_t n = batch() * tokens() * channels();
  br.target_in.clear();
  for (int64_t i = 0; i < reps; ++i)
    br.target_in.insert(br.target_in.end(), call.latents, call.latents + n);
  br.timestep.assign(static_cast<size_t>(br.batch), call.timestep);
  qwen::Args21 a = br.args;
  // The prefix is one memory: stored at step 0, spliced later; the text carries it.
  const SegmentKV kv =
      loop_route(br.memory != nullptr, br.memory && br.memory->complete(), br.memory.get());
  for (SegmentInput& s : a.segments) {
    if (s.kind == SegmentKind::kTarget) {
      s.rows = br.target_in.data();
    } else if (s.kind == SegmentKind::kText) {
      s.kv = kv;
    } else {
      s.kv.route = kv.route;  // conditions follow the text's route; it carries the memory
    }
  }
  a.timestep = br.timestep.data();
  a.out = br.out.data();
  a.hooks = call.hooks;
  m_.forward(ctx, a);
}

}  // namespace

std::unique_ptr<pipeline::DenoiseAdapter> qwen21_adapter(const qwen::Model21& m,
                                                         const DenoiseInputs& in,
                                                         const DenoiseOptions& opts) {
  return std::make_unique<Qwen21Adapter>(m, in, opts);
}

}  // namespace flowkv::families
