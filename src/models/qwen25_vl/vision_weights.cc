#include "models/qwen25_vl/vision_weights.h"

#include <iterator>

#include "flowkv/error.h"

namespace flowkv::qwen25_vl {

namespace {

constexpr const char* kGlobalNames[] = {"patch_embed.proj.weight"};
constexpr const char* kBlockNames[] = {
    "norm1.weight",       "attn.qkv.weight",  "attn.qkv.bias",        "attn.proj.weight",
    "attn.proj.bias",     "norm2.weight",     "mlp.gate_proj.weight", "mlp.gate_proj.bias",
    "mlp.up_proj.weight", "mlp.up_proj.bias", "mlp.down_proj.weight", "mlp.down_proj.bias",
};
// The merger's MLP is an nn.Sequential(Linear, GELU, Linear): indices 0 and 2.
constexpr const char* kMergerNames[] = {
    "merger.ln_q.weight",  "merger.mlp.0.weight", "merger.mlp.0.bias",
    "merger.mlp.2.weight", "merger.mlp.2.bias",
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
std::string weight_name(const std::string& prefix, MergerW w) {
  return prefix + kMergerNames[static_cast<int>(w)];
}

Shape weight_shape(const VisionConfig& c, GlobalW w) {
  switch (w) {
    case GlobalW::kPatchEmbedW:  // Conv3d [hidden, C, T, P, P]
      return {c.hidden_size, c.in_channels, c.temporal_patch_size, c.patch_size, c.patch_size};
    case GlobalW::kCount:
      break;
  }
  return {};
}

Shape weight_shape(const VisionConfig& c, BlockW w) {
  const int64_t h = c.hidden_size, f = c.intermediate_size;
  switch (w) {
    case BlockW::kNorm1W:
    case BlockW::kNorm2W:
    case BlockW::kProjB:
    case BlockW::kDownB:
      return {h};
    case BlockW::kQkvW:
      return {3 * h, h};
    case BlockW::kQkvB:
      return {3 * h};
    case BlockW::kProjW:
      return {h, h};
    case BlockW::kGateW:
    case BlockW::kUpW:
      return {f, h};
    case BlockW::kGateB:
    case BlockW::kUpB:
      return {f};
    case BlockW::kDownW:
      return {h, f};
    case BlockW::kCount:
      break;
  }
  return {};
}

Shape weight_shape(const VisionConfig& c, MergerW w) {
  const int64_t m = c.merged_hidden();
  switch (w) {
    case MergerW::kLnQW:  // RMSNorm over the context width, before the m x m shuffle
      return {c.hidden_size};
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
  for (int i = 0; i < static_cast<int>(MergerW::kCount); ++i) {
    const auto w = static_cast<MergerW>(i);
    t.push_back({weight_name(prefix, w), weight_shape(c, w)});
  }
  return t;
}

std::string detect_vision_prefix(const CheckpointScan& scan) {
  for (const char* p : {kVisionPrefix, kVisionPrefixV4}) {
    if (scan.tensors.count(weight_name(p, GlobalW::kPatchEmbedW)) != 0) return p;
  }
  fail(scan.path, ": no Qwen2.5-VL vision tower: neither ",
       weight_name(kVisionPrefix, GlobalW::kPatchEmbedW), " (transformers 5.x) nor ",
       weight_name(kVisionPrefixV4, GlobalW::kPatchEmbedW), " (4.x) is in the checkpoint");
}

int64_t vision_parameter_count(const VisionConfig& c) {
  int64_t n = 0;
  for (const ExpectedTensor& e : vision_weight_table(c, "")) n += shape_numel(e.shape);
  return n;
}

}  // namespace flowkv::qwen25_vl
