#include "models/qwen_image/layout21.h"

#include <cmath>
#include <numeric>

#include "flowkv/error.h"

namespace flowkv::qwen {

Layout21 build_layout21(int64_t L, const uint8_t* slots, const std::vector<Grid>& conds,
                        Grid target) {
  Layout21 l;
  FLOWKV_CHECK(target.h > 0 && target.w > 0, "the target grid must be positive");
  FLOWKV_CHECK(target.tokens() % 4 == 0, "the target has ", target.tokens(),
               " latent tokens; Qwen-Image-2.1 needs a multiple of 4 (2x2 per slot)");
  int64_t slot_count = 0;
  for (int64_t r = 0; r < L; ++r) slot_count += slots && slots[r] ? 1 : 0;
  int64_t cond_tokens = 0;
  for (const Grid& g : conds) cond_tokens += g.tokens();
  FLOWKV_CHECK(4 * slot_count == cond_tokens, "the prompt has ", slot_count, " image slots (",
               4 * slot_count, " latent tokens) but the condition images have ", cond_tokens,
               " tokens; each slot stands for 2x2 latent tokens");
  // Expand: a text row is one position, a slot four.
  int64_t next_image = 0;
  for (int64_t r = 0; r < L; ++r) {
    const int n = slots && slots[r] ? 4 : 1;
    for (int k = 0; k < n; ++k) {
      l.text_row.push_back(n == 1 ? r : -1);
      l.image_token.push_back(n == 1 ? -1 : next_image++);
    }
  }
  l.P = static_cast<int64_t>(l.text_row.size());
  l.T = target.tokens();
  // Image block ids by token counts, in order.
  l.block.assign(static_cast<size_t>(l.P), -1);
  {
    int64_t id = 0, left = conds.empty() ? 0 : conds[0].tokens();
    for (int64_t p = 0; p < l.P; ++p) {
      if (l.image_token[p] < 0) continue;
      while (left == 0) left = conds[static_cast<size_t>(++id)].tokens();
      l.block[p] = static_cast<int>(id);
      --left;
    }
  }
  // Runs of equal block id; an image block must be contiguous (diffusers' RoPE assumes it).
  for (int64_t p = 0; p < l.P;) {
    int64_t e = p + 1;
    while (e < l.P && l.block[e] == l.block[p]) ++e;
    l.runs.push_back({p, e, l.block[p] < 0});
    p = e;
  }
  std::vector<int> seen(conds.size(), 0);
  for (const auto& run : l.runs) {
    if (run.text) continue;
    const size_t b = static_cast<size_t>(l.block[run.start]);
    FLOWKV_CHECK(!seen[b]++ && run.end - run.start == conds[b].tokens(), "condition image ", b + 1,
                 "'s slots are not one contiguous run in the prompt");
  }
  // RoPE walk: text advances one position on all axes; an image block freezes the frame at the
  // current position, centres its grid, then advances the position by max(h, w).
  l.pos.resize(static_cast<size_t>(l.P + l.T));
  int64_t position = 0, cursor = 0;
  auto image_block = [&](int64_t start, Grid g) {
    for (int64_t y = 0; y < g.h; ++y) {
      for (int64_t x = 0; x < g.w; ++x) {
        l.pos[static_cast<size_t>(start + y * g.w + x)] = {position, y - (g.h - g.h / 2),
                                                           x - (g.w - g.w / 2)};
      }
    }
    position += std::max(g.h, g.w);
  };
  for (const auto& run : l.runs) {
    if (run.text) {
      for (int64_t p = run.start; p < run.end; ++p, ++position)
        l.pos[p] = {position, position, position};
    } else {
      image_block(run.start, conds[static_cast<size_t>(l.block[run.start])]);
    }
    cursor = run.end;
  }
  image_block(l.P, target);
  (void)cursor;
  return l;
}

void rope_tables21(const std::vector<std::array<int64_t, 3>>& pos, int64_t first, int64_t count,
                   const std::vector<int64_t>& axes, float* cos, float* sin) {
  const int64_t hd = std::accumulate(axes.begin(), axes.end(), int64_t{0});
  std::vector<std::vector<float>> inv(axes.size());
  for (size_t a = 0; a < axes.size(); ++a) {
    for (int64_t j = 0; j < axes[a]; j += 2) {
      // 1 / torch.pow(10000, arange(0, d, 2).float() / d), in float32.
      const float e = static_cast<float>(j) / static_cast<float>(axes[a]);
      inv[a].push_back(1.0f / std::pow(10000.0f, e));
    }
  }
  for (int64_t s = 0; s < count; ++s) {
    const auto& p = pos[static_cast<size_t>(first + s)];
    int64_t col = 0;
    for (size_t a = 0; a < axes.size(); ++a) {
      for (float f : inv[a]) {
        const float angle = static_cast<float>(p[a]) * f;
        const float c = std::cos(angle), sn = std::sin(angle);
        cos[s * hd + col] = cos[s * hd + col + 1] = c;
        sin[s * hd + col] = sin[s * hd + col + 1] = sn;
        col += 2;
      }
    }
  }
}

TokenLayout token_layout21(const Layout21& l, bool causal) {
  TokenLayout t;
  std::vector<int> before;
  for (const auto& run : l.runs) {
    Segment s;
    s.name = run.text ? "text" : "condition " + std::to_string(l.block[run.start] + 1);
    s.kind = run.text ? SegmentKind::kText : SegmentKind::kReference;
    s.tokens = run.end - run.start;
    s.constant_input = true;
    s.fixed_time = causal;
    s.reads = before;
    s.reads.push_back(static_cast<int>(t.segments.size()));
    s.causal = run.text;
    before.push_back(static_cast<int>(t.segments.size()));
    t.segments.push_back(s);
  }
  Segment target{"target", SegmentKind::kTarget, l.T, false, false, 0, before};
  target.reads.push_back(static_cast<int>(t.segments.size()));
  t.segments.push_back(target);
  return t;
}

}  // namespace flowkv::qwen
