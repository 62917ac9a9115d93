// The Qwen-Image-2.1 joint sequence: the vision-language text with condition-image latents
// spliced in at their slots (each slot = 2x2 latent tokens), then the target image. Derived once
// per request from the slot mask and the image grids (diffusers' build_token_metadata and the
// RoPE walk of QwenImage21Rope).
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "segments/layout.h"
#include "segments/segment_input.h"

namespace flowkv::qwen {

using Grid = ImageGrid;

struct Layout21 {
  int64_t P = 0;  // prefix tokens: text and condition images (everything before the target)
  int64_t T = 0;  // target tokens, last
  // Per prefix position: the text row it takes (-1 for image tokens), the image block it
  // belongs to (-1 for text) and its token index in the concatenated condition latents.
  std::vector<int64_t> text_row;
  std::vector<int> block;
  std::vector<int64_t> image_token;
  // Maximal runs of equal block id over the prefix: text runs see the keys before them and
  // themselves causally; image blocks see the keys before them and their whole block.
  struct Run {
    int64_t start, end;
    bool text;
  };
  std::vector<Run> runs;
  // RoPE positions (frame, height, width) of every position, prefix then target.
  std::vector<std::array<int64_t, 3>> pos;
};

// L: text rows of the vision-language sequence; slots[r] != 0 where row r is an image slot of a
// condition image. conds: condition grids in order; target last.
Layout21 build_layout21(int64_t L, const uint8_t* slots, const std::vector<Grid>& conds,
                        Grid target);

// Complex RoPE tables as cos/sin, duplicated per pair ([c0, c0, c1, c1, ...]) to the head dim:
// angle = pos_axis * (1 / 10000^(2j/d_axis)), all in float32 as diffusers' QwenImage21Rope.
void rope_tables21(const std::vector<std::array<int64_t, 3>>& pos, int64_t first, int64_t count,
                   const std::vector<int64_t>& axes, float* cos, float* sin);

// The cache rules of this layout: text runs and condition images are constant inputs, read
// only what precedes them, and are modulated from t = 0 when causal_condition is on.
TokenLayout token_layout21(const Layout21& l, bool causal_condition);

}  // namespace flowkv::qwen
