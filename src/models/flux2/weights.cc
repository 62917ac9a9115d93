#include "models/flux2/weights.h"

#include <cstring>
#include <regex>

#include "flowkv/error.h"

namespace flowkv::flux2 {

namespace {

constexpr const char* kGlobalNames[] = {
    "x_embedder.weight",
    "context_embedder.weight",
    "time_guidance_embed.timestep_embedder.linear_1.weight",
    "time_guidance_embed.timestep_embedder.linear_2.weight",
    "time_guidance_embed.guidance_embedder.linear_1.weight",
    "time_guidance_embed.guidance_embedder.linear_2.weight",
    "double_stream_modulation_img.linear.weight",
    "double_stream_modulation_txt.linear.weight",
    "single_stream_modulation.linear.weight",
    "norm_out.linear.weight",
    "proj_out.weight",
};
constexpr const char* kDoubleNames[] = {
    "attn.to_q.weight",
    "attn.to_k.weight",
    "attn.to_v.weight",
    "attn.norm_q.weight",
    "attn.norm_k.weight",
    "attn.to_out.0.weight",
    "attn.add_q_proj.weight",
    "attn.add_k_proj.weight",
    "attn.add_v_proj.weight",
    "attn.norm_added_q.weight",
    "attn.norm_added_k.weight",
    "attn.to_add_out.weight",
    "ff.linear_in.weight",
    "ff.linear_out.weight",
    "ff_context.linear_in.weight",
    "ff_context.linear_out.weight",
};
constexpr const char* kSingleNames[] = {
    "attn.to_qkv_mlp_proj.weight",
    "attn.norm_q.weight",
    "attn.norm_k.weight",
    "attn.to_out.weight",
};
static_assert(std::size(kGlobalNames) == static_cast<size_t>(GlobalW::kCount));
static_assert(std::size(kDoubleNames) == static_cast<size_t>(DoubleW::kCount));
static_assert(std::size(kSingleNames) == static_cast<size_t>(SingleW::kCount));

Shape global_shape(const Config& c, GlobalW w) {
  const int64_t d = c.dim(), t = c.timestep_guidance_channels;
  switch (w) {
    case GlobalW::kXEmbedder:
      return {d, c.in_channels};
    case GlobalW::kContextEmbedder:
      return {d, c.joint_attention_dim};
    case GlobalW::kTimeLinear1:
    case GlobalW::kGuidanceLinear1:
      return {d, t};
    case GlobalW::kTimeLinear2:
    case GlobalW::kGuidanceLinear2:
      return {d, d};
    case GlobalW::kModImg:
    case GlobalW::kModTxt:
      return {6 * d, d};
    case GlobalW::kModSingle:
      return {3 * d, d};
    case GlobalW::kNormOut:
      return {2 * d, d};
    case GlobalW::kProjOut:
      return {c.out_features(), d};
    case GlobalW::kCount:
      break;
  }
  return {};
}

Shape double_shape(const Config& c, DoubleW w) {
  const int64_t d = c.dim(), f = c.mlp_hidden(), hd = c.attention_head_dim;
  switch (w) {
    case DoubleW::kNormQ:
    case DoubleW::kNormK:
    case DoubleW::kNormAddedQ:
    case DoubleW::kNormAddedK:
      return {hd};
    case DoubleW::kFfIn:
    case DoubleW::kFfContextIn:
      return {2 * f, d};
    case DoubleW::kFfOut:
    case DoubleW::kFfContextOut:
      return {d, f};
    default:
      return {d, d};
  }
}

Shape single_shape(const Config& c, SingleW w) {
  const int64_t d = c.dim(), f = c.mlp_hidden(), hd = c.attention_head_dim;
  switch (w) {
    case SingleW::kQkvMlp:
      return {3 * d + 2 * f, d};
    case SingleW::kNormQ:
    case SingleW::kNormK:
      return {hd};
    case SingleW::kToOut:
      return {d, d + f};
    case SingleW::kCount:
      break;
  }
  return {};
}

// The original BFL single-file layout (CV:228-373 in the spec): one row per key, with the
// diffusers key it becomes. "{}" is the block index. A fused qkv key appears three times
// (part 0, 1, 2 = rows [0,D), [D,2D), [2D,3D)); norm_out's halves are swapped (BFL stores
// shift then scale, diffusers scale then shift).
struct BflRule {
  const char* original;
  const char* diffusers;
  int part;
  bool swap_halves;
};
constexpr BflRule kBflRules[] = {
    {"img_in.weight", "x_embedder.weight", -1, false},
    {"txt_in.weight", "context_embedder.weight", -1, false},
    {"time_in.in_layer.weight", "time_guidance_embed.timestep_embedder.linear_1.weight", -1, false},
    {"time_in.out_layer.weight", "time_guidance_embed.timestep_embedder.linear_2.weight", -1,
     false},
    {"guidance_in.in_layer.weight", "time_guidance_embed.guidance_embedder.linear_1.weight", -1,
     false},
    {"guidance_in.out_layer.weight", "time_guidance_embed.guidance_embedder.linear_2.weight", -1,
     false},
    {"double_stream_modulation_img.lin.weight", "double_stream_modulation_img.linear.weight", -1,
     false},
    {"double_stream_modulation_txt.lin.weight", "double_stream_modulation_txt.linear.weight", -1,
     false},
    {"single_stream_modulation.lin.weight", "single_stream_modulation.linear.weight", -1, false},
    {"final_layer.linear.weight", "proj_out.weight", -1, false},
    {"final_layer.adaLN_modulation.1.weight", "norm_out.linear.weight", -1, true},
    {"double_blocks.{}.img_attn.qkv.weight", "transformer_blocks.{}.attn.to_q.weight", 0, false},
    {"double_blocks.{}.img_attn.qkv.weight", "transformer_blocks.{}.attn.to_k.weight", 1, false},
    {"double_blocks.{}.img_attn.qkv.weight", "transformer_blocks.{}.attn.to_v.weight", 2, false},
    {"double_blocks.{}.txt_attn.qkv.weight", "transformer_blocks.{}.attn.add_q_proj.weight", 0,
     false},
    {"double_blocks.{}.txt_attn.qkv.weight", "transformer_blocks.{}.attn.add_k_proj.weight", 1,
     false},
    {"double_blocks.{}.txt_attn.qkv.weight", "transformer_blocks.{}.attn.add_v_proj.weight", 2,
     false},
    {"double_blocks.{}.img_attn.norm.query_norm.scale", "transformer_blocks.{}.attn.norm_q.weight",
     -1, false},
    {"double_blocks.{}.img_attn.norm.key_norm.scale", "transformer_blocks.{}.attn.norm_k.weight",
     -1, false},
    {"double_blocks.{}.txt_attn.norm.query_norm.scale",
     "transformer_blocks.{}.attn.norm_added_q.weight", -1, false},
    {"double_blocks.{}.txt_attn.norm.key_norm.scale",
     "transformer_blocks.{}.attn.norm_added_k.weight", -1, false},
    {"double_blocks.{}.img_attn.proj.weight", "transformer_blocks.{}.attn.to_out.0.weight", -1,
     false},
    {"double_blocks.{}.txt_attn.proj.weight", "transformer_blocks.{}.attn.to_add_out.weight", -1,
     false},
    {"double_blocks.{}.img_mlp.0.weight", "transformer_blocks.{}.ff.linear_in.weight", -1, false},
    {"double_blocks.{}.img_mlp.2.weight", "transformer_blocks.{}.ff.linear_out.weight", -1, false},
    {"double_blocks.{}.txt_mlp.0.weight", "transformer_blocks.{}.ff_context.linear_in.weight", -1,
     false},
    {"double_blocks.{}.txt_mlp.2.weight", "transformer_blocks.{}.ff_context.linear_out.weight", -1,
     false},
    {"single_blocks.{}.linear1.weight", "single_transformer_blocks.{}.attn.to_qkv_mlp_proj.weight",
     -1, false},
    {"single_blocks.{}.linear2.weight", "single_transformer_blocks.{}.attn.to_out.weight", -1,
     false},
    {"single_blocks.{}.norm.query_norm.scale", "single_transformer_blocks.{}.attn.norm_q.weight",
     -1, false},
    {"single_blocks.{}.norm.key_norm.scale", "single_transformer_blocks.{}.attn.norm_k.weight", -1,
     false},
};

// Matches `key` against a rule's original pattern; on success returns the block index
// ("" when the rule has none).
bool match_rule(const std::string& key, const std::string& pattern, std::string* index) {
  const size_t brace = pattern.find("{}");
  if (brace == std::string::npos) {
    index->clear();
    return key == pattern;
  }
  const std::string head = pattern.substr(0, brace), tail = pattern.substr(brace + 2);
  if (key.size() <= head.size() + tail.size() || key.compare(0, head.size(), head) != 0 ||
      key.compare(key.size() - tail.size(), tail.size(), tail) != 0) {
    return false;
  }
  *index = key.substr(head.size(), key.size() - head.size() - tail.size());
  return !index->empty() && index->find_first_not_of("0123456789") == std::string::npos;
}

std::string fill(const std::string& pattern, const std::string& index) {
  const size_t brace = pattern.find("{}");
  return brace == std::string::npos ? pattern
                                    : pattern.substr(0, brace) + index + pattern.substr(brace + 2);
}

// Original checkpoints sometimes carry a wrapper prefix.
std::string strip_prefix(const std::string& key) {
  for (const char* p : {"model.diffusion_model.", "diffusion_model.", "model."}) {
    if (key.rfind(p, 0) == 0) return key.substr(std::strlen(p));
  }
  return key;
}

}  // namespace

std::string weight_name(GlobalW w) {
  return kGlobalNames[static_cast<int>(w)];
}
std::string weight_name(int64_t block, DoubleW w) {
  return "transformer_blocks." + std::to_string(block) + "." + kDoubleNames[static_cast<int>(w)];
}
std::string weight_name(int64_t block, SingleW w) {
  return "single_transformer_blocks." + std::to_string(block) + "." +
         kSingleNames[static_cast<int>(w)];
}

std::vector<ExpectedTensor> weight_table(const Config& c) {
  std::vector<ExpectedTensor> t;
  for (int i = 0; i < static_cast<int>(GlobalW::kCount); ++i) {
    const auto w = static_cast<GlobalW>(i);
    if (!c.guidance_embeds && (w == GlobalW::kGuidanceLinear1 || w == GlobalW::kGuidanceLinear2)) {
      continue;
    }
    t.push_back({weight_name(w), global_shape(c, w)});
  }
  for (int64_t b = 0; b < c.num_layers; ++b) {
    for (int i = 0; i < static_cast<int>(DoubleW::kCount); ++i) {
      t.push_back(
          {weight_name(b, static_cast<DoubleW>(i)), double_shape(c, static_cast<DoubleW>(i))});
    }
  }
  for (int64_t b = 0; b < c.num_single_layers; ++b) {
    for (int i = 0; i < static_cast<int>(SingleW::kCount); ++i) {
      t.push_back(
          {weight_name(b, static_cast<SingleW>(i)), single_shape(c, static_cast<SingleW>(i))});
    }
  }
  return t;
}

int64_t parameter_count(const Config& c) {
  int64_t n = 0;
  for (const ExpectedTensor& e : weight_table(c)) n += shape_numel(e.shape);
  return n;
}

WeightSource::WeightSource(CheckpointScan scan) : scan_(std::move(scan)) {
  // The BFL layout is recognised by its keys; diffusers files never hold img_in / double_blocks.
  bool any_diffusers = false, any_bfl = false;
  for (const auto& [key, info] : scan_.tensors) {
    const std::string k = strip_prefix(key);
    if (k.rfind("img_in.", 0) == 0 || k.rfind("double_blocks.", 0) == 0 ||
        k.rfind("single_blocks.", 0) == 0) {
      any_bfl = true;
    }
    if (k.rfind("x_embedder.", 0) == 0 || k.rfind("transformer_blocks.", 0) == 0) {
      any_diffusers = true;
    }
  }
  bfl_ = any_bfl && !any_diffusers;
  if (!bfl_) {
    tensors_ = scan_.tensors;
    for (const auto& [name, info] : tensors_) origin_[name] = {name};
    return;
  }
  for (const auto& [key, info] : scan_.tensors) {
    const std::string k = strip_prefix(key);
    bool mapped = false;
    for (const BflRule& r : kBflRules) {
      std::string index;
      if (!match_rule(k, r.original, &index)) continue;
      mapped = true;
      TensorInfo t = info;
      t.name = fill(r.diffusers, index);
      if (r.part >= 0) {
        FLOWKV_CHECK(!t.shape.empty() && t.shape[0] % 3 == 0, key, ": fused qkv of shape ",
                     shape_str(t.shape), " cannot be split in three");
        t.shape[0] /= 3;
      }
      origin_[t.name] = {key, r.part, r.swap_halves};
      tensors_[t.name] = t;
    }
    if (!mapped) unmapped_.push_back(key);
  }
}

WeightSource::WeightSource(std::map<std::string, Tensor> tensors) : memory_(std::move(tensors)) {
  scan_.path = "(in memory)";
  for (const auto& [name, t] : memory_) {
    TensorInfo info;
    info.name = name;
    info.dtype = t.dtype();
    info.dtype_name = std::string(dtype_name(t.dtype()));
    info.dtype_known = true;
    info.shape = t.shape();
    tensors_[name] = info;
  }
}

Tensor WeightSource::get(const std::string& name) const {
  if (!memory_.empty()) {
    auto m = memory_.find(name);
    FLOWKV_CHECK(m != memory_.end(), "no tensor '", name, "'");
    return m->second;
  }
  auto it = origin_.find(name);
  FLOWKV_CHECK(it != origin_.end(), scan_.path, ": no tensor '", name, "'");
  if (!reader_) reader_ = std::make_unique<CheckpointReader>(scan_);
  const Origin& o = it->second;
  Tensor t = reader_->get(o.name);
  if (o.part < 0 && !o.swap_halves) return t;
  // BFL conversions copy: a third of the fused rows, or the two halves exchanged.
  const int64_t rows = t.dim(0), row_bytes = t.nbytes() / rows;
  const auto* src = static_cast<const std::byte*>(t.raw());
  if (o.part >= 0) {
    Tensor out = Tensor::empty({rows / 3, t.dim(1)}, t.dtype());
    std::memcpy(out.raw(), src + o.part * (rows / 3) * row_bytes,
                static_cast<size_t>(out.nbytes()));
    return out;
  }
  Tensor out = Tensor::empty(t.shape(), t.dtype());
  const size_t half = static_cast<size_t>(t.nbytes() / 2);
  std::memcpy(out.raw(), src + half, half);
  std::memcpy(static_cast<std::byte*>(out.raw()) + half, src, half);
  return out;
}

}  // namespace flowkv::flux2
