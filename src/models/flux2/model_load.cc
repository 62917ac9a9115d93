// Loading: validate the files against the name table, then pack every linear layer once.
#include "flowkv/error.h"
#include "models/common/held_bytes.h"
#include "models/flux2/model.h"
#include "models/flux2/model_weights.h"

namespace flowkv::flux2 {

namespace {

std::vector<float> vec(const Tensor& t) {
  const Tensor f = t.to_f32();
  return std::vector<float>(f.f32(), f.f32() + f.numel());
}

void validate(const WeightSource& src, const Config& cfg) {
  std::vector<std::string> lines;
  for (const std::string& k : src.unmapped()) lines.push_back("unknown BFL key: " + k);
  const Config found = infer_config(src.tensors());
  for (const std::string& s : config_disagreements(cfg, found, src.tensors())) lines.push_back(s);
  for (const std::string& s : check_against_table(src.tensors(), weight_table(cfg))) {
    lines.push_back(s);
  }
  if (!lines.empty()) {
    fail(format_problems(src.scan().path + " does not hold a FLUX.2 transformer of its config",
                         lines));
  }
}

}  // namespace

DType choose_compute_dtype(const WeightSource& src, const LoadOptions& opts) {
  if (!opts.auto_dtype) return opts.compute;
  for (const auto& [name, info] : src.tensors()) {
    if (!info.dtype_known || info.dtype != DType::kBF16) return DType::kF32;
  }
  return src.tensors().empty() ? DType::kF32 : DType::kBF16;
}

Model Model::load(const std::string& path, const LoadOptions& opts) {
  WeightSource src(scan_checkpoint(path));
  Config cfg = src.scan().config
                   ? Config::from_json(*src.scan().config, src.scan().path + "/config.json")
                   : infer_config(src.tensors());
  if (!src.scan().config) cfg.validate(src.scan().path + " (config inferred from shapes)");
  return from_source(src, cfg, opts);
}

Model Model::from_source(const WeightSource& src, const Config& cfg, const LoadOptions& opts) {
  validate(src, cfg);
  const DType compute = choose_compute_dtype(src, opts);
  check_weights_fit(weight_table(cfg), held_bytes(src.tensors(), compute), variant_name(cfg));
  auto w = std::make_shared<Weights>();
  w->cfg = cfg;
  w->compute = compute;
  const ops::Compute dt{w->compute, opts.int8};
  const bool plain = opts.keep_plain;
  auto lin = [&](const std::string& name) { return ops::Linear(src.get(name), dt, plain); };
  auto stack = [&](std::vector<std::string> names) {
    std::vector<Tensor> ts;
    for (const auto& n : names) ts.push_back(src.get(n));
    return ops::Linear::stacked(ts, dt, plain);
  };
  w->x_embedder = lin(weight_name(GlobalW::kXEmbedder));
  w->context_embedder = lin(weight_name(GlobalW::kContextEmbedder));
  w->time_1 = lin(weight_name(GlobalW::kTimeLinear1));
  w->time_2 = lin(weight_name(GlobalW::kTimeLinear2));
  if (cfg.guidance_embeds) {
    w->guidance_1 = lin(weight_name(GlobalW::kGuidanceLinear1));
    w->guidance_2 = lin(weight_name(GlobalW::kGuidanceLinear2));
  }
  w->mod_img = lin(weight_name(GlobalW::kModImg));
  w->mod_txt = lin(weight_name(GlobalW::kModTxt));
  w->mod_single = lin(weight_name(GlobalW::kModSingle));
  w->norm_out = lin(weight_name(GlobalW::kNormOut));
  w->proj_out = lin(weight_name(GlobalW::kProjOut));
  for (int64_t i = 0; i < cfg.num_layers; ++i) {
    auto n = [&](DoubleW k) { return weight_name(i, k); };
    DoubleBlockWeights b;
    b.qkv = stack({n(DoubleW::kToQ), n(DoubleW::kToK), n(DoubleW::kToV)});
    b.qkv_txt = stack({n(DoubleW::kAddQ), n(DoubleW::kAddK), n(DoubleW::kAddV)});
    b.out = lin(n(DoubleW::kToOut));
    b.out_txt = lin(n(DoubleW::kToAddOut));
    b.ff_in = lin(n(DoubleW::kFfIn));
    b.ff_out = lin(n(DoubleW::kFfOut));
    b.ff_txt_in = lin(n(DoubleW::kFfContextIn));
    b.ff_txt_out = lin(n(DoubleW::kFfContextOut));
    b.norm_q = vec(src.get(n(DoubleW::kNormQ)));
    b.norm_k = vec(src.get(n(DoubleW::kNormK)));
    b.norm_added_q = vec(src.get(n(DoubleW::kNormAddedQ)));
    b.norm_added_k = vec(src.get(n(DoubleW::kNormAddedK)));
    w->doubles.push_back(std::move(b));
  }
  for (int64_t i = 0; i < cfg.num_single_layers; ++i) {
    auto n = [&](SingleW k) { return weight_name(i, k); };
    SingleBlockWeights b;
    b.qkv_mlp = lin(n(SingleW::kQkvMlp));
    b.out = lin(n(SingleW::kToOut));
    b.norm_q = vec(src.get(n(SingleW::kNormQ)));
    b.norm_k = vec(src.get(n(SingleW::kNormK)));
    w->singles.push_back(std::move(b));
  }
  Model m;
  m.w_ = std::move(w);
  return m;
}

const Config& Model::config() const {
  return w_->cfg;
}
DType Model::compute_dtype() const {
  return w_->compute;
}

int64_t Model::weight_bytes() const {
  const Weights& w = *w_;
  int64_t b = 0;
  for (const ops::Linear* l :
       {&w.x_embedder, &w.context_embedder, &w.time_1, &w.time_2, &w.guidance_1, &w.guidance_2,
        &w.mod_img, &w.mod_txt, &w.mod_single, &w.norm_out, &w.proj_out}) {
    b += l->packed_bytes();
  }
  for (const auto& d : w.doubles) {
    for (const ops::Linear* l : {&d.qkv, &d.qkv_txt, &d.out, &d.out_txt, &d.ff_in, &d.ff_out,
                                 &d.ff_txt_in, &d.ff_txt_out}) {
      b += l->packed_bytes();
    }
  }
  for (const auto& s : w.singles) b += s.qkv_mlp.packed_bytes() + s.out.packed_bytes();
  return b;
}

}  // namespace flowkv::flux2
