// Pieces the Qwen-VL vision towers share (Qwen3-VL's in models/qwen3_vl, Qwen2.5-VL's in
// models/qwen25_vl): the patch order of Qwen2VLImageProcessor (merge blocks), the 2-D axial
// rotary embedding over it, attention within segments of rows (cu_seqlens), the input checks of
// a (pixel_values, grid_thw) pair, and the tracer hook. Activations are [N, C] matrices.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "core/exec_context.h"
#include "core/mat.h"
#include "core/parallel.h"
#include "flowkv/error.h"
#include "flowkv/tensor.h"
#include "io/checkpoint.h"
#include "ops/linear.h"

namespace flowkv::vit {

struct VisionLoadOptions {
  // Compute type of the linear layers: `auto_dtype` picks BF16 when every linear weight is BF16
  // (activations rounded to bf16 before each GEMM, f32 accumulation), else `compute`. Norms,
  // biases, embeddings, RoPE and attention run in f32 either way.
  bool auto_dtype = true;
  DType compute = DType::kF32;
  bool keep_plain = false;  // keep unpacked weights so the scalar reference path can run
};

// The compute type `opts` asks for given the stored types of the table's tensors that
// `is_linear` picks (every tensor of the table must be in `tensors`).
template <class IsLinear>
DType choose_compute(const std::map<std::string, TensorInfo>& tensors,
                     const std::vector<ExpectedTensor>& table, const VisionLoadOptions& opts,
                     IsLinear&& is_linear) {
  if (!opts.auto_dtype) return opts.compute;
  for (const ExpectedTensor& e : table) {
    if (!is_linear(e)) continue;
    const TensorInfo& t = tensors.at(e.name);
    if (!t.dtype_known || t.dtype != DType::kBF16) return DType::kF32;
  }
  return DType::kBF16;
}

// A tower's tensors (`tensors`, found under `prefix` in the file at `path`) checked against its
// table, its compute type chosen, and the bytes its weights will hold (linear weights as
// `is_linear` picks them, packed; the rest f32) checked against the memory budget: the compute
// type, or an Error naming `what` and every problem, before anything is read.
template <class IsLinear>
DType check_tower(const std::string& path, const std::string& prefix,
                  const std::map<std::string, TensorInfo>& tensors,
                  const std::vector<ExpectedTensor>& table, const VisionLoadOptions& opts,
                  IsLinear&& is_linear, const std::string& what) {
  const std::vector<std::string> problems = check_against_table(tensors, table);
  FLOWKV_CHECK(problems.empty(), format_problems(path + " does not hold a " + what +
                                                     " of its config under \"" + prefix + "\"",
                                                 problems));
  const DType compute = choose_compute(tensors, table, opts, is_linear);
  check_weights_fit(
      table,
      [&](const ExpectedTensor& e) {
        const TensorInfo& t = tensors.at(e.name);
        if (!is_linear(e)) return int64_t{4} * shape_numel(e.shape);
        return ops::held_weight_bytes(t.dtype, {e.shape[0], shape_numel(e.shape) / e.shape[0]},
                                      compute);
      },
      what);
  return compute;
}

// One image's (or video's) grid in patches: {frames t, rows h, columns w}.
using Grid = std::array<int64_t, 3>;

// Row and column of token k of a frame w patches wide, in merge-block order (every m*m
// consecutive tokens are one merged token, blocks row-major): the inverse of the processor's
// patch order, as transformers' get_vision_position_ids decodes it.
struct PatchPos {
  int64_t row, col;
};
PatchPos merge_block_pos(int64_t k, int64_t w, int64_t m);

// The axial RoPE's inverse frequencies, head_dim / 4 of them, in f32 as transformers computes
// them: 1 / theta^(arange(0, hd/2, 2) / (hd/2)).
std::vector<float> axial_inv_freq(int64_t head_dim, double theta);

// One token's cos and sin rows (head_dim = 4 * inv_freq.size() values each): [h freqs, w freqs]
// twice, the two halves rotate_half pairs.
void axial_rope_row(const std::vector<float>& inv_freq, PatchPos p, float* cos, float* sin);

// fn(r) for every row, in tasks of rows fixed by the shape (results never depend on threads).
template <class Fn>
void for_rows(int64_t rows, Fn&& fn) {
  constexpr int64_t kRowsPerTask = 64;
  parallel_for((rows + kRowsPerTask - 1) / kRowsPerTask, [&](int64_t t) {
    for (int64_t r = t * kRowsPerTask; r < std::min(rows, (t + 1) * kRowsPerTask); ++r) fn(r);
  });
}

// apply_rotary_pos_emb_vision on x [N, heads * hd]: x*cos + rotate_half(x)*sin per head, with
// row i of the [N, hd] tables.
void apply_rope(Mat x, int64_t heads, int64_t hd, const float* cos, const float* sin);

// Bidirectional attention within each segment [seg[s], seg[s+1]) of the rows of qkv
// [N, 3 * heads * hd] (q | k | v), into out [N, heads * hd]: transformers' per-chunk attention
// over cu_seqlens. Empty segments are skipped.
void segment_attention(const ExecContext& ctx, Mat qkv, Mat out, int64_t heads, int64_t hd,
                       std::span<const int64_t> seg);

// Checks pixel_values [N, patch_dim] f32 against the grids (each positive, h and w multiples of
// merge) and returns N. `what` prefixes the messages ("qwen3-vl vision").
int64_t check_pixels_and_grids(const std::string& what, const Tensor& pixel_values,
                               int64_t patch_dim, const std::string& patch_desc,
                               std::span<const Grid> grids, int64_t merge);

// The patch embedding into x [N, hidden]: the Conv3d with stride = kernel is a linear map of
// each flattened patch (`proj` holds it as [hidden, C*T*P*P], with or without a bias). A bf16
// tower rounds pixel_values to bf16 first (get_image_features casts them to the tower's dtype)
// and its output after.
void embed_patches(const ExecContext& ctx, const ops::Linear& proj, const Tensor& pixel_values,
                   bool bf16, Mat x);

// Records m under `name` if the context's tracer wants it.
void trace(const ExecContext& ctx, const std::string& name, Mat m);

// Only the tensors under `prefix` (a text_encoder/ checkpoint also holds the language model).
std::map<std::string, TensorInfo> under_prefix(const std::map<std::string, TensorInfo>& t,
                                               const std::string& prefix);

// transformers' get_rope_index for images, as Qwen2.5-VL and Qwen3-VL compute it for one
// unpadded prompt: [3, L] positions (t, h, w rows). Text runs number on from the previous run's
// end on all three axes; a run of image_token_id takes the next grid: t = start + frame,
// h = start + row, w = start + column on the merged (t, h / merge, w / merge) grid, and the text
// after it starts at start + max(h, w) / merge. An Error (prefixed with `what`) when the image
// runs and the grids disagree (count, or tokens per run), or on a video token.
std::vector<int64_t> mrope_positions(std::span<const int32_t> ids, std::span<const Grid> grids,
                                     int64_t image_token_id, int64_t video_token_id, int64_t merge,
                                     const std::string& what);

}  // namespace flowkv::vit
