// The one FLOP and memory model (spec kv-cost-model.md), used by `flowkv predict`, the
// benchmark's predicted column and the docs.
//
// Per layer and token through the linear layers: 2 * (4 d^2 + 3 F d) FLOPs (q, k, v, out; a
// SwiGLU MLP of hidden F: 2F*d in, F*d out), i.e. 2 * 13 d^2 when F = 3d. A FLUX.2 double block
// runs each token through its own stream's weights, so it costs the same per token. Attention:
// 4 d FLOPs per allowed query-key pair per layer. Norms, RoPE, modulation and embedders are
// ignored (small at these widths).
//
// Generalised by the shape's optional fields: grouped-query attention (k and v of kv_width:
// 2 * (2 d^2 + 2 d kv) for the attention's projections), an MLP that is not one dense SwiGLU
// (mlp_flops: a mixture of experts' router, shared expert and routed experts per token on
// average), and segments that enter only as keys and values (Segment::keys_only: their
// projections cost keys_only_flops per token and layer, and they have no queries).
#pragma once

#include <string>
#include <vector>

#include "segments/layout.h"

namespace flowkv::cost {

struct ModelShape {
  int64_t width = 0;       // d
  int64_t layers = 0;      // blocks whose K/V are cached (FLUX.2: double + single)
  int64_t mlp_hidden = 0;  // F
  int64_t kv_bytes_per_element = 2;
  int64_t kv_width = 0;        // width of K and V (grouped-query attention); 0: width
  double mlp_flops = 0;        // FLOPs per token and layer of the MLP; 0: a SwiGLU of F
  double keys_only_flops = 0;  // FLOPs per token and layer of a keys-only segment
  int64_t kv() const { return kv_width > 0 ? kv_width : width; }
  double linear_flops_per_token_layer() const {
    const double d = double(width), mlp = mlp_flops > 0 ? mlp_flops : 6.0 * double(mlp_hidden) * d;
    return 2.0 * (2.0 * d * d + 2.0 * d * double(kv())) + mlp;
  }
};

struct SegmentCost {
  std::string name;
  int64_t tokens = 0;
  bool live = true;  // computed this step (false: read from its memory)
  double linear = 0;
  double attention = 0;  // of this segment's queries
};

struct StepCost {
  std::vector<SegmentCost> segments;
  double linear = 0, attention = 0;
  double total() const { return linear + attention; }
};

// One step's FLOPs with `cached` segments read from memory (not computed, still read as keys).
StepCost step_cost(const ModelShape& m, const TokenLayout& layout, const std::vector<bool>& cached);

// Over n steps, only the first pays the full price (prefill): n*F / (F + (n-1)*C), where the
// uncached baseline pays F at every step.
double predicted_speedup(double uncached_step, double cached_step, int steps);

// 2 (K and V) x layers x tokens x kv width x bytes per element x CFG branches.
int64_t kv_payload_bytes(const ModelShape& m, int64_t cached_tokens, int branches = 1);

}  // namespace flowkv::cost

namespace flowkv::cost {

// Activation bytes of one forward over `tokens` tokens of `batch` sequences: the residual
// stream, the modulated input, q/k/v and the attention output (8 d) and the MLP's hidden
// activations (3 F) per token, f32, doubled for the temporaries around them. An upper bound
// used to refuse a request before it allocates, not a measurement.
int64_t activation_bytes(const ModelShape& m, int64_t batch, int64_t tokens);

}  // namespace flowkv::cost
