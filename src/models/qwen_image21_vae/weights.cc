#include "models/qwen_image21_vae/weights.h"

#include "models/common/wan_vae.h"

namespace flowkv::qwen21_vae {

std::vector<int64_t> encoder_dims(const Config& c) {
  std::vector<int64_t> d = {c.base_dim};
  for (int64_t m : c.dim_mult) d.push_back(c.base_dim * m);
  return d;
}

std::vector<int64_t> decoder_dims(const Config& c) {
  std::vector<int64_t> d = {c.decoder_base_dim * c.dim_mult.back()};
  for (auto it = c.dim_mult.rbegin(); it != c.dim_mult.rend(); ++it)
    d.push_back(c.decoder_base_dim * *it);
  return d;
}

std::vector<ExpectedTensor> weight_table(const Config& c) {
  wan_vae::WeightTable t;
  const int64_t n = c.levels(), z = c.z_dim;
  const std::vector<int64_t> enc = encoder_dims(c), dec = decoder_dims(c);
  t.conv("encoder.conv_in", enc[0], c.in_channels, 3);
  for (int64_t i = 0; i < n; ++i) {
    const std::string p = "encoder.down_blocks." + std::to_string(i);
    const int64_t in = enc[size_t(i)], out = enc[size_t(i + 1)];
    for (int64_t j = 0; j < c.num_res_blocks; ++j) {
      t.resnet(p + ".resnets." + std::to_string(j), j == 0 ? in : out, out);
    }
    if (i < n - 1) {
      t.conv(p + ".downsampler.resample.1", out, out, 3);
      if (c.temporal_down(i)) t.conv(p + ".downsampler.time_conv", out, out, 1);
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
    const int64_t in = dec[size_t(i)], out = dec[size_t(i + 1)];
    for (int64_t j = 0; j <= c.num_res_blocks; ++j) {
      t.resnet(p + ".resnets." + std::to_string(j), j == 0 ? in : out, out);
    }
    if (i < n - 1) {
      t.conv(p + ".upsampler.resample.1", out, out, 3);
      if (c.temporal_up(i)) t.conv(p + ".upsampler.time_conv", 2 * out, out, 1);
    }
  }
  t.norm("decoder.norm_out", dec.back());
  t.conv("decoder.conv_out", c.out_channels, dec.back(), 3);
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

}  // namespace flowkv::qwen21_vae
