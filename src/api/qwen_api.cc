#include "flowkv/qwen_image.h"

#include <filesystem>
#include <optional>

#include "api/flux2_impl.h"
#include "api/shared.h"
#include "core/arena.h"
#include "cost/cost_model.h"
#include "flowkv/error.h"
#include "io/json.h"
#include "io/mapped_file.h"
#include "models/qwen_image/builtin.h"
#include "pipeline/qwen21.h"
#include "pipeline/request_limits.h"

namespace flowkv {

struct QwenImage21Transformer::Impl {
  qwen::Model21 model;
  std::string variant;
};

namespace {

qwen::LoadOptions21 options21(const std::string& dtype) {
  const flux2::LoadOptions f = parse_dtype_option(dtype);
  qwen::LoadOptions21 o;
  o.auto_dtype = f.auto_dtype;
  o.compute = f.compute;
  return o;
}

std::string describe(const qwen::Config21& c) {
  return "Qwen-Image-2.1 (" + std::to_string(c.num_layers) + " blocks, width " +
         std::to_string(c.dim()) +
         (c.causal_condition ? ", causal_condition" : ", no causal_condition") + ")";
}

// Owns the byte masks the pipeline reads.
struct Request {
  pipeline::Qwen21Request r;
  std::vector<uint8_t> valid, nvalid;
  std::vector<float> cond;
};

std::vector<uint8_t> mask_bytes(const Tensor& m, int64_t b, int64_t l) {
  if (!m.defined()) return {};
  FLOWKV_CHECK(m.numel() == b * l, "prompt mask has ", m.numel(), " values for ", b, " x ", l,
               " rows");
  const Tensor f = m.to_f32();
  std::vector<uint8_t> v;
  for (int64_t i = 0; i < f.numel(); ++i) v.push_back(f.f32()[i] != 0);
  return v;
}

void to_request(const QwenImage21Transformer& m, const Qwen21Inputs& in, const Qwen21Options& o,
                Request& q) {
  const auto& c = m.impl().model.config();
  FLOWKV_CHECK(in.noise.defined() && in.noise.ndim() == 3 && in.noise.dim(2) == c.in_channels &&
                   in.noise.dim(1) == pipeline::grid_tokens(in.height, in.width, "the target grid"),
               "noise must be [B, ", in.height, "*", in.width, ", ", c.in_channels, "]");
  const int64_t B = in.noise.dim(0);
  auto prompt = [&](const QwenPrompt& p, std::vector<uint8_t>& valid) {
    FLOWKV_CHECK(
        p.embeds.ndim() == 3 && p.embeds.dim(0) == B && p.embeds.dim(2) == c.context_in_dim,
        "prompt embeddings must be [", B, ", L, ", c.context_in_dim, "], got ",
        shape_str(p.embeds.shape()));
    FLOWKV_CHECK(p.slots.empty() || static_cast<int64_t>(p.slots.size()) == p.embeds.dim(1),
                 "the slot mask has ", p.slots.size(), " entries for ", p.embeds.dim(1),
                 " prompt rows");
    valid = mask_bytes(p.mask, B, p.embeds.dim(1));
    return pipeline::Qwen21Prompt{p.embeds.f32(), p.embeds.dim(1),
                                  p.slots.empty() ? nullptr : p.slots.data(),
                                  valid.empty() ? nullptr : valid.data()};
  };
  q.r.batch = B;
  q.r.prompt = prompt(in.prompt, q.valid);
  if (in.negative.embeds.defined()) q.r.negative = prompt(in.negative, q.nvalid);
  q.r.cfg_scale = in.cfg_scale;
  for (const ReferenceLatents& ref : in.conditions) {
    FLOWKV_CHECK(ref.latents.ndim() == 3 && ref.latents.dim(0) == B &&
                     ref.latents.dim(1) ==
                         pipeline::grid_tokens(ref.height, ref.width, "a condition-image grid") &&
                     ref.latents.dim(2) == c.in_channels,
                 "condition latents must be [", B, ", h*w, ", c.in_channels, "]");
    q.r.cond_grids.push_back({ref.height, ref.width});
  }
  // Concatenate the conditions per batch element.
  for (int64_t b = 0; b < B; ++b) {
    for (const ReferenceLatents& ref : in.conditions) {
      const int64_t n = ref.height * ref.width * c.in_channels;
      q.cond.insert(q.cond.end(), ref.latents.f32() + b * n, ref.latents.f32() + (b + 1) * n);
    }
  }
  q.r.cond = q.cond.empty() ? nullptr : q.cond.data();
  q.r.noise = in.noise.f32();
  q.r.target = {in.height, in.width};
  q.r.steps = o.steps;
  q.r.use_cache = o.use_cache;
  q.r.batch_cfg = o.batch_cfg;
  q.r.sigmas = o.sigmas;
  q.r.kv_budget_bytes = o.kv_budget_bytes;
  q.r.on_step = o.on_step;
  q.r.step_caches = o.step_caches;
}

KVPrediction predict(const qwen::Config21& c, const std::string& name, int64_t text,
                     const std::vector<int64_t>& conds, int64_t target, int steps, bool cfg,
                     int kv_bytes) {
  FLOWKV_CHECK(steps >= 1 && text >= 0 && target > 0,
               "steps and the target's tokens must be positive, text tokens non-negative");
  pipeline::check_request_limits({.steps = steps,
                                  .images = static_cast<int64_t>(conds.size()),
                                  .tokens = pipeline::sum_tokens(text, conds, target)});
  // Rows: the condition images first (each as one slot run), then the text.
  std::vector<uint8_t> slots;
  std::vector<qwen::Grid> grids;
  for (int64_t n : conds) {
    FLOWKV_CHECK(n % 4 == 0, "a condition image needs a multiple of 4 latent tokens");
    slots.insert(slots.end(), static_cast<size_t>(n / 4), 1);
    grids.push_back({n / 4, 4});
  }
  slots.insert(slots.end(), static_cast<size_t>(text), 0);
  FLOWKV_CHECK(target % 4 == 0, "the target needs a multiple of 4 latent tokens");
  const qwen::Layout21 l = qwen::build_layout21(static_cast<int64_t>(slots.size()), slots.data(),
                                                grids, {target / 4, 4});
  const TokenLayout layout = qwen::token_layout21(l, c.causal_condition);
  const CachePlan plan = plan_cache(layout, true, false);
  const cost::ModelShape shape{c.dim(), c.num_layers, c.mlp_hidden(), kv_bytes};
  return api::prediction(name, shape, layout, plan, steps, cfg);
}

}  // namespace

QwenImage21Transformer QwenImage21Transformer::load(const std::string& path,
                                                    const std::string& dtype) {
  auto impl = std::make_shared<Impl>();
  impl->model = qwen::Model21::load(path, options21(dtype));
  impl->variant = describe(impl->model.config());
  QwenImage21Transformer t;
  t.impl_ = std::move(impl);
  return t;
}

QwenImage21Transformer QwenImage21Transformer::builtin(const std::string& name, uint64_t seed,
                                                       const std::string& dtype) {
  qwen::Config21 c;
  FLOWKV_CHECK(qwen::builtin_config21(name, &c), "no built-in Qwen-Image-2.1 model '", name,
               "' (choose qwen21-tiny or qwen21-small)");
  const qwen::LoadOptions21 o = options21(dtype);
  const DType store = !o.auto_dtype && o.compute == DType::kBF16 ? DType::kBF16 : DType::kF32;
  auto impl = std::make_shared<Impl>();
  impl->model = qwen::Model21::from_tensors(qwen::random_weights21(c, seed, store), c, o);
  impl->variant = "built-in '" + name + "' (" + describe(c) + ", random weights)";
  QwenImage21Transformer t;
  t.impl_ = std::move(impl);
  return t;
}

std::vector<std::string> QwenImage21Transformer::builtin_names() {
  return qwen::builtin_names21();
}
std::string QwenImage21Transformer::variant() const {
  return impl_->variant;
}
std::string QwenImage21Transformer::config_json() const {
  return impl_->model.config().to_json().dump(2);
}
std::string QwenImage21Transformer::compute_dtype() const {
  return std::string(dtype_name(impl_->model.compute_dtype()));
}
int64_t QwenImage21Transformer::in_channels() const {
  return impl_->model.config().in_channels;
}
int64_t QwenImage21Transformer::text_channels() const {
  return impl_->model.config().context_in_dim;
}
bool QwenImage21Transformer::causal_condition() const {
  return impl_->model.config().causal_condition;
}

DenoiseResult denoise_qwen21(const QwenImage21Transformer& m, const Qwen21Inputs& in,
                             const Qwen21Options& o, Workspace* ws) {
  Request q;
  to_request(m, in, o, q);
  Workspace local;
  Arena& arena = (ws ? *ws : local).arena();
  const pipeline::Qwen21Result res = pipeline::run_qwen21({&arena}, m.impl().model, q.r);
  return api::denoise_result(res, in.noise.shape());
}

int64_t kv_bytes_needed(const QwenImage21Transformer& m, const Qwen21Inputs& in,
                        const Qwen21Options& o) {
  Request q;
  to_request(m, in, o, q);
  return pipeline::planned_kv_bytes(m.impl().model, q.r);
}

KVPrediction predict_qwen21(const QwenImage21Transformer& m, int64_t text,
                            const std::vector<int64_t>& conds, int64_t target, int steps,
                            bool cfg) {
  const qwen::Model21& model = m.impl().model;
  return predict(model.config(), m.variant(), text, conds, target, steps, cfg,
                 static_cast<int>(dtype_size(model.kv_dtype())));
}

namespace {
std::optional<Json> read_config(const std::string& path) {
  if (path.empty() || !path_exists(path)) return std::nullopt;
  if (path_kind(path) == PathKind::kFile) return read_json_file(path);
  for (const char* sub : {"config.json", "transformer/config.json"}) {
    const std::string p = (std::filesystem::path(path) / sub).string();
    if (path_exists(p)) return read_json_file(p);
  }
  return std::nullopt;
}
}  // namespace

bool is_qwen21_config(const std::string& path) {
  const auto j = read_config(path);
  return j && qwen::class_name(*j) == "QwenImage21Transformer2DModel";
}

KVPrediction predict_qwen21_shape(const std::string& config, int64_t text,
                                  const std::vector<int64_t>& conds, int64_t target, int steps,
                                  bool cfg) {
  if (config.empty()) {
    const qwen::Config21 c;
    return predict(c, describe(c) + ", as released", text, conds, target, steps, cfg, 2);
  }
  const auto j = read_config(config);
  FLOWKV_CHECK(j, config, ": no config.json found");
  const qwen::Config21 c = qwen::Config21::from_json(*j, config);
  return predict(c, describe(c), text, conds, target, steps, cfg, 2);
}

}  // namespace flowkv
