// NucleusMoE-Image's mixture-of-experts MLP (diffusers 0.42.1 NucleusMoELayer and
// SwiGLUExperts, transformer_nucleusmoe_image.py): a router on [temb | un-modulated input],
// expert-choice routing (each expert takes its top-C tokens), per-token renormalised weights
// times route_scale, routed SwiGLU experts (gate first) run as one grouped GEMM over the tokens
// gathered per expert, a shared SwiGLU expert (value first, diffusers' FeedForward "swiglu"),
// and the routed outputs scatter-added onto the shared one in the reference's order.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/exec_context.h"
#include "flowkv/tensor.h"
#include "ops/linear.h"

namespace flowkv::nucleus {

struct MoEConfig {
  int64_t dim = 0;             // D: the block width
  int64_t inner = 0;           // I: moe_intermediate_dim
  int64_t experts = 0;         // E: num_experts
  double capacity_factor = 0;  // C = max(1, ceil(capacity_factor * S / E)) tokens per expert
  bool use_sigmoid = false;    // sigmoid router scores instead of softmax
  double route_scale = 1.0;
};

// How the routed experts' matrices are stored: as diffusers keeps them, pre-transposed for
// x @ W (gate_up_proj [E, D, 2I], down_proj [E, I, D]), or output-major per expert
// (gate_up_proj [E, 2I, D], down_proj [E, D, I]: rows of whole quantization blocks), as
// `flowkv quantize` writes them into a GGUF file.
enum class ExpertLayout { kInputMajor, kOutputMajor };

// The names of one MoE layer's tensors, relative to its prefix ("transformer_blocks.{i}.img_mlp.").
namespace wmoe {
inline constexpr const char* kRouter = "gate.weight";                        // [E, 2D]
inline constexpr const char* kGateUp = "experts.gate_up_proj";               // see ExpertLayout
inline constexpr const char* kDown = "experts.down_proj";                    // see ExpertLayout
inline constexpr const char* kSharedIn = "shared_expert.net.0.proj.weight";  // [2I, D]
inline constexpr const char* kSharedOut = "shared_expert.net.2.weight";      // [D, I]
}  // namespace wmoe

class MoELayer {
 public:
  MoELayer() = default;
  // `get(leaf)` returns the tensor named prefix + leaf (one of wmoe::*), in any stored dtype
  // (F32, BF16, F16 or a GGUF block type: quantized experts stay as stored). Shapes are checked
  // against `c` with an Error naming the tensor.
  static MoELayer from_tensors(const std::function<Tensor(const std::string&)>& get,
                               const MoEConfig& c, ExpertLayout layout, ops::Compute compute,
                               bool keep_plain = false);
  // The same, with the tensors' prefix ("transformer_blocks.3.img_mlp.") for error messages.
  static MoELayer from_tensors(const std::function<Tensor(const std::string&)>& get,
                               const MoEConfig& c, ExpertLayout layout, ops::Compute compute,
                               bool keep_plain, const std::string& prefix);

  const MoEConfig& config() const;
  // Bytes the weights occupy as held.
  int64_t bytes() const;

  // out[B*S, D] = shared(xm) + sum over the experts that chose a token of w * expert(xm), for
  // B batch elements of S tokens each. temb [B, D] is the block's timestep embedding, xn
  // [B*S, D] the un-modulated input (router), xm [B*S, D] the modulated input. Under BF16
  // compute every value the reference rounds to bf16 is rounded the same way. The result does
  // not depend on the thread count.
  void forward(const ExecContext& ctx, int64_t B, int64_t S, const float* temb, const float* xn,
               const float* xm, float* out) const;

  // The routing alone, for tests and the benchmark: for batch element b and expert e, the
  // token indices it chose (in the order torch.topk returns them) and their final weights.
  struct Routing {
    int64_t capacity = 0;
    std::vector<int64_t> tokens;  // [B, E, C]
    std::vector<float> weights;   // [B, E, C]: after renormalisation and route_scale
  };
  Routing route(const ExecContext& ctx, int64_t B, int64_t S, const float* temb,
                const float* xn) const;

  struct Weights;

 private:
  std::shared_ptr<const Weights> w_;
};

}  // namespace flowkv::nucleus
