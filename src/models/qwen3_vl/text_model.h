// The Qwen3-VL language model (transformers 5.24 Qwen3VLModel's language side, as
// Qwen3VLForConditionalGeneration runs it for Qwen-Image 2.1's prompt encoder): token
// embeddings with the vision tower's outputs scattered into the <|image_pad|> rows, Qwen3
// decoder layers (models/qwen3/decoder.h) with interleaved multimodal RoPE on 3-D positions, and
// the deepstack features added to the image rows after the first layers. One prompt: the
// pipelines encode the positive and negative prompts in separate calls (NucleusMoE-Image pads
// its prompt, so a text-only prompt may carry an attention mask).
//
// The vision tower (pixels -> embeds, deepstack) is not here: its outputs come in as
// VisionOutputs, in the order of the image placeholders in the ids.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/exec_context.h"
#include "flowkv/tensor.h"
#include "io/checkpoint.h"
#include "models/qwen3_vl/config.h"

namespace flowkv::qwen3_vl {

// An image's grid in vision patches (t, h, w), as the image processor's image_grid_thw gives it.
using Grid = std::array<int64_t, 3>;

// What the vision tower gives the language model for all the images of one prompt together:
// `embeds` [n_image_tokens, hidden] (pooler_output, the images concatenated in order) and one
// tensor of the same shape per deepstack layer (deepstack_features, concatenated the same way).
struct VisionOutputs {
  Tensor embeds;
  std::vector<Tensor> deepstack;
};

struct LoadOptions {
  // As qwen3::LoadOptions: BF16 compute when every weight read is BF16, else `compute`.
  bool auto_dtype = true;
  DType compute = DType::kF32;
  bool keep_plain = false;
  bool int8 = false;
};

// The inputs of one forward: token ids [L] and, when they hold image placeholders, the images'
// grids and the vision tower's outputs.
struct TextInputs {
  std::span<const int32_t> ids = {};
  std::span<const Grid> grids = {};
  const VisionOutputs* vision = nullptr;
  // transformers' attention_mask [L] (1: token, 0: padding; empty: all tokens), text-only
  // prompts only. As transformers 5.24 runs a text-only prompt: positions stay 0..L-1 whatever
  // the mask (no get_rope_index without images), padding is masked as a key (causal and
  // padding), and a query with no key left (left padding's pad rows) gets a zero attention
  // output, as torch's SDPA gives it.
  std::span<const uint8_t> attention_mask = {};
};

// Intermediates a forward can hand back for tests and tracing (each f32 [L, hidden]).
struct TextTrace {
  Tensor inputs_embeds;  // embeddings with the image rows replaced
  // Output of each decoder layer, before its deepstack add (transformers' hidden_states[k+1]).
  std::vector<Tensor> layers;
};

// transformers' Qwen3VLModel.get_rope_index for one unpadded prompt: [3, L] positions (t, h, w
// rows). Text runs number on from the previous run's end on all three axes; a run of image
// tokens (ids == image_token_id) takes the next grid: t = start + frame, h = start + row,
// w = start + column on the merged (t, h / merge, w / merge) grid, and the text after it starts
// at start + max(h, w) / merge. Without image tokens: 0..L-1 on every axis. An Error when the
// image runs and the grids disagree (count, or tokens per run), or on a video token.
std::vector<int64_t> rope_positions(const Config& c, std::span<const int32_t> ids,
                                    std::span<const Grid> grids);

class TextModel {
 public:
  // A text_encoder/ folder (config.json of a Qwen3VLForConditionalGeneration with its
  // safetensors), or a pipeline folder holding text_encoder/. Only model.language_model.* is
  // read; the vision tower's and lm_head's tensors are left alone.
  static TextModel load(const std::string& path, const LoadOptions& opts = {});
  static TextModel from_scan(const CheckpointScan& scan, const Config& cfg,
                             const LoadOptions& opts);

  const Config& config() const;
  DType compute_dtype() const;
  int64_t weight_bytes() const;

  // The last decoder layer's output before the final norm, f32 [L, hidden]: what diffusers'
  // QwenImage21Pipeline reads as hidden_states[-1] (its forward hook takes the norm's input).
  // An attached ctx.tracer receives "inputs_embeds", "layers.<k>" (layer k's output) and
  // "layers.<k>.deepstack" (after deepstack feature k is added), each [L, hidden].
  Tensor forward(const ExecContext& ctx, const TextInputs& in, TextTrace* trace = nullptr) const;

  // transformers' output_hidden_states=True hidden_states[index], f32 [L, hidden]: N + 1 states
  // for N layers, index 0 the embeddings, k in [1, N) decoder layer k-1's output (before its
  // deepstack add), N the final norm's output (transformers 5.24 replaces the last layer's output
  // with last_hidden_state); a negative index counts from the end as Python's (-1: N). Only the
  // layers up to the index run. An Error outside [-(N+1), N].
  Tensor hidden_state(const ExecContext& ctx, const TextInputs& in, int64_t index) const;

  struct Weights;

 private:
  // The first `layers` decoder layers, then the final norm when `final_norm`.
  Tensor run(const ExecContext& ctx, const TextInputs& in, int64_t layers, bool final_norm,
             TextTrace* trace) const;
  std::shared_ptr<const Weights> w_;
};

}  // namespace flowkv::qwen3_vl
