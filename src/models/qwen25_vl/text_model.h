// The Qwen2.5-VL language model (transformers 5.24 Qwen2_5_VLModel's language side, as
// Qwen2_5_VLForConditionalGeneration runs it for Qwen-Image's prompt encoder): token embeddings
// with the vision tower's outputs scattered into the <|image_pad|> rows, Qwen2 decoder layers
// (models/qwen3/decoder.h in its Qwen2 form) with multimodal RoPE on 3-D positions (three
// consecutive frequency chunks, not interleaved), and the final RMSNorm. One prompt, no padding.
//
// The vision tower (pixels -> embeds) is not here: its output comes in as VisionEmbeds, in the
// order of the image placeholders in the ids.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/exec_context.h"
#include "flowkv/tensor.h"
#include "io/checkpoint.h"
#include "models/qwen25_vl/config.h"
#include "models/qwen25_vl/weights.h"

namespace flowkv::qwen25_vl {

// The vision tower's output for all the images of one prompt: [n_image_tokens, hidden]
// (the merger's output, the images concatenated in order).
struct VisionEmbeds {
  Tensor embeds;
};

struct LoadOptions {
  // As qwen3_vl::LoadOptions: BF16 compute when every weight read is BF16, else `compute`.
  bool auto_dtype = true;
  DType compute = DType::kF32;
  bool keep_plain = false;
  bool int8 = false;
};

// The positions the rotary embedding turns with.
enum class Positions {
  // get_rope_index (rope_positions below): 3-D positions for the image tokens. What
  // transformers 4.x computed from input_ids and image_grid_thw, and 5.24 computes when the
  // caller passes mm_token_type_ids.
  kMrope,
  // 0..L-1 on every axis: what transformers 5.24 uses when it is given no mm_token_type_ids
  // (diffusers 0.42.1's Qwen-Image pipelines pass none) or no image grids.
  kSequential,
};

// The inputs of one forward: token ids [L] and, when they hold image placeholders, the images'
// grids (for kMrope positions) and the vision tower's output.
struct TextInputs {
  std::span<const int32_t> ids = {};
  std::span<const Grid> grids = {};
  // nullptr: the <|image_pad|> rows keep their token embedding (as transformers without
  // pixel_values: a text-to-image prompt that spells "<|image_pad|>").
  const VisionEmbeds* vision = nullptr;
  Positions positions = Positions::kMrope;
};

// Intermediates a forward can hand back for tests and tracing (each f32 [L, hidden]).
struct TextTrace {
  Tensor inputs_embeds;        // embeddings with the image rows replaced
  std::vector<Tensor> layers;  // output of each decoder layer (before the final norm)
};

// transformers' Qwen2_5_VLModel.get_rope_index for one unpadded prompt, the image tokens
// (ids == image_token_id) being the multimodal ones: [3, L] positions (t, h, w rows). Text runs
// number on from the previous run's end on all three axes; a run of image tokens takes the next
// grid: t = start + frame (images: no temporal scaling), h = start + row, w = start + column on
// the merged (t, h / merge, w / merge) grid, and the text after it starts at
// start + max(h, w) / merge. Without image tokens: 0..L-1 on every axis. An Error when the image
// runs and the grids disagree (count, or tokens per run), or on a video token.
std::vector<int64_t> rope_positions(const Config& c, std::span<const int32_t> ids,
                                    std::span<const Grid> grids);

class TextModel {
 public:
  // A text_encoder/ folder (config.json of a Qwen2_5_VLForConditionalGeneration with its
  // safetensors, either tensor layout), or a pipeline folder holding text_encoder/, or a GGUF
  // (flowkv quantize's, or llama.cpp's "qwen2vl"; given itself or in such a folder: source.h).
  // Only the language model's tensors are read; the vision tower's and lm_head are left alone.
  static TextModel load(const std::string& text_encoder_dir, const LoadOptions& opts = {});
  static TextModel from_scan(const CheckpointScan& scan, const Config& cfg,
                             const LoadOptions& opts);

  const Config& config() const;
  DType compute_dtype() const;
  Layout layout() const;
  int64_t weight_bytes() const;

  // The final norm's output, f32 [L, hidden]: transformers' last_hidden_state, which is also
  // what hidden_states[-1] holds in 5.24 (and in 4.x). An attached ctx.tracer receives
  // "inputs_embeds", "layers.<k>" (layer k's output) and "norm", each [L, hidden].
  Tensor forward(const ExecContext& ctx, const TextInputs& in, TextTrace* trace = nullptr) const;

  struct Weights;

 private:
  std::shared_ptr<const Weights> w_;
};

}  // namespace flowkv::qwen25_vl
