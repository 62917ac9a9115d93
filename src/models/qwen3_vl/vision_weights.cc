#include "models/qwen3_vl/vision_weights.h"

#include <iterator>

namespace flowkv::qwen3_vl {

namespace {

constexpr const char* kGlobalNames[] = {
    "patch_embed.proj.weight",
    "patch_embed.proj.bias",
    "pos_embed.weight",
};
constexpr const char* kBlockNames[] = {
    "norm1.weight",          "norm1.bias",          "attn.qkv.weight",       "attn.qkv.bias",
    "attn.proj.weight",      "attn.proj.bias",      "norm2.weight",          "norm2.bias",
    "mlp.linear_fc1.weight", "mlp.linear_fc1.bias", "mlp.linear_fc2.weight", "mlp.linear_fc2.bias",
};
constexpr const char* kMergerNames[] = {
    "norm.weight",     "norm.bias",         "linear_fc1.weight",
    "linear_fc1.bias", "linear_fc2.weight", "linear_fc2.bias",
};
static_assert(std::size(kGlobalNames) == static_cast<size_t>(GlobalW::kCount));
static_assert(std::size(kBlockNames) == static_cast<size_t>(BlockW::kCount));
static_assert(std::size(kMergerNames) == static_cast<size_t>(MergerW::kCount));

}  // namespace

std::string weight_name(const std::string& prefix, GlobalW w) {
  return prefix + kGlobalNames[static_cast<int>(w)];
}
std::string weight_name(const std::string& prefix, int64_t block, BlockW w) {
  return prefix + "blocks." + std::to_string(block) + "." + kBlockNames[static_cast<int>(w)];
}
std::string weight_name(const std::string& prefix, int64_t merger, MergerW w) {
  const std::string m =
      merger < 0 ? "merger." : "deepstack_merger_list." + std::to_string(merger) + ".";
  return prefix + m + kMergerNames[static_cast<int>(w)];
}

Shape weight_shape(const VisionConfig& c, GlobalW w) {
  switch (w) {
    case GlobalW::kPatchEmbedW:  // Conv3d [hidden, C, T, P, P]
      return {c.hidden_size, c.in_channels, c.temporal_patch_size, c.patch_size, c.patch_size};
    case GlobalW::kPatchEmbedB:
      return {c.hidden_size};
    case GlobalW::kPosEmbed:
      return {c.num_position_embeddings, c.hidden_size};
    case GlobalW::kCount:
      break;
  }
  return {};
}

Shape weight_shape(const VisionConfig& c, BlockW w) {
  const int64_t h = c.hidden_size, f = c.intermediate_size;
  switch (w) {
    case BlockW::kNorm1W:
    case BlockW::kNorm1B:
    case BlockW::kNorm2W:
    case BlockW::kNorm2B:
    case BlockW::kProjB:
    case BlockW::kFc2B:
      return {h};
    case BlockW::kQkvW:
      return {3 * h, h};
    case BlockW::kQkvB:
      return {3 * h};
    case BlockW::kProjW:
      return {h, h};
    case BlockW::kFc1W:
      return {f, h};
    case BlockW::kFc1B:
      return {f};
    case BlockW::kFc2W:
      return {h, f};
    case BlockW::kCount:
      break;
  }
  return {};
}

Shape weight_shape(const VisionConfig& c, bool postshuffle, MergerW w) {
  const int64_t m = c.merged_hidden();
  switch (w) {
    case MergerW::kNormW:
    case MergerW::kNormB:
      return {postshuffle ? m : c.hidden_size};
    case MergerW::kFc1W:
      return {m, m};
    case MergerW::kFc1B:
      return {m};
    case MergerW::kFc2W:
      return {c.out_hidden_size, m};
    case MergerW::kFc2B:
      return {c.out_hidden_size};
    case MergerW::kCount:
      break;
  }
  return {};
}

std::vector<ExpectedTensor> vision_weight_table(const VisionConfig& c, const std::string& prefix) {
  std::vector<ExpectedTensor> t;
  for (int i = 0; i < static_cast<int>(GlobalW::kCount); ++i) {
    const auto w = static_cast<GlobalW>(i);
    t.push_back({weight_name(prefix, w), weight_shape(c, w)});
  }
  for (int64_t b = 0; b < c.depth; ++b) {
    for (int i = 0; i < static_cast<int>(BlockW::kCount); ++i) {
      const auto w = static_cast<BlockW>(i);
      t.push_back({weight_name(prefix, b, w), weight_shape(c, w)});
    }
  }
  const auto n = static_cast<int64_t>(c.deepstack_visual_indexes.size());
  for (int64_t m = -1; m < n; ++m) {
    for (int i = 0; i < static_cast<int>(MergerW::kCount); ++i) {
      const auto w = static_cast<MergerW>(i);
      t.push_back({weight_name(prefix, m, w), weight_shape(c, m >= 0, w)});
    }
  }
  return t;
}

int64_t vision_parameter_count(const VisionConfig& c) {
  int64_t n = 0;
  for (const ExpectedTensor& e : vision_weight_table(c, "")) n += shape_numel(e.shape);
  return n;
}

}  // namespace flowkv::qwen3_vl
