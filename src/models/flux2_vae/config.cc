#include "models/flux2_vae/config.h"

#include <cmath>

#include "core/boundary.h"
#include "flowkv/error.h"
#include "flowkv/limits.h"

namespace flowkv::flux2_vae {

namespace {

constexpr int64_t kMaxVaeBlocks = 16;
constexpr int64_t kMaxLayersPerBlock = 64;

std::vector<int64_t> int_list(const Json& j, const char* key, const std::string& src) {
  const Json& v = j[key];
  FLOWKV_CHECK(v.is_array() && !v.empty() && v.size() <= kMaxVaeBlocks, src, ": ", key,
               " must be a list of 1 to ", kMaxVaeBlocks, " integers");
  std::vector<int64_t> out;
  for (const Json& x : v) {
    out.push_back(json_int_value(x, 1, limits::kMaxWidth, src + ": " + key));
  }
  return out;
}

void check_block_types(const Json& j, const char* key, const char* want, size_t count,
                       const std::string& src) {
  if (!j.contains(key) || j[key].is_null()) return;
  const Json& v = j[key];
  FLOWKV_CHECK(v.is_array() && v.size() == count, src, ": ", key, " must list ", count,
               " block types (one per entry of the channel list)");
  for (const Json& t : v) {
    FLOWKV_CHECK(t.is_string() && t.get<std::string>() == want, src, ": ", key,
                 " entries must be \"", want, "\" (the only block the FLUX.2 VAE uses)");
  }
}

Config from_json_unguarded(const Json& j, const std::string& src) {
  FLOWKV_CHECK(j.is_object(), src, ": config is not a JSON object");
  json_expect_class(j, "AutoencoderKLFlux2", src);
  Config c;
  auto size = [&](const char* key, int64_t def, int64_t hi) {
    return json_int(j, key, def, 1, hi, src);
  };
  c.in_channels = size("in_channels", c.in_channels, limits::kMaxWidth);
  c.out_channels = size("out_channels", c.out_channels, limits::kMaxWidth);
  if (j.contains("block_out_channels") && !j["block_out_channels"].is_null()) {
    c.block_out_channels = int_list(j, "block_out_channels", src);
  }
  if (j.contains("decoder_block_out_channels") && !j["decoder_block_out_channels"].is_null()) {
    c.decoder_block_out_channels = int_list(j, "decoder_block_out_channels", src);
  }
  c.layers_per_block = size("layers_per_block", c.layers_per_block, kMaxLayersPerBlock);
  c.latent_channels = size("latent_channels", c.latent_channels, limits::kMaxWidth);
  c.norm_num_groups = size("norm_num_groups", c.norm_num_groups, limits::kMaxWidth);
  if (j.contains("sample_size") && j["sample_size"].is_array()) {
    FLOWKV_CHECK(!j["sample_size"].empty(), src, ": sample_size is an empty list");
    c.sample_size =
        json_int_value(j["sample_size"][0], 1, limits::kMaxImageSide, src + ": sample_size");
  } else {
    c.sample_size = size("sample_size", c.sample_size, limits::kMaxImageSide);
  }
  c.use_quant_conv = json_bool(j, "use_quant_conv", c.use_quant_conv, src);
  c.use_post_quant_conv = json_bool(j, "use_post_quant_conv", c.use_post_quant_conv, src);
  c.mid_block_add_attention =
      json_bool(j, "mid_block_add_attention", c.mid_block_add_attention, src);
  c.batch_norm_eps = json_number(j, "batch_norm_eps", c.batch_norm_eps, 0, 1, src);
  c.batch_norm_momentum = json_number(j, "batch_norm_momentum", c.batch_norm_momentum, 0, 1, src);
  if (j.contains("act_fn") && !j["act_fn"].is_null()) {
    FLOWKV_CHECK(j["act_fn"].is_string() && j["act_fn"].get<std::string>() == "silu", src,
                 ": act_fn must be \"silu\"");
  }
  if (j.contains("patch_size") && !j["patch_size"].is_null()) {
    const Json& p = j["patch_size"];
    FLOWKV_CHECK(p.is_array() && p.size() == 2 && json_int_value(p[0], 0, 64, src) == 2 &&
                     json_int_value(p[1], 0, 64, src) == 2,
                 src, ": patch_size must be [2, 2] (the Klein pipelines patchify 2x2)");
  }
  check_block_types(j, "down_block_types", "DownEncoderBlock2D", c.block_out_channels.size(), src);
  check_block_types(j, "up_block_types", "UpDecoderBlock2D", c.decoder_channels().size(), src);
  c.validate(src);
  return c;
}

}  // namespace

Config Config::from_json(const Json& j, const std::string& src) {
  return at_input_boundary(src, [&] { return from_json_unguarded(j, src); });
}

void Config::validate(const std::string& src) const {
  FLOWKV_CHECK(!block_out_channels.empty() &&
                   static_cast<int64_t>(block_out_channels.size()) <= kMaxVaeBlocks,
               src, ": block_out_channels must have 1 to ", kMaxVaeBlocks, " entries");
  FLOWKV_CHECK(decoder_channels().size() == block_out_channels.size(), src,
               ": decoder_block_out_channels has ", decoder_channels().size(),
               " entries but block_out_channels has ", block_out_channels.size(),
               " (the encoder's down factor must equal the decoder's up factor)");
  for (int64_t v : {in_channels, out_channels, latent_channels, norm_num_groups}) {
    FLOWKV_CHECK(v >= 1 && v <= limits::kMaxWidth, src, ": a channel count is ", v,
                 ", outside [1, ", limits::kMaxWidth, "]");
  }
  FLOWKV_CHECK(layers_per_block >= 1 && layers_per_block <= kMaxLayersPerBlock, src,
               ": layers_per_block is ", layers_per_block, ", outside [1, ", kMaxLayersPerBlock,
               "]");
  for (const auto* list : {&block_out_channels, &decoder_channels()}) {
    for (int64_t ch : *list) {
      FLOWKV_CHECK(ch >= 1 && ch <= limits::kMaxWidth && ch % norm_num_groups == 0, src,
                   ": block channel count ", ch, " is not a positive multiple of norm_num_groups ",
                   norm_num_groups, " (GroupNorm needs whole groups)");
    }
  }
  FLOWKV_CHECK(std::isfinite(batch_norm_eps) && batch_norm_eps > 0, src,
               ": batch_norm_eps must be positive");
}

Json Config::to_json() const {
  Json j;
  j["_class_name"] = "AutoencoderKLFlux2";
  j["in_channels"] = in_channels;
  j["out_channels"] = out_channels;
  j["block_out_channels"] = block_out_channels;
  j["decoder_block_out_channels"] =
      decoder_block_out_channels.empty() ? Json(nullptr) : Json(decoder_block_out_channels);
  j["down_block_types"] = std::vector<std::string>(block_out_channels.size(), "DownEncoderBlock2D");
  j["up_block_types"] = std::vector<std::string>(decoder_channels().size(), "UpDecoderBlock2D");
  j["layers_per_block"] = layers_per_block;
  j["act_fn"] = "silu";
  j["latent_channels"] = latent_channels;
  j["norm_num_groups"] = norm_num_groups;
  j["sample_size"] = sample_size;
  j["use_quant_conv"] = use_quant_conv;
  j["use_post_quant_conv"] = use_post_quant_conv;
  j["mid_block_add_attention"] = mid_block_add_attention;
  j["batch_norm_eps"] = batch_norm_eps;
  j["batch_norm_momentum"] = batch_norm_momentum;
  j["patch_size"] = std::vector<int64_t>{2, 2};
  return j;
}

}  // namespace flowkv::flux2_vae
