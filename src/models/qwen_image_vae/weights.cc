#include "models/qwen_image_vae/weights.h"

#include "models/common/wan_vae.h"

namespace flowkv::qwen_vae {

std::vector<int64_t> encoder_dims(const Config& c) {
  std::vector<int64_t> d = {c.base_dim};
  for (int64_t m : c.dim_mult) d.push_back(c.base_dim * m);
  return d;
}

std::vector<int64_t> decoder_dims(const Config& c) {
  std::vector<int64_t> d = {c.base_dim * c.dim_mult.back()};
  for (auto it = c.dim_mult.rbegin(); it != c.dim_mult.rend(); ++it) d.push_back(c.base_dim * *it);
  return d;
}

int64_t up_block_in(const Config& c, int64_t i) {
  const int64_t d = decoder_dims(c)[size_t(i)];
  return i > 0 ? d / 2 : d;
}

std::string down_resnet_name(const Config& c, int64_t level, int64_t j) {
  return "encoder.down_blocks." + std::to_string(level * (c.num_res_blocks + 1) + j);
}

std::string downsampler_name(const Config& c, int64_t level) {
  return down_resnet_name(c, level, c.num_res_blocks);
}

std::vector<ExpectedTensor> weight_table(const Config& c) {
  wan_vae::WeightTable t;
  t.causal3d = true;
  const int64_t n = c.levels(), z = c.z_dim;
  const std::vector<int64_t> enc = encoder_dims(c), dec = decoder_dims(c);
  t.conv("encoder.conv_in", enc[0], c.input_channels, 3);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t in = enc[size_t(i)], out = enc[size_t(i + 1)];
    for (int64_t j = 0; j < c.num_res_blocks; ++j)
      t.resnet(down_resnet_name(c, i, j), j == 0 ? in : out, out);
    if (i < n - 1) {
      const std::string p = downsampler_name(c, i);
      t.conv2d(p + ".resample.1", out, out, 3);
      if (c.temporal_down(i)) t.time_conv(p + ".time_conv", out, out, 3);
    }
  }
  t.mid("encoder.mid_block", enc.back());
  t.norm("encoder.norm_out", enc.back());
  t.conv("encoder.conv_out", 2 * z, enc.back(), 3);
  t.conv("quant_conv", 2 * z, 2 * z, 1);
  t.conv("post_quant_conv", z, z, 1);
  t.conv("decoder.conv_in", dec[0], z, 3);
  t.mid("decoder.mid_block", dec[0]);
  for (int64_t i = 0; i < n; ++i) {
    const std::string p = "decoder.up_blocks." + std::to_string(i);
    const int64_t out = dec[size_t(i + 1)];
    for (int64_t j = 0; j <= c.num_res_blocks; ++j)
      t.resnet(p + ".resnets." + std::to_string(j), j == 0 ? up_block_in(c, i) : out, out);
    if (i < n - 1) {
      t.conv2d(p + ".upsamplers.0.resample.1", out / 2, out, 3);
      if (c.temporal_up(i)) t.time_conv(p + ".upsamplers.0.time_conv", 2 * out, out, 3);
    }
  }
  t.norm("decoder.norm_out", dec.back());
  t.conv("decoder.conv_out", c.input_channels, dec.back(), 3);
  return t.t;
}

std::vector<std::string> check_weights(const std::map<std::string, TensorInfo>& tensors,
                                       const Config& c) {
  return check_against_table(tensors, weight_table(c));
}

int64_t parameter_count(const Config& c) {
  int64_t n = 0;
  for (const ExpectedTensor& e : weight_table(c)) n += shape_numel(e.shape);
  return n;
}

}  // namespace flowkv::qwen_vae
