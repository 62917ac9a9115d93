#include "models/flux2/config.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <regex>
#include <set>

#include "core/boundary.h"
#include "flowkv/error.h"
#include "flowkv/limits.h"
#include "io/checkpoint.h"

namespace flowkv::flux2 {

static Config from_json_unguarded(const Json& j, const std::string& src) {
  FLOWKV_CHECK(j.is_object(), src, ": config is not a JSON object");
  json_expect_class(j, "Flux2Transformer2DModel", src);
  Config c;
  // Sizes are read within flowkv's limits (flowkv/limits.h), so every product of them below
  // (widths, MLP sizes, weight bytes) fits 64-bit arithmetic.
  auto size = [&](const char* key, int64_t def, int64_t hi) {
    return json_int(j, key, def, 0, hi, src);
  };
  c.patch_size = size("patch_size", c.patch_size, limits::kMaxWidth);
  c.in_channels = size("in_channels", c.in_channels, limits::kMaxWidth);
  c.out_channels = size("out_channels", 0, limits::kMaxWidth);
  c.num_layers = size("num_layers", c.num_layers, limits::kMaxBlocks);
  c.num_single_layers = size("num_single_layers", c.num_single_layers, limits::kMaxBlocks);
  c.attention_head_dim = size("attention_head_dim", c.attention_head_dim, limits::kMaxWidth);
  c.num_attention_heads = size("num_attention_heads", c.num_attention_heads, limits::kMaxWidth);
  c.joint_attention_dim = size("joint_attention_dim", c.joint_attention_dim, limits::kMaxWidth);
  c.timestep_guidance_channels =
      size("timestep_guidance_channels", c.timestep_guidance_channels, limits::kMaxWidth);
  c.mlp_ratio = json_number(j, "mlp_ratio", c.mlp_ratio, 0, limits::kMaxMlpRatio, src);
  c.rope_theta = json_number(j, "rope_theta", c.rope_theta, 0, 1e30, src);
  c.eps = json_number(j, "eps", c.eps, 0, 1, src);
  c.guidance_embeds = json_bool(j, "guidance_embeds", c.guidance_embeds, src);
  if (j.contains("axes_dims_rope") && !j["axes_dims_rope"].is_null()) {
    FLOWKV_CHECK(j["axes_dims_rope"].is_array() && j["axes_dims_rope"].size() <= 16, src,
                 ": axes_dims_rope must be a short list");
    c.axes_dims_rope.clear();
    for (const Json& a : j["axes_dims_rope"]) {
      c.axes_dims_rope.push_back(json_int_value(a, 0, limits::kMaxWidth, src + ": axes_dims_rope"));
    }
  }
  c.validate(src);
  return c;
}

Config Config::from_json(const Json& j, const std::string& src) {
  return at_input_boundary(src, [&] { return from_json_unguarded(j, src); });
}

void Config::validate(const std::string& src) const {
  auto size = [&](int64_t v, const char* name, int64_t lo, int64_t hi) {
    FLOWKV_CHECK(v >= lo && v <= hi, src, ": ", name, " is ", v, ", outside [", lo, ", ", hi, "]");
  };
  for (auto [v, name] : {std::pair{patch_size, "patch_size"},
                         {in_channels, "in_channels"},
                         {num_attention_heads, "num_attention_heads"},
                         {attention_head_dim, "attention_head_dim"},
                         {joint_attention_dim, "joint_attention_dim"},
                         {timestep_guidance_channels, "timestep_guidance_channels"}}) {
    size(v, name, 1, limits::kMaxWidth);
  }
  size(out_channels, "out_channels", 0, limits::kMaxWidth);
  size(dim(), "num_attention_heads * attention_head_dim", 1, limits::kMaxWidth);
  size(num_layers, "num_layers", 0, limits::kMaxBlocks);
  size(num_single_layers, "num_single_layers", 0, limits::kMaxBlocks);
  size(num_blocks(), "num_layers + num_single_layers", 0, limits::kMaxBlocks);
  FLOWKV_CHECK(timestep_guidance_channels % 2 == 0, src,
               ": timestep_guidance_channels must be even");
  FLOWKV_CHECK(mlp_ratio > 0 && mlp_ratio <= limits::kMaxMlpRatio && mlp_hidden() > 0, src,
               ": mlp_ratio must be in (0, ", limits::kMaxMlpRatio, "]");
  FLOWKV_CHECK(attention_head_dim % 2 == 0, src, ": attention_head_dim must be even (RoPE pairs)");
  FLOWKV_CHECK(axes_dims_rope.size() == 4, src,
               ": axes_dims_rope must have 4 entries (T, H, W, L)");
  for (int64_t a : axes_dims_rope) {
    FLOWKV_CHECK(a > 0 && a <= limits::kMaxWidth && a % 2 == 0, src,
                 ": every axes_dims_rope entry must be even, positive and at most ",
                 limits::kMaxWidth);
  }
  const int64_t sum = std::accumulate(axes_dims_rope.begin(), axes_dims_rope.end(), int64_t{0});
  FLOWKV_CHECK(sum == attention_head_dim, src, ": axes_dims_rope sums to ", sum,
               " but attention_head_dim is ", attention_head_dim, "; they must be equal");
  FLOWKV_CHECK(std::isfinite(rope_theta) && std::isfinite(eps) && rope_theta > 0 && eps > 0, src,
               ": rope_theta and eps must be positive");
}

Json Config::to_json() const {
  Json j;
  j["_class_name"] = "Flux2Transformer2DModel";
  j["patch_size"] = patch_size;
  j["in_channels"] = in_channels;
  j["out_channels"] = out_channels > 0 ? Json(out_channels) : Json(nullptr);
  j["num_layers"] = num_layers;
  j["num_single_layers"] = num_single_layers;
  j["attention_head_dim"] = attention_head_dim;
  j["num_attention_heads"] = num_attention_heads;
  j["joint_attention_dim"] = joint_attention_dim;
  j["timestep_guidance_channels"] = timestep_guidance_channels;
  j["mlp_ratio"] = mlp_ratio;
  j["axes_dims_rope"] = axes_dims_rope;
  j["rope_theta"] = rope_theta;
  j["eps"] = eps;
  j["guidance_embeds"] = guidance_embeds;
  return j;
}

Config infer_config(const std::map<std::string, TensorInfo>& t) {
  Config c;
  if (const TensorInfo* x = find_tensor(t, "x_embedder.weight"); x && x->shape.size() == 2) {
    c.in_channels = x->shape[1];
  }
  if (const TensorInfo* x = find_tensor(t, "context_embedder.weight"); x && x->shape.size() == 2) {
    c.joint_attention_dim = x->shape[1];
  }
  int64_t dim = 0;
  if (const TensorInfo* x = find_tensor(t, "x_embedder.weight"); x && x->shape.size() == 2) {
    dim = x->shape[0];
  }
  int64_t hd = 0;
  for (const char* n : {"transformer_blocks.0.attn.norm_q.weight",
                        "single_transformer_blocks.0.attn.norm_q.weight"}) {
    if (const TensorInfo* x = find_tensor(t, n); x && x->shape.size() == 1) hd = x->shape[0];
  }
  if (hd > 0) {
    c.attention_head_dim = hd;
    if (dim > 0) c.num_attention_heads = dim / hd;
    // Four equal RoPE axes: the released layout; the shapes cannot say otherwise.
    if (hd % 8 == 0) c.axes_dims_rope = {hd / 4, hd / 4, hd / 4, hd / 4};
  }
  c.num_layers = count_blocks(t, "transformer_blocks.");
  c.num_single_layers = count_blocks(t, "single_transformer_blocks.");
  if (const TensorInfo* x = find_tensor(t, "transformer_blocks.0.ff.linear_in.weight");
      x && dim > 0 && x->shape.size() == 2) {
    c.mlp_ratio = static_cast<double>(x->shape[0] / 2) / static_cast<double>(dim);
  } else if (const TensorInfo* s = find_tensor(t, "single_transformer_blocks.0.attn.to_out.weight");
             s && dim > 0 && s->shape.size() == 2) {
    c.mlp_ratio = static_cast<double>(s->shape[1] - dim) / static_cast<double>(dim);
  }
  if (const TensorInfo* x = find_tensor(t, "time_guidance_embed.timestep_embedder.linear_1.weight");
      x && x->shape.size() == 2) {
    c.timestep_guidance_channels = x->shape[1];
  }
  c.guidance_embeds =
      find_tensor(t, "time_guidance_embed.guidance_embedder.linear_1.weight") != nullptr;
  if (const TensorInfo* x = find_tensor(t, "proj_out.weight"); x && x->shape.size() == 2) {
    c.out_channels = x->shape[0] == c.in_channels ? 0 : x->shape[0];
  }
  return c;
}

std::vector<std::string> config_disagreements(const Config& a, const Config& f,
                                              const std::map<std::string, TensorInfo>& t) {
  std::vector<std::string> out;
  auto check = [&](const char* field, int64_t claimed, int64_t found, const std::string& why) {
    if (claimed != found) {
      out.push_back(std::string("config.json says ") + field + "=" + std::to_string(claimed) +
                    " but " + why + " " + std::to_string(found));
    }
  };
  if (t.count("x_embedder.weight")) {
    check("in_channels", a.in_channels, f.in_channels, "x_embedder.weight has in_features");
    check("num_attention_heads*attention_head_dim", a.dim(), f.dim(),
          "the weights have model width");
  }
  if (t.count("context_embedder.weight")) {
    check("joint_attention_dim", a.joint_attention_dim, f.joint_attention_dim,
          "context_embedder.weight has in_features");
  }
  check("num_layers", a.num_layers, f.num_layers, "the files hold double-stream blocks:");
  check("num_single_layers", a.num_single_layers, f.num_single_layers,
        "the files hold single-stream blocks:");
  if (t.count("transformer_blocks.0.attn.norm_q.weight") ||
      t.count("single_transformer_blocks.0.attn.norm_q.weight")) {
    check("attention_head_dim", a.attention_head_dim, f.attention_head_dim, "norm_q has size");
  }
  if (a.guidance_embeds != f.guidance_embeds) {
    out.push_back(std::string("config.json says guidance_embeds=") +
                  (a.guidance_embeds ? "true" : "false") + " but the files " +
                  (f.guidance_embeds ? "hold" : "lack") + " time_guidance_embed.guidance_embedder");
  }
  if (t.count("proj_out.weight")) {
    check("out_channels (patch_size^2 * out_channels)", a.out_features(), f.out_features(),
          "proj_out.weight has out_features");
  }
  return out;
}

std::string variant_name(const Config& c) {
  const bool base = c.patch_size == 1 && c.in_channels == 128 && c.attention_head_dim == 128 &&
                    c.out_features() == 128 && c.mlp_ratio == 3.0;
  if (base && c.dim() == 3072 && c.num_layers == 5 && c.num_single_layers == 20 &&
      c.joint_attention_dim == 7680 && !c.guidance_embeds) {
    return "FLUX.2 Klein 4B";
  }
  if (base && c.dim() == 4096 && c.num_layers == 8 && c.num_single_layers == 24 &&
      c.joint_attention_dim == 12288 && !c.guidance_embeds) {
    return "FLUX.2 Klein 9B (or Klein 9B KV: same architecture)";
  }
  if (base && c.dim() == 6144 && c.num_layers == 8 && c.num_single_layers == 48 &&
      c.joint_attention_dim == 15360 && c.guidance_embeds) {
    return "FLUX.2 dev";
  }
  return "FLUX.2 custom (" + std::to_string(c.num_layers) + " double + " +
         std::to_string(c.num_single_layers) + " single blocks, width " + std::to_string(c.dim()) +
         ")";
}

bool released_config(const std::string& name, Config* out) {
  Config c;
  c.in_channels = 128;
  c.attention_head_dim = 128;
  if (name == "klein-4b") {
    c.num_layers = 5;
    c.num_single_layers = 20;
    c.num_attention_heads = 24;
    c.joint_attention_dim = 7680;
    c.guidance_embeds = false;
  } else if (name == "klein-9b" || name == "klein-9b-kv") {
    c.num_layers = 8;
    c.num_single_layers = 24;
    c.num_attention_heads = 32;
    c.joint_attention_dim = 12288;
    c.guidance_embeds = false;
  } else if (name == "dev") {
    c.num_layers = 8;
    c.num_single_layers = 48;
    c.num_attention_heads = 48;
    c.joint_attention_dim = 15360;
    c.guidance_embeds = true;
  } else {
    return false;
  }
  *out = c;
  return true;
}

}  // namespace flowkv::flux2
