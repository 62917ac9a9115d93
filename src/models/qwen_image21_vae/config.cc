#include "models/qwen_image21_vae/config.h"

#include <cmath>

#include "core/boundary.h"
#include "flowkv/error.h"
#include "flowkv/limits.h"
#include "models/common/wan_vae.h"

namespace flowkv::qwen21_vae {

namespace {

constexpr int64_t kMaxLevels = 12;
constexpr int64_t kMaxResBlocks = 64;
constexpr int64_t kMaxMult = 1024;

Config from_json_unguarded(const Json& j, const std::string& src) {
  FLOWKV_CHECK(j.is_object(), src, ": config is not a JSON object");
  json_expect_class(j, "AutoencoderKLQwenImage21", src);
  Config c;
  auto size = [&](const char* key, int64_t def, int64_t hi) {
    return json_int(j, key, def, 1, hi, src);
  };
  c.base_dim = size("base_dim", c.base_dim, limits::kMaxWidth);
  c.decoder_base_dim = j.contains("decoder_base_dim") && j["decoder_base_dim"].is_null()
                           ? c.base_dim
                           : size("decoder_base_dim", c.decoder_base_dim, limits::kMaxWidth);
  c.z_dim = size("z_dim", c.z_dim, limits::kMaxWidth);
  if (j.contains("dim_mult") && !j["dim_mult"].is_null()) {
    c.dim_mult = wan_vae::json_int_list(j["dim_mult"], "dim_mult", kMaxLevels, kMaxMult, src);
  }
  c.num_res_blocks = size("num_res_blocks", c.num_res_blocks, kMaxResBlocks);
  if (j.contains("temperal_downsample") && !j["temperal_downsample"].is_null()) {
    c.temperal_downsample =
        wan_vae::json_bool_list(j["temperal_downsample"], "temperal_downsample", kMaxLevels, src);
  }
  if (j.contains("attn_scales") && !j["attn_scales"].is_null()) {
    const Json& v = j["attn_scales"];
    FLOWKV_CHECK(v.is_array() && v.size() <= size_t(kMaxLevels), src,
                 ": attn_scales must be a list (diffusers ignores it in the residual VAE)");
    for (const Json& x : v) FLOWKV_CHECK(x.is_number(), src, ": attn_scales must hold numbers");
  }
  json_number(j, "dropout", 0.0, 0.0, 1.0, src);  // inference: no dropout
  FLOWKV_CHECK(json_bool(j, "is_residual", true, src), src,
               ": is_residual false (the Wan-2.1-style VAE without residual shortcuts) is not "
               "implemented; Qwen-Image-2.1's VAE is residual");
  c.in_channels = size("in_channels", c.in_channels, limits::kMaxWidth);
  c.out_channels = size("out_channels", c.out_channels, limits::kMaxWidth);
  if (j.contains("patch_size") && !j["patch_size"].is_null()) {
    FLOWKV_CHECK(json_int_value(j["patch_size"], 1, 64, src + ": patch_size") == 1, src,
                 ": patch_size must be null or 1 (flowkv does not patchify the 2.1 VAE's input)");
  }
  c.scale_factor_temporal = size("scale_factor_temporal", c.scale_factor_temporal, 1024);
  if (j.contains("latents_mean") && !j["latents_mean"].is_null()) {
    c.latents_mean = wan_vae::json_float_list(j["latents_mean"], "latents_mean", src);
  }
  if (j.contains("latents_std") && !j["latents_std"].is_null()) {
    c.latents_std = wan_vae::json_float_list(j["latents_std"], "latents_std", src);
  }
  c.validate(src);
  // scale_factor_spatial sizes diffusers' tiles (tile_sample_min // it): it must be the real
  // factor, or diffusers' own tiled decode would cut the latent inconsistently.
  const int64_t spatial = json_int(j, "scale_factor_spatial", 16, 1, 1 << 20, src);
  FLOWKV_CHECK(spatial == c.scale_factor(), src, ": scale_factor_spatial is ", spatial, " but ",
               c.levels(), " levels of dim_mult give a factor of ", c.scale_factor());
  return c;
}

}  // namespace

const std::vector<float>& default_latents_mean() {
  static const std::vector<float> v = {
      0.5126f,  0.7721f,  -0.0631f, 1.3506f,  -0.7855f, -2.1025f, -0.3458f, 1.3722f,
      1.8873f,  -1.7177f, -0.651f,  0.2732f,  0.7562f,  -0.6163f, -1.0277f, 3.8363f,
      2.021f,   0.0472f,  0.932f,   2.0087f,  2.4954f,  -0.1391f, -1.4249f, 1.8464f,
      -0.5236f, 1.2826f,  3.7046f,  -1.3035f, 2.7286f,  -1.4518f, -1.9036f, -1.9955f,
      -0.0342f, -1.0265f, -0.7636f, 3.0555f,  0.0746f,  -3.0751f, -0.1076f, 1.7376f,
      -1.0914f, -1.9435f, -0.2784f, -1.368f,  0.4809f,  -0.4433f, 0.3764f,  0.5729f,
      -2.0595f, 1.096f,   -1.326f,  -2.0211f, -5.0179f, 0.5275f,  4.0162f,  1.8505f,
      0.3026f,  1.9373f,  1.4937f,  0.2632f,  0.5547f,  -1.7121f, -0.1562f, 0.0304f,
  };
  return v;
}

const std::vector<float>& default_latents_std() {
  static const std::vector<float> v = {
      3.2001f, 3.2936f, 3.4321f, 3.0091f, 3.1061f, 4.0379f, 4.0705f, 3.791f,  3.0785f, 3.65f,
      3.9308f, 3.0904f, 2.8778f, 3.7675f, 3.732f,  5.0756f, 3.2864f, 4.0397f, 3.1317f, 4.0443f,
      2.9249f, 3.9454f, 3.0988f, 4.2489f, 3.4896f, 3.8513f, 3.9323f, 3.4719f, 3.7498f, 4.283f,
      3.5694f, 4.2467f, 3.9037f, 3.2947f, 5.077f,  3.5075f, 3.27f,   3.4767f, 2.8063f, 5.1125f,
      3.5327f, 4.7833f, 3.1286f, 4.1819f, 3.8527f, 3.8312f, 3.5605f, 4.3875f, 3.9624f, 4.0168f,
      3.5643f, 4.055f,  5.5614f, 4.2963f, 4.408f,  3.4959f, 3.8747f, 3.7608f, 3.5735f, 3.149f,
      3.7662f, 3.6746f, 3.4563f, 3.8161f,
  };
  return v;
}

Config Config::from_json(const Json& j, const std::string& src) {
  return at_input_boundary(src, [&] { return from_json_unguarded(j, src); });
}

void Config::validate(const std::string& src) const {
  FLOWKV_CHECK(levels() >= 1 && levels() <= kMaxLevels, src, ": dim_mult must have 1 to ",
               kMaxLevels, " entries");
  for (int64_t v : {base_dim, decoder_base_dim, z_dim, in_channels, out_channels}) {
    FLOWKV_CHECK(v >= 1 && v <= limits::kMaxWidth, src, ": a channel count is ", v,
                 ", outside [1, ", limits::kMaxWidth, "]");
  }
  for (int64_t m : dim_mult) {
    FLOWKV_CHECK(m >= 1 && m <= kMaxMult && m * base_dim <= limits::kMaxWidth &&
                     m * decoder_base_dim <= limits::kMaxWidth,
                 src, ": dim_mult entry ", m, " gives more than ", limits::kMaxWidth, " channels");
  }
  FLOWKV_CHECK(num_res_blocks >= 1 && num_res_blocks <= kMaxResBlocks, src, ": num_res_blocks is ",
               num_res_blocks, ", outside [1, ", kMaxResBlocks, "]");
  FLOWKV_CHECK(static_cast<int64_t>(temperal_downsample.size()) >= levels() - 1, src,
               ": temperal_downsample has ", temperal_downsample.size(), " entries, ", levels() - 1,
               " needed (one per downsampling level)");
  FLOWKV_CHECK(static_cast<int64_t>(latents_mean.size()) == z_dim &&
                   static_cast<int64_t>(latents_std.size()) == z_dim,
               src, ": latents_mean and latents_std need z_dim = ", z_dim, " values each, got ",
               latents_mean.size(), " and ", latents_std.size());
  for (float s : latents_std) {
    FLOWKV_CHECK(std::isfinite(s) && s != 0.0f, src, ": latents_std holds ", s,
                 " (the latents are divided by it)");
  }
  // The residual shortcuts' channel arithmetic (AvgDown3D refuses, DupUp3D asserts).
  std::vector<int64_t> enc = {base_dim};
  for (int64_t m : dim_mult) enc.push_back(base_dim * m);
  for (int64_t i = 0; i + 1 < static_cast<int64_t>(enc.size()); ++i) {
    const bool down = i != levels() - 1;
    const int64_t f = (down && temporal_down(i) ? 2 : 1) * (down ? 4 : 1);
    FLOWKV_CHECK(enc[size_t(i)] * f % enc[size_t(i + 1)] == 0, src, ": encoder level ", i, ": ",
                 enc[size_t(i)], " channels times ", f, " are not a multiple of ",
                 enc[size_t(i + 1)], " (AvgDown3D's groups)");
  }
  std::vector<int64_t> dec = {decoder_base_dim * dim_mult.back()};
  for (auto it = dim_mult.rbegin(); it != dim_mult.rend(); ++it)
    dec.push_back(decoder_base_dim * *it);
  for (int64_t i = 0; i + 1 < levels(); ++i) {
    const int64_t f = (temporal_up(i) ? 2 : 1) * 4;
    FLOWKV_CHECK(dec[size_t(i + 1)] * f % dec[size_t(i)] == 0, src, ": decoder level ", i, ": ",
                 dec[size_t(i + 1)], " channels times ", f, " are not a multiple of ",
                 dec[size_t(i)], " (DupUp3D's repeats)");
  }
}

Json Config::to_json() const {
  Json j;
  j["_class_name"] = "AutoencoderKLQwenImage21";
  j["base_dim"] = base_dim;
  j["decoder_base_dim"] = decoder_base_dim;
  j["z_dim"] = z_dim;
  j["dim_mult"] = dim_mult;
  j["num_res_blocks"] = num_res_blocks;
  j["attn_scales"] = Json::array();
  j["temperal_downsample"] = temperal_downsample;
  j["dropout"] = 0.0;
  j["latents_mean"] = latents_mean;
  j["latents_std"] = latents_std;
  j["is_residual"] = true;
  j["in_channels"] = in_channels;
  j["out_channels"] = out_channels;
  j["patch_size"] = nullptr;
  j["scale_factor_temporal"] = scale_factor_temporal;
  j["scale_factor_spatial"] = scale_factor();
  return j;
}

}  // namespace flowkv::qwen21_vae
