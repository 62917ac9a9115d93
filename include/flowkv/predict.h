// Predicted FLOPs, speedup and KV memory of the exact reference cache (the cost model of
// spec kv-cost-model.md; the benchmark's "predicted" column comes from here too).
#pragma once

#include <string>
#include <vector>

#include "flowkv/flux2.h"

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
  double speedup = 1;    // over `steps` steps, step 0 paying full price
  int64_t kv_bytes = 0;  // payload, all branches
  int kv_bytes_per_element = 2;
  double saving() const { return 1.0 - 1.0 / speedup; }
};

struct PredictRequest {
  std::string model = "klein-9b-kv";  // a released shape, or a config.json / checkpoint folder
  int64_t text_tokens = 512;
  int64_t target_tokens = 4096;
  std::vector<int64_t> ref_tokens = {2816};
  int steps = 4;
  bool cfg = false;
  int kv_bytes_per_element = 2;  // bf16
};

KVPrediction predict_klein_kv(const PredictRequest& r);
// For a loaded model (its config; K/V element size from its compute dtype).
KVPrediction predict_klein_kv(const Flux2Transformer& m, int64_t text_tokens, int64_t target_tokens,
                              const std::vector<int64_t>& ref_tokens, int steps);
std::string format_prediction(const KVPrediction& p);

// Which segments of a released model's token layout can be cached exactly, and for the others
// which of the three rules each breaks. model: klein-9b-kv, klein-4b, klein-9b, dev,
// qwen-image-2.1, qwen-image-2.1-no-causal, qwen-image.
std::string cacheability_report(const std::string& model, int64_t text_tokens,
                                const std::vector<int64_t>& ref_tokens, int64_t target_tokens);

// FLUX.2 latent tokens of an image (16 x 16 pixels per token).
int64_t flux2_tokens_for_pixels(int64_t width_px, int64_t height_px);
std::vector<std::string> released_model_names();

}  // namespace flowkv
