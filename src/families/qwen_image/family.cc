// Qwen-Image (and Edit, Edit-Plus): diffusers QwenImageTransformer2DModel. Every token reads the
// target and follows the current step, so no exact conditioning cache exists: flowkv inspects
// it and answers predict, but does not run it.
#include "families/family.h"
#include "flowkv/error.h"
#include "models/qwen_image/config.h"
#include "models/qwen_image/weights.h"

namespace flowkv::families {

namespace {

constexpr const char* kClass = "QwenImageTransformer2DModel";

std::string describe(const qwen::ConfigQwenImage& c) {
  return "Qwen-Image (" + std::to_string(c.num_layers) + " dual-stream blocks x " +
         std::to_string(c.dim()) + ")";
}

// The released shape, a config.json, or a checkpoint (its config, else inferred from shapes).
qwen::ConfigQwenImage config_of_model(const std::string& model) {
  if (model == "qwen-image") return {};
  if (const std::optional<Json> j = config_of(model)) {
    return qwen::ConfigQwenImage::from_json(*j, model);
  }
  return qwen::config_qwen_image_of(scan_checkpoint(model));
}

// Nothing is cached: the prediction names the model and costs every step in full.
KVPrediction predict_shape(const PredictRequest& r) {
  const qwen::ConfigQwenImage c = config_of_model(r.model);
  const TokenLayout layout = joint_layout(r.text_tokens, r.ref_tokens, r.target_tokens);
  const CachePlan plan = plan_cache(layout, /*cache_exact=*/true, /*text_kv_approx=*/false);
  const cost::ModelShape shape{c.dim(), c.num_layers, c.mlp_hidden(), r.kv_bytes_per_element};
  return prediction(describe(c), shape, layout, plan, r.steps, r.cfg);
}

void inspect_files(const CheckpointScan& scan, InspectReport& r) {
  r.family = "Qwen-Image";
  try {
    const qwen::ConfigQwenImage c = qwen::config_qwen_image_of(scan, &r.config_inferred);
    r.config_json = c.to_json().dump();
    r.variant = "Qwen-Image (" + std::to_string(c.num_layers) + " dual-stream blocks, width " +
                std::to_string(c.dim()) + "); no exact conditioning cache";
    for (const std::string& p : check_against_table(scan.tensors, qwen::weight_table(c)))
      r.problems.push_back(p);
  } catch (const Error& e) {
    r.problems.push_back(e.what());
    r.variant = "Qwen-Image of an unknown configuration";
  }
}

FamilyInfo info() {
  FamilyInfo i;
  i.name = "qwen-image";
  i.title = "Qwen-Image (and Edit, Edit-Plus)";
  i.exact_cache = "";  // none
  i.images = "reference";
  i.released = {"qwen-image"};
  i.default_steps = 50;
  i.true_cfg = true;
  return i;
}

}  // namespace

Family qwen_image_family() {
  Family f;
  f.info = info();
  f.detects = [](const Json& j) { return qwen::class_name(j) == kClass; };
  f.detects_tensors = [](const CheckpointScan& scan) {
    return qwen::holds_qwen_image(scan.tensors);
  };
  f.has_builtin = [](const std::string&) { return false; };
  f.load = [](const std::string& path, const std::string&) -> std::shared_ptr<const FamilyModel> {
    fail(path,
         ": a Qwen-Image transformer. flowkv inspects it and predicts its cost (no exact "
         "conditioning cache exists for it) but does not run it; it runs FLUX.2 and "
         "Qwen-Image-2.1");
  };
  f.builtin = [](const std::string& name, uint64_t,
                 const std::string&) -> std::shared_ptr<const FamilyModel> {
    fail("no built-in Qwen-Image model '", name, "'");
  };
  f.inspect = inspect_files;
  f.predict_shape = predict_shape;
  f.layout = [](const std::string& model, int64_t text, const std::vector<int64_t>& refs,
                int64_t target) -> std::optional<TokenLayout> {
    (void)config_of_model(model);  // a config that is not Qwen-Image's fails here
    return joint_layout(text, refs, target);
  };
  return f;
}

}  // namespace flowkv::families
