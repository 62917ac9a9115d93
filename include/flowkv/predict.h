// Predicted FLOPs, speedup and KV memory of a family's exact conditioning cache (the cost model
// of spec kv-cost-model.md; the benchmark's "predicted" column comes from here too). For a
// loaded model: flowkv::predict (flowkv/model.h).
#pragma once

#include <string>
#include <vector>

namespace flowkv {

struct SegmentFlops {
  std::string name;
  int64_t tokens = 0;
  bool cached = false;  // read from memory in the cached steps
  double uncached_flops = 0;
  double cached_flops = 0;
};

struct KVPrediction {
  std::string model;
  int64_t width = 0, layers = 0;
  int steps = 1;
  int branches = 1;  // 2 with classifier-free guidance: two caches, twice the compute
  std::vector<SegmentFlops> segments;
  double uncached_step_flops = 0;  // all branches
  double cached_step_flops = 0;
  double speedup = 1;            // over `steps` steps, step 0 paying full price
  int64_t kv_bytes = 0;          // payload, all branches
  int64_t activation_bytes = 0;  // peak activations of one forward over the whole sequence
  int kv_bytes_per_element = 2;
  double saving() const { return 1.0 - 1.0 / speedup; }
};

struct PredictRequest {
  // A released shape (released_model_names()), or a config.json / checkpoint of any family.
  std::string model = "klein-9b-kv";
  int64_t text_tokens = 512;
  int64_t target_tokens = 4096;
  std::vector<int64_t> ref_tokens = {2816};  // conditioning images (references, conditions)
  int steps = 4;
  bool cfg = false;
  int kv_bytes_per_element = 2;  // bf16
};

// The model's family is found through the registry (detect_family, flowkv/model.h). A family
// without an exact cache (FamilyInfo::exact_cache empty) predicts every segment uncached.
KVPrediction predict(const PredictRequest& r);
std::string format_prediction(const KVPrediction& p);

// Which segments of a model's token layout can be cached exactly, and for the others which of
// the three rules each breaks. model: a released shape (released_model_names()) or a config /
// checkpoint; empty when its rules do not follow from the shape alone (a FLUX.2 config: Klein
// 9B and Klein 9B KV share one architecture).
std::string cacheability_report(const std::string& model, int64_t text_tokens,
                                const std::vector<int64_t>& ref_tokens, int64_t target_tokens);

// Latent tokens of an image: 16 x 16 pixels per token in every registered family.
int64_t latent_tokens_for_pixels(int64_t width_px, int64_t height_px);
// Every family's released shapes, in registration order.
std::vector<std::string> released_model_names();

}  // namespace flowkv
