#include <filesystem>
#include <sstream>

#include "api/flux2_impl.h"
#include "api/shared.h"
#include "cost/cost_model.h"
#include "flowkv/error.h"
#include "flowkv/predict.h"
#include "io/checkpoint.h"
#include "io/mapped_file.h"
#include "models/flux2/layout.h"
#include "pipeline/request_limits.h"

namespace flowkv {

namespace {

flux2::Config resolve_config(const std::string& model, std::string* name) {
  flux2::Config c;
  if (flux2::released_config(model, &c)) {
    *name = flux2::variant_name(c);
    return c;
  }
  FLOWKV_CHECK(path_exists(model), "unknown model '", model,
               "': give a released shape (klein-4b, klein-9b, klein-9b-kv, dev), a config.json, "
               "or a checkpoint folder");
  if (path_kind(model) == PathKind::kFile && model.size() > 5 &&
      model.substr(model.size() - 5) == ".json") {
    c = flux2::Config::from_json(read_json_file(model), model);
  } else {
    const CheckpointScan scan = scan_checkpoint(model);
    if (scan.config) {
      c = flux2::Config::from_json(*scan.config, scan.path + "/config.json");
    } else {
      c = flux2::infer_config(scan.tensors);
      c.validate(scan.path + " (config inferred from shapes)");
    }
  }
  *name = flux2::variant_name(c);
  return c;
}

KVPrediction predict(const flux2::Config& c, const std::string& name, int64_t text, int64_t target,
                     const std::vector<int64_t>& refs, int steps, bool cfg, int kv_bytes) {
  FLOWKV_CHECK(steps >= 1, "steps must be at least 1");
  FLOWKV_CHECK(text > 0 && target > 0, "text and target token counts must be positive");
  pipeline::check_request_limits({.steps = steps,
                                  .images = static_cast<int64_t>(refs.size()),
                                  .tokens = pipeline::sum_tokens(text, refs, target)});
  const cost::ModelShape shape = flux2::cost_shape(c, kv_bytes);
  const TokenLayout layout = flux2::klein_kv_layout(text, refs, target);
  const CachePlan plan = plan_cache(layout, /*cache_exact=*/true, /*text_kv_approx=*/false);
  return api::prediction(name, shape, layout, plan, steps, cfg);
}

}  // namespace

KVPrediction predict_klein_kv(const PredictRequest& r) {
  std::string name;
  const flux2::Config c = resolve_config(r.model, &name);
  return predict(c, name, r.text_tokens, r.target_tokens, r.ref_tokens, r.steps, r.cfg,
                 r.kv_bytes_per_element);
}

KVPrediction predict_klein_kv(const Flux2Transformer& m, int64_t text, int64_t target,
                              const std::vector<int64_t>& refs, int steps) {
  const flux2::Model& model = m.impl().model;
  return predict(model.config(), m.variant(), text, target, refs, steps, false,
                 static_cast<int>(dtype_size(model.kv_dtype())));
}

std::string cacheability_report(const std::string& model, int64_t text,
                                const std::vector<int64_t>& refs, int64_t target) {
  TokenLayout l;
  const int k = static_cast<int>(refs.size());
  auto all = [&] {
    std::vector<int> v;
    for (int i = 0; i < k + 2; ++i) v.push_back(i);
    return v;
  };
  if (model == "klein-9b-kv") {
    l = flux2::klein_kv_layout(text, refs, target);
  } else if (model == "klein-4b" || model == "klein-9b" || model == "dev" ||
             model == "qwen-image") {
    // References appended to the image stream: same timestep, full attention both ways.
    l.segments.push_back({"text", SegmentKind::kText, text, true, false, 0, all()});
    for (int i = 0; i < k; ++i) {
      l.segments.push_back({"ref " + std::to_string(i + 1), SegmentKind::kReference,
                            refs[static_cast<size_t>(i)], true, false, 0, all()});
    }
    l.segments.push_back({"target", SegmentKind::kTarget, target, false, false, 0, all()});
  } else if (model == "qwen-image-2.1" || model == "qwen-image-2.1-no-causal") {
    const bool causal = model == "qwen-image-2.1";
    std::vector<int> before;
    for (int i = 0; i < k; ++i) {
      Segment s{"condition " + std::to_string(i + 1),
                SegmentKind::kReference,
                refs[static_cast<size_t>(i)],
                true,
                causal,
                0,
                before};
      s.reads.push_back(i);
      before.push_back(i);
      l.segments.push_back(s);
    }
    Segment t{"text", SegmentKind::kText, text, true, causal, 0, before};
    t.reads.push_back(k);
    t.causal = true;
    before.push_back(k);
    l.segments.push_back(t);
    Segment g{"target", SegmentKind::kTarget, target, false, false, 0, before};
    g.reads.push_back(k + 1);
    l.segments.push_back(g);
  } else {
    fail("unknown model '", model,
         "': klein-9b-kv, klein-4b, klein-9b, dev, qwen-image-2.1, qwen-image-2.1-no-causal, "
         "qwen-image");
  }
  const Cacheability c = check_cacheable(l);
  std::ostringstream o;
  o << "cacheable exactly (constant input, fixed-time modulation, reads only cacheable tokens):\n";
  for (size_t i = 0; i < l.segments.size(); ++i) {
    o << "  " << l.segments[i].name << ": " << (c.cacheable[i] ? "yes" : "no");
    for (size_t j = 0; j < c.broken[i].size(); ++j) o << (j ? "; " : " - ") << c.broken[i][j];
    o << "\n";
  }
  return o.str();
}

int64_t flux2_tokens_for_pixels(int64_t w, int64_t h) {
  FLOWKV_CHECK(w >= 16 && h >= 16, "an image must be at least 16x16 pixels, got ", w, "x", h);
  return (w / 16) * (h / 16);
}

std::vector<std::string> released_model_names() {
  return flux2::released_config_names();
}

std::string format_prediction(const KVPrediction& p) {
  std::ostringstream o;
  o.setf(std::ios::fixed);
  auto tflop = [](double f) {
    std::ostringstream s;
    s.setf(std::ios::fixed);
    s.precision(f >= 1e12 ? 1 : 4);
    s << f / 1e12 << " TFLOP";
    return s.str();
  };
  const double gib = double(int64_t{1} << 30);
  o << "model:      " << p.model << " (width " << p.width << ", " << p.layers << " layers)\n";
  if (p.branches > 1)
    o << "guidance:   classifier-free, 2 branches (two caches, twice the compute)\n";
  o << "\nper step                tokens    uncached        cached\n";
  for (const SegmentFlops& s : p.segments) {
    o << "  " << s.name << std::string(s.name.size() < 20 ? 20 - s.name.size() : 1, ' ');
    o.width(8);
    o << s.tokens << "  ";
    o.width(14);
    o << tflop(s.uncached_flops) << "  ";
    o.width(14);
    o << (s.cached ? std::string("(from cache)") : tflop(s.cached_flops)) << "\n";
  }
  o << "  total                         ";
  o.width(14);
  o << tflop(p.uncached_step_flops) << "  ";
  o.width(14);
  o << tflop(p.cached_step_flops) << "\n\n";
  o.precision(3);
  o << "over " << p.steps << " step" << (p.steps == 1 ? "" : "s")
    << " (step 0 computes and stores the references): predicted speedup " << p.speedup
    << "x, saving ";
  o.precision(1);
  o << 100 * p.saving() << "%\n";
  o.precision(3);
  o << "KV payload: " << p.kv_bytes << " bytes = " << p.kv_bytes / gib << " GiB ("
    << p.kv_bytes_per_element << " bytes per element";
  if (p.branches > 1) o << ", both branches";
  o << ")\n";
  return o.str();
}

}  // namespace flowkv
