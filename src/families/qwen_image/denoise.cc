// Qwen-Image's request as the denoising loop drives it (diffusers pipeline_qwenimage.py and
// pipeline_qwenimage_edit_plus.py): the image stream is [target, references...] at every step,
// the velocity is the target's rows; true CFG runs a second branch and rescales the guided
// velocity to the conditional one's norm per token. Nothing is cached exactly: every token
// reads the target. Both branches run as one batched forward when their prompts have the same
// length and no step cache keeps state per branch.
#include <algorithm>
#include <memory>

#include "core/checked.h"
#include "families/adapters.h"
#include "families/family.h"
#include "flowkv/error.h"
#include "models/qwen_image/model_qwen.h"
#include "pipeline/request_limits.h"

namespace flowkv::families {

namespace {

using Prompt = PromptRows;

struct Branch {
  int64_t batch = 0;  // B per prompt times the prompts in this forward
  std::vector<const Prompt*> prompts;
  std::vector<float> text, img, out, velocity, timestep;
  std::vector<uint8_t> valid;
  qwen::ArgsQwenImage args;  // set once; each call sets its timestep, output and hooks
};

class QwenImageAdapter final : public pipeline::DenoiseAdapter {
 public:
  QwenImageAdapter(const qwen::ModelQwenImage& m, const DenoiseInputs& in, const DenoiseOptions& o)
      : m_(m), in_(in), opts_(o) {
    check_inputs();
    std::vector<int64_t> refs;
    for (const qwen::Grid& g : grids_) refs.push_back(g.tokens());
    const TokenLayout layout = joint_layout(prompt_.len, refs, tokens());
    std::vector<int> require;
    if (o.cache_text) require.push_back(layout.index_of(SegmentKind::kText));
    (void)plan_cache(layout, o.mode == KVMode::kCached, o.text_kv_approx, require);
  }

  void validate() const override;
  int64_t planned_kv_bytes() const override { return 0; }
  std::string kv_name() const override { return "no KV cache"; }
  std::string kv_advice() const override { return "use smaller or fewer reference images"; }
  int64_t batch() const override { return in_.noise.dim(0); }
  int64_t tokens() const override { return target_.tokens(); }
  int64_t channels() const override { return m_.config().in_channels; }
  int64_t grid_height() const override { return target_.h; }
  int64_t grid_width() const override { return target_.w; }
  const float* noise() const override { return in_.noise.f32(); }
  bool bf16() const override { return m_.compute_dtype() == DType::kBF16; }
  sched::FlowMatchConfig scheduler() const override { return sched::qwen_image_scheduler_config(); }
  // The target's tokens only (the references never count: pipeline_qwenimage_edit_plus.py).
  double mu(int, const sched::FlowMatchConfig& cfg) const override {
    return sched::linear_mu(tokens(), cfg);
  }
  cache::Topology topology() const override { return qwen_image_topology(m_); }

  int prepare(bool separate) override;
  bool cfg() const override { return negative_.text && in_.cfg_scale > 1.0f; }
  bool batched_cfg() const override { return batched_; }
  float cfg_scale() const override { return in_.cfg_scale; }
  bool cfg_rescale() const override { return true; }
  int64_t kv_bytes() const override { return 0; }
  bool approximate() const override { return false; }
  bool prefill(int, int) const override { return false; }
  void forward(const ExecContext& ctx, int branch, const pipeline::StepCall& call) override;
  float* velocity(int branch) override {
    return branches_[static_cast<size_t>(branch)].velocity.data();
  }

 private:
  void check_inputs();
  Prompt prompt(const PromptEmbeds& p) const;
  void fill(Branch& br, std::initializer_list<const Prompt*> prompts) const;
  int64_t image_tokens() const {
    int64_t n = tokens();
    for (const qwen::Grid& g : grids_) n += g.tokens();
    return n;
  }

  const qwen::ModelQwenImage& m_;
  const DenoiseInputs& in_;
  DenoiseOptions opts_;
  Prompt prompt_, negative_;
  std::vector<qwen::Grid> grids_;  // the references'
  qwen::Grid target_;
  std::vector<Branch> branches_;
  bool batched_ = false;
};

Prompt QwenImageAdapter::prompt(const PromptEmbeds& p) const {
  return prompt_rows(p, batch(), m_.config().joint_attention_dim);
}

void QwenImageAdapter::check_inputs() {
  grids_ = check_latents(in_, m_.config().in_channels, "reference-image");
  prompt_ = prompt(in_.prompt);
  if (in_.negative.embeds.defined()) negative_ = prompt(in_.negative);
  target_ = {in_.height, in_.width};
}

// The request's sizes, its limits and its activations, before anything is allocated.
void QwenImageAdapter::validate() const {
  std::vector<int64_t> images;
  for (const qwen::Grid& g : grids_) images.push_back(g.tokens());
  const int64_t rows = std::max(prompt_.len, negative_.text ? negative_.len : 0);
  pipeline::RequestSize size{
      .batch = cfg() && opts_.batch_cfg ? checked_mul(batch(), 2, "batch") : batch(),
      .steps = opts_.sigmas.empty() ? opts_.steps : static_cast<int64_t>(opts_.sigmas.size()),
      .images = static_cast<int64_t>(grids_.size()),
      .tokens = pipeline::sum_tokens(rows, images, tokens())};
  pipeline::check_request_limits(size);
  const auto& c = m_.config();
  pipeline::check_request_memory({c.dim(), c.num_layers, c.mlp_hidden(), 4}, size);
}

// One forward's text rows (and validity) for `prompts` stacked along the batch.
void QwenImageAdapter::fill(Branch& br, std::initializer_list<const Prompt*> prompts) const {
  const auto& c = m_.config();
  const int64_t B = batch();
  br.prompts.assign(prompts.begin(), prompts.end());
  br.batch = B * static_cast<int64_t>(prompts.size());
  StackedPrompts stacked = stack_prompts(br.prompts, B, c.joint_attention_dim);
  br.text = std::move(stacked.text);
  br.valid = std::move(stacked.valid);
  // The image stream of every batch row: the step's target, then the references.
  const int64_t all = image_tokens(), C = c.in_channels;
  br.img.assign(static_cast<size_t>(br.batch * all * C), 0.0f);
  for (int64_t row = 0; row < br.batch; ++row) {
    const int64_t b = row % B;
    float* dst = br.img.data() + (row * all + tokens()) * C;
    for (const ReferenceLatents& ref : in_.references) {
      const int64_t n = ref.height * ref.width * C;
      std::copy(ref.latents.f32() + b * n, ref.latents.f32() + (b + 1) * n, dst);
      dst += n;
    }
  }
  br.out.resize(static_cast<size_t>(br.batch * all * c.out_features()));
  br.velocity.resize(static_cast<size_t>(br.batch * tokens() * c.out_features()));
  br.timestep.resize(static_cast<size_t>(br.batch));
  qwen::ArgsQwenImage& a = br.args;
  a.batch = br.batch;
  a.text = br.text.data();
  a.text_len = br.prompts.front()->len;
  a.text_valid = br.valid.empty() ? nullptr : br.valid.data();
  a.img = br.img.data();
  a.img_grids.push_back(target_);
  for (const qwen::Grid& g : grids_) a.img_grids.push_back(g);
  a.timestep = br.timestep.data();
  a.out = br.out.data();
}

int QwenImageAdapter::prepare(bool separate) {
  batched_ = cfg() && opts_.batch_cfg && !separate && prompt_.len == negative_.len;
  return plan_cfg_branches(
      branches_, batched_, cfg(), &prompt_, &negative_,
      [this](Branch& br, std::initializer_list<const Prompt*> prompts) { fill(br, prompts); });
}

void QwenImageAdapter::forward(const ExecContext& ctx, int branch, const pipeline::StepCall& call) {
  Branch& br = branches_[static_cast<size_t>(branch)];
  const auto& c = m_.config();
  const int64_t B = batch(), N = tokens(), all = image_tokens(), C = c.in_channels;
  const int64_t F = c.out_features();
  for (int64_t row = 0; row < br.batch; ++row) {  // this step's target rows
    const float* src = call.latents + (row % B) * N * C;
    std::copy(src, src + N * C, br.img.data() + row * all * C);
  }
  std::fill(br.timestep.begin(), br.timestep.end(), call.timestep);
  br.args.hooks = call.hooks;
  m_.forward(ctx, br.args);
  for (int64_t row = 0; row < br.batch; ++row) {  // the target's rows: noise_pred[:, :N]
    const float* src = br.out.data() + row * all * F;
    std::copy(src, src + N * F, br.velocity.data() + row * N * F);
  }
}

}  // namespace

std::unique_ptr<pipeline::DenoiseAdapter> qwen_image_adapter(const qwen::ModelQwenImage& m,
                                                             const DenoiseInputs& in,
                                                             const DenoiseOptions& opts) {
  return std::make_unique<QwenImageAdapter>(m, in, opts);
}

}  // namespace flowkv::families
