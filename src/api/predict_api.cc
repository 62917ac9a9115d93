#include <sstream>

#include "families/family.h"
#include "flowkv/error.h"
#include "flowkv/predict.h"

namespace flowkv {

KVPrediction predict(const PredictRequest& r) {
  return families::resolve(r.model).predict_shape(r);
}

std::string cacheability_report(const std::string& model, int64_t text,
                                const std::vector<int64_t>& refs, int64_t target) {
  const std::optional<TokenLayout> l = families::resolve(model).layout(model, text, refs, target);
  if (!l) return "";
  const Cacheability c = check_cacheable(*l);
  std::ostringstream o;
  o << "cacheable exactly (constant input, fixed-time modulation, reads only cacheable tokens):\n";
  for (size_t i = 0; i < l->segments.size(); ++i) {
    o << "  " << l->segments[i].name << ": " << (c.cacheable[i] ? "yes" : "no");
    for (size_t j = 0; j < c.broken[i].size(); ++j) o << (j ? "; " : " - ") << c.broken[i][j];
    o << "\n";
  }
  return o.str();
}

int64_t latent_tokens_for_pixels(int64_t w, int64_t h) {
  FLOWKV_CHECK(w >= 16 && h >= 16, "an image must be at least 16x16 pixels, got ", w, "x", h);
  return (w / 16) * (h / 16);
}

std::vector<std::string> released_model_names() {
  std::vector<std::string> out;
  for (const families::Family& f : families::registry())
    out.insert(out.end(), f.info.released.begin(), f.info.released.end());
  return out;
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
  bool any_cached = false;
  for (const SegmentFlops& s : p.segments) any_cached = any_cached || s.cached;
  if (!any_cached) {
    // No cached column, speedup or payload for a cache this layout never builds.
    o << "\nper step                tokens         FLOPs\n";
    for (const SegmentFlops& s : p.segments) {
      o << "  " << s.name << std::string(s.name.size() < 20 ? 20 - s.name.size() : 1, ' ');
      o.width(8);
      o << s.tokens << "  ";
      o.width(14);
      o << tflop(s.uncached_flops) << "\n";
    }
    o << "  total                         ";
    o.width(14);
    o << tflop(p.uncached_step_flops) << "\n\n";
    o << "no exact cache applies: no segment of this layout is cacheable (why, below), so every "
         "step computes every token";
    if (p.branches > 1) o << " in both branches";
    o << "\n";
    return o.str();
  }
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
  std::string cached;  // the cached segments' names
  for (const SegmentFlops& s : p.segments) {
    if (s.cached) cached += (cached.empty() ? "" : ", ") + s.name;
  }
  o << "over " << p.steps << " step" << (p.steps == 1 ? "" : "s") << " (step 0 computes and stores "
    << (cached.empty() ? std::string("nothing") : cached) << "): predicted speedup " << p.speedup
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
