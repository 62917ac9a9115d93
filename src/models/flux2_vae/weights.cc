#include "models/flux2_vae/weights.h"

namespace flowkv::flux2_vae {

namespace {

struct Table {
  std::vector<ExpectedTensor> t;
  void add(const std::string& n, Shape s) { t.push_back({n, std::move(s)}); }
  void conv(const std::string& p, int64_t cout, int64_t cin, int64_t k) {
    add(p + ".weight", {cout, cin, k, k});
    add(p + ".bias", {cout});
  }
  void norm(const std::string& p, int64_t c) {
    add(p + ".weight", {c});
    add(p + ".bias", {c});
  }
  void linear(const std::string& p, int64_t cout, int64_t cin) {
    add(p + ".weight", {cout, cin});
    add(p + ".bias", {cout});
  }
  void resnet(const std::string& p, int64_t cin, int64_t cout) {
    norm(p + ".norm1", cin);
    conv(p + ".conv1", cout, cin, 3);
    norm(p + ".norm2", cout);
    conv(p + ".conv2", cout, cout, 3);
    if (cin != cout) conv(p + ".conv_shortcut", cout, cin, 1);
  }
  void mid(const std::string& p, int64_t c, bool attention) {
    resnet(p + ".resnets.0", c, c);
    if (attention) {
      const std::string a = p + ".attentions.0";
      norm(a + ".group_norm", c);
      for (const char* n : {".to_q", ".to_k", ".to_v", ".to_out.0"}) linear(a + n, c, c);
    }
    resnet(p + ".resnets.1", c, c);
  }
};

}  // namespace

std::vector<ExpectedTensor> weight_table(const Config& c) {
  Table t;
  const auto& ch = c.block_out_channels;
  const int64_t n = c.num_blocks(), lat = c.latent_channels;
  // Encoder (diffusers' Encoder: conv_in, down blocks, mid block, norm, conv_out to 2L moments).
  t.conv("encoder.conv_in", ch[0], c.in_channels, 3);
  for (int64_t i = 0; i < n; ++i) {
    const std::string p = "encoder.down_blocks." + std::to_string(i);
    const int64_t in = i == 0 ? ch[0] : ch[size_t(i - 1)], out = ch[size_t(i)];
    for (int64_t j = 0; j < c.layers_per_block; ++j) {
      t.resnet(p + ".resnets." + std::to_string(j), j == 0 ? in : out, out);
    }
    if (i < n - 1) t.conv(p + ".downsamplers.0.conv", out, out, 3);
  }
  t.mid("encoder.mid_block", ch.back(), c.mid_block_add_attention);
  t.norm("encoder.conv_norm_out", ch.back());
  t.conv("encoder.conv_out", 2 * lat, ch.back(), 3);
  if (c.use_quant_conv) t.conv("quant_conv", 2 * lat, 2 * lat, 1);
  if (c.use_post_quant_conv) t.conv("post_quant_conv", lat, lat, 1);
  // Decoder: channels walked from the deepest block up.
  const auto& dc = c.decoder_channels();
  const std::vector<int64_t> rev(dc.rbegin(), dc.rend());
  t.conv("decoder.conv_in", rev[0], lat, 3);
  t.mid("decoder.mid_block", rev[0], c.mid_block_add_attention);
  for (int64_t i = 0; i < n; ++i) {
    const std::string p = "decoder.up_blocks." + std::to_string(i);
    const int64_t in = i == 0 ? rev[0] : rev[size_t(i - 1)], out = rev[size_t(i)];
    for (int64_t j = 0; j <= c.layers_per_block; ++j) {
      t.resnet(p + ".resnets." + std::to_string(j), j == 0 ? in : out, out);
    }
    if (i < n - 1) t.conv(p + ".upsamplers.0.conv", out, out, 3);
  }
  t.norm("decoder.conv_norm_out", dc[0]);
  t.conv("decoder.conv_out", c.out_channels, dc[0], 3);
  t.add("bn.running_mean", {c.patched_channels()});
  t.add("bn.running_var", {c.patched_channels()});
  return t.t;
}

bool ignored_tensor(const std::string& name) {
  return name == "bn.num_batches_tracked";
}

std::vector<std::string> check_weights(const std::map<std::string, TensorInfo>& tensors,
                                       const Config& c) {
  std::map<std::string, TensorInfo> used;
  for (const auto& [name, info] : tensors) {
    if (!ignored_tensor(name)) used.emplace(name, info);
  }
  return check_against_table(used, weight_table(c));
}

int64_t parameter_count(const Config& c) {
  int64_t n = 0;
  for (const ExpectedTensor& e : weight_table(c)) n += shape_numel(e.shape);
  return n;
}

}  // namespace flowkv::flux2_vae
