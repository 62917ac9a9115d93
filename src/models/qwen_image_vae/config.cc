#include "models/qwen_image_vae/config.h"

#include <cmath>

#include "core/boundary.h"
#include "flowkv/error.h"
#include "flowkv/limits.h"
#include "models/common/wan_vae.h"

namespace flowkv::qwen_vae {

namespace {

constexpr int64_t kMaxLevels = 12;
constexpr int64_t kMaxResBlocks = 64;
constexpr int64_t kMaxMult = 1024;

Config from_json_unguarded(const Json& j, const std::string& src) {
  FLOWKV_CHECK(j.is_object(), src, ": config is not a JSON object");
  json_expect_class(j, "AutoencoderKLQwenImage", src);
  Config c;
  auto size = [&](const char* key, int64_t def, int64_t hi) {
    return json_int(j, key, def, 1, hi, src);
  };
  auto given = [&](const char* key) { return j.contains(key) && !j[key].is_null(); };
  c.base_dim = size("base_dim", c.base_dim, limits::kMaxWidth);
  c.z_dim = size("z_dim", c.z_dim, limits::kMaxWidth);
  if (given("dim_mult")) {
    c.dim_mult = wan_vae::json_int_list(j["dim_mult"], "dim_mult", kMaxLevels, kMaxMult, src);
  }
  c.num_res_blocks = size("num_res_blocks", c.num_res_blocks, kMaxResBlocks);
  if (given("attn_scales")) {
    const Json& v = j["attn_scales"];
    FLOWKV_CHECK(v.is_array() && v.empty(), src,
                 ": attn_scales must be [] (attention inside the encoder's down blocks is not "
                 "implemented; the released Qwen-Image VAE has none), got ",
                 v.dump().substr(0, 80));
  }
  if (given("temperal_downsample")) {
    c.temperal_downsample =
        wan_vae::json_bool_list(j["temperal_downsample"], "temperal_downsample", kMaxLevels, src);
  }
  json_number(j, "dropout", 0.0, 0.0, 1.0, src);  // inference: no dropout
  c.input_channels = size("input_channels", c.input_channels, limits::kMaxWidth);
  if (given("latents_mean")) {
    c.latents_mean = wan_vae::json_float_list(j["latents_mean"], "latents_mean", src);
  }
  if (given("latents_std")) {
    c.latents_std = wan_vae::json_float_list(j["latents_std"], "latents_std", src);
  }
  c.validate(src);
  return c;
}

}  // namespace

const std::vector<float>& default_latents_mean() {
  static const std::vector<float> v = {
      -0.7571f, -0.7089f, -0.9113f, 0.1075f,  -0.1745f, 0.9653f,  -0.1517f, 1.5508f,
      0.4134f,  -0.0715f, 0.5517f,  -0.3632f, -0.1922f, -0.9497f, 0.2503f,  -0.2921f,
  };
  return v;
}

const std::vector<float>& default_latents_std() {
  static const std::vector<float> v = {
      2.8184f, 1.4541f, 2.3275f, 2.6558f, 1.2196f, 1.7708f, 2.6052f, 2.0743f,
      3.2687f, 2.1526f, 2.8652f, 1.5579f, 1.6382f, 1.1253f, 2.8251f, 1.916f,
  };
  return v;
}

Config Config::from_json(const Json& j, const std::string& src) {
  return at_input_boundary(src, [&] { return from_json_unguarded(j, src); });
}

void Config::validate(const std::string& src) const {
  FLOWKV_CHECK(levels() >= 1 && levels() <= kMaxLevels, src, ": dim_mult must have 1 to ",
               kMaxLevels, " entries");
  for (int64_t v : {base_dim, z_dim, input_channels}) {
    FLOWKV_CHECK(v >= 1 && v <= limits::kMaxWidth, src, ": a channel count is ", v,
                 ", outside [1, ", limits::kMaxWidth, "]");
  }
  for (int64_t m : dim_mult) {
    FLOWKV_CHECK(m >= 1 && m <= kMaxMult && m * base_dim <= limits::kMaxWidth, src,
                 ": dim_mult entry ", m, " gives more than ", limits::kMaxWidth, " channels");
  }
  FLOWKV_CHECK(num_res_blocks >= 1 && num_res_blocks <= kMaxResBlocks, src, ": num_res_blocks is ",
               num_res_blocks, ", outside [1, ", kMaxResBlocks, "]");
  // diffusers indexes it per level and its pipelines take 2^len(temperal_downsample) as the
  // spatial factor: any other length would disagree with the architecture.
  FLOWKV_CHECK(static_cast<int64_t>(temperal_downsample.size()) == levels() - 1, src,
               ": temperal_downsample has ", temperal_downsample.size(), " entries, ", levels() - 1,
               " needed (one per downsampling level of dim_mult)");
  FLOWKV_CHECK(static_cast<int64_t>(latents_mean.size()) == z_dim &&
                   static_cast<int64_t>(latents_std.size()) == z_dim,
               src, ": latents_mean and latents_std need z_dim = ", z_dim, " values each, got ",
               latents_mean.size(), " and ", latents_std.size());
  for (float s : latents_std) {
    FLOWKV_CHECK(std::isfinite(s) && s != 0.0f, src, ": latents_std holds ", s,
                 " (the latents are divided by it)");
  }
  // Each decoder upsampler halves its channels (Conv2d(dim, dim // 2)): at least 2 to halve.
  for (int64_t i = 0; i + 1 < levels(); ++i) {
    const int64_t out = base_dim * dim_mult[dim_mult.size() - 1 - size_t(i)];
    FLOWKV_CHECK(out >= 2, src, ": decoder level ", i, " has ", out,
                 " channel(s), too few for its upsampler to halve");
  }
}

Json Config::to_json() const {
  Json j;
  j["_class_name"] = "AutoencoderKLQwenImage";
  j["base_dim"] = base_dim;
  j["z_dim"] = z_dim;
  j["dim_mult"] = dim_mult;
  j["num_res_blocks"] = num_res_blocks;
  j["attn_scales"] = Json::array();
  j["temperal_downsample"] = temperal_downsample;
  j["dropout"] = 0.0;
  j["input_channels"] = input_channels;
  j["latents_mean"] = latents_mean;
  j["latents_std"] = latents_std;
  return j;
}

}  // namespace flowkv::qwen_vae
