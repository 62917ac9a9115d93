// The Qwen-Image VAE: encode and decode against diffusers' AutoencoderKLQwenImage as the
// QwenImage pipelines drive it (golden dumps of python/ref/dump_qwen_image_vae.py), 2x2 packing,
// tiled decode against diffusers' tiled_decode, the pipelines' VaeImageProcessor pre/postprocess
// on RGB images bit-exactly, and bad input.
#include <gtest/gtest.h>

#include <cmath>

#include "core/memory.h"
#include "core/parallel.h"
#include "golden_util.h"
#include "io/checkpoint.h"
#include "io/image.h"
#include "models/qwen_image_vae/image_processor.h"
#include "models/qwen_image_vae/model.h"
#include "models/qwen_image_vae/weights.h"
#include "temp_files.h"
#include "test_util.h"

namespace flowkv {
namespace {

using qwen_vae::Config;
using qwen_vae::DecodeOptions;
using qwen_vae::Vae;
using test::compare;
using test::ErrorStats;

const ExecContext kFast{};
const ExecContext kRef{.kernels = KernelPath::kReference};

// ---------------------------------------------------------------------------------------------
// Config and weights

TEST(QwenImageVaeConfig, DefaultsAreTheReleasedModel) {
  const Config c = Config::from_json(Json::object(), "empty.json");
  EXPECT_EQ(c.base_dim, 96);
  EXPECT_EQ(c.z_dim, 16);
  EXPECT_EQ(c.dim_mult, (std::vector<int64_t>{1, 2, 4, 4}));
  EXPECT_EQ(c.num_res_blocks, 2);
  EXPECT_EQ(c.scale_factor(), 8);
  EXPECT_EQ(c.input_channels, 3);
  ASSERT_EQ(c.latents_mean.size(), 16u);
  EXPECT_EQ(c.latents_mean[0], -0.7571f);
  EXPECT_EQ(c.latents_std[15], 1.916f);
  // temperal_upsample is the list reversed: decoder levels 0 and 1 are "upsample3d".
  EXPECT_TRUE(c.temporal_up(0) && c.temporal_up(1) && !c.temporal_up(2));
  EXPECT_FALSE(c.temporal_down(0));
  const int64_t n = qwen_vae::parameter_count(c);
  std::printf("  released Qwen-Image VAE: %.1f M parameters\n", n / 1e6);
  EXPECT_EQ(n, 126'892'531);  // sum of numel over diffusers' AutoencoderKLQwenImage() state dict
  EXPECT_EQ(qwen_vae::weight_table(c).size(), 194u);
  // The released names diffusers uses (flat encoder list, upsamplers.0, 5-D causal kernels).
  std::map<std::string, Shape> t;
  for (const ExpectedTensor& e : qwen_vae::weight_table(c)) t[e.name] = e.shape;
  EXPECT_EQ(t.at("encoder.down_blocks.2.resample.1.weight"), (Shape{96, 96, 3, 3}));
  EXPECT_EQ(t.at("encoder.down_blocks.5.time_conv.weight"), (Shape{192, 192, 3, 1, 1}));
  EXPECT_EQ(t.count("encoder.down_blocks.2.time_conv.weight"), 0u);
  EXPECT_EQ(t.at("encoder.down_blocks.3.conv_shortcut.weight"), (Shape{192, 96, 1, 1, 1}));
  EXPECT_EQ(t.at("decoder.up_blocks.1.resnets.0.conv1.weight"), (Shape{384, 192, 3, 3, 3}));
  EXPECT_EQ(t.at("decoder.up_blocks.0.upsamplers.0.time_conv.weight"), (Shape{768, 384, 3, 1, 1}));
  EXPECT_EQ(t.at("decoder.up_blocks.2.upsamplers.0.resample.1.weight"), (Shape{96, 192, 3, 3}));
  EXPECT_EQ(t.at("decoder.mid_block.attentions.0.to_qkv.weight"), (Shape{1152, 384, 1, 1}));
  EXPECT_EQ(t.at("quant_conv.weight"), (Shape{32, 32, 1, 1, 1}));
  // A round trip through to_json, whose keys are those diffusers writes.
  const Config back = Config::from_json(c.to_json(), "to_json");
  EXPECT_EQ(back.latents_std, c.latents_std);
  EXPECT_EQ(back.temperal_downsample, c.temperal_downsample);
  EXPECT_EQ(qwen_vae::weight_table(back).size(), qwen_vae::weight_table(c).size());
  const Json saved = read_json_file(test::golden("qwen_image_vae/vae/config.json"));
  const Json mine = c.to_json();
  for (const auto& [key, v] : mine.items()) EXPECT_TRUE(saved.contains(key)) << key;
  for (const auto& [key, v] : saved.items()) {
    if (key[0] != '_') {
      EXPECT_TRUE(mine.contains(key)) << key;
    }
  }
}

TEST(QwenImageVaeConfig, BadFieldsAreRefusedByName) {
  const Json good = read_json_file(test::golden("qwen_image_vae/vae/config.json"));
  auto with = [&](const char* key, Json v) {
    Json j = good;
    j[key] = std::move(v);
    return j;
  };
  const std::pair<Json, std::vector<std::string>> bad[] = {
      {with("_class_name", "AutoencoderKLQwenImage21"), {"cfg.json", "AutoencoderKLQwenImage"}},
      {with("attn_scales", Json::array({1.0})), {"cfg.json", "attn_scales"}},
      {with("latents_mean", Json::array({1.0, 2.0})), {"latents_mean", "z_dim = 16", "got 2"}},
      {with("z_dim", 64), {"latents_mean", "z_dim = 64"}},
      {with("latents_std", std::vector<double>(16, 0.0)), {"latents_std holds 0"}},
      {with("latents_std", "wide"), {"latents_std"}},
      {with("dim_mult", Json::array()), {"dim_mult"}},
      {with("dim_mult", Json::array({1, 2, 0, 4})), {"dim_mult"}},
      {with("dim_mult", Json::array({1, 2, 4, 4, 4})), {"temperal_downsample", "4 needed"}},
      {with("temperal_downsample", Json::array({false, true})),
       {"temperal_downsample", "3 needed"}},
      {with("temperal_downsample", Json::array({0, 1, 1})), {"temperal_downsample"}},
      {with("z_dim", -16), {"z_dim"}},
      {with("dropout", 2.0), {"dropout"}},
      {with("input_channels", "rgb"), {"input_channels"}},
      {with("num_res_blocks", 0), {"num_res_blocks"}},
  };
  for (const auto& [j, frags] : bad) {
    try {
      Config::from_json(j, "cfg.json");
      ADD_FAILURE() << "accepted " << j.dump().substr(0, 200);
    } catch (const Error& e) {
      for (const std::string& f : frags) {
        EXPECT_NE(std::string(e.what()).find(f), std::string::npos) << e.what() << " lacks " << f;
      }
    }
  }
  // One channel cannot be halved by a decoder upsampler.
  Json thin = with("base_dim", 1);
  thin["dim_mult"] = Json::array({1, 1, 1, 1});
  test::expect_error([&] { Config::from_json(thin, "cfg.json"); },
                     {"cfg.json", "decoder level 0", "halve"});
  EXPECT_NO_THROW(Config::from_json(good, "cfg.json"));
  test::expect_error([&] { Config::from_json(Json::array(), "cfg.json"); }, {"cfg.json", "object"});
}

// ---------------------------------------------------------------------------------------------
// Golden parity

std::map<std::string, Tensor> golden_tensors(Json* config) {
  const std::string dir = test::golden("qwen_image_vae/vae");
  const CheckpointScan scan = scan_checkpoint(dir);
  CheckpointReader reader(scan);
  std::map<std::string, Tensor> all;
  for (const auto& [name, info] : scan.tensors) all[name] = reader.get(name).clone();
  if (config) *config = *scan.config;
  return all;
}

const Vae& golden_vae() {
  static const Vae vae = Vae::load(test::golden("qwen_image_vae/vae"));
  return vae;
}

constexpr double kTol = 1e-5;  // f32 vs f32, relative to each tensor's largest value

Image source_of(const test::GoldenCase& c) {
  const Tensor& s = c.in.at("source");
  Image img = Image::blank(s.dim(1), s.dim(0), "source", 3);
  for (int64_t i = 0; i < s.numel(); ++i) img.pixels[size_t(i)] = uint8_t(s.f32()[i]);
  return img;
}

void expect_pixels(const Image& got, const Tensor& want, const std::string& what) {
  ASSERT_EQ(want.shape(), (Shape{got.height, got.width, 3})) << what;
  int64_t diff = 0;
  for (int64_t i = 0; i < want.numel(); ++i)
    diff += got.pixels[size_t(i)] != uint8_t(want.f32()[i]);
  EXPECT_EQ(diff, 0) << what << ": " << diff << " of " << want.numel() << " values differ";
}

void check_case(const std::string& name, const ExecContext& base) {
  const test::GoldenCase c("qwen_image_vae/" + name);
  const Vae& vae = golden_vae();
  const int64_t w = c.meta.at("width").get<int64_t>(), h = c.meta.at("height").get<int64_t>();
  // Preprocess, bit-exact: the PIL resize, then [-1, 1]; without a size it rounds down to 16.
  const Image src = source_of(c);
  expect_pixels(resize_lanczos(src, w, h), c.dump.at("pre.resized"), name + " pre.resized");
  const Tensor pre = c.meta.at("explicit_size").get<bool>() ? qwen_vae::preprocess(src, h, w)
                                                            : qwen_vae::preprocess(src);
  ASSERT_EQ(pre.shape(), c.dump.at("pre.image").shape());
  EXPECT_TRUE(test::bit_equal(pre.f32(), c.dump.at("pre.image").f32(), pre.numel()))
      << name << " pre.image";

  // Encode, and the pipeline's packing of the normalised latents.
  test::CaptureTracer tr;
  tr.prefix = "encode.";
  ExecContext ctx = base;
  ctx.tracer = &tr;
  const Tensor lat = vae.encode(ctx, pre);
  tr.got["encode.tokens"] = qwen_vae::pack(lat);
  test::expect_matches_dump(tr.got, c.dump, c.order, "encode.", kTol);

  // Decode: the pipeline's tokens unpacked (exactly the dumped latents), then decoded.
  test::CaptureTracer td;
  td.prefix = "decode.";
  ctx.tracer = &td;
  const Tensor& z = c.in.at("latents");
  const Tensor& tokens = c.dump.at("decode.tokens");
  const Tensor ours_tokens = qwen_vae::pack(z);
  EXPECT_TRUE(test::bit_equal(ours_tokens.f32(), tokens.f32(), tokens.numel()));
  const Tensor unpacked = qwen_vae::unpack(tokens, z.dim(2), z.dim(3));
  EXPECT_TRUE(test::bit_equal(unpacked.f32(), z.f32(), z.numel()));
  td.got["decode.tokens"] = ours_tokens;
  const Tensor img = vae.decode(ctx, unpacked);
  test::expect_matches_dump(td.got, c.dump, c.order, "decode.", kTol);

  // Postprocess to RGB pixels: bit-exact on the reference's own decoded image; on ours, an f32
  // difference of ~1e-6 may move a value sitting on a rounding boundary by one step.
  const auto theirs = qwen_vae::postprocess(c.dump.at("decode.image"));
  ASSERT_EQ(theirs.size(), 1u);
  expect_pixels(theirs[0], c.dump.at("post.pixels"), name + " post.pixels");
  const auto ours = qwen_vae::postprocess(img);
  int64_t off = 0;
  for (size_t i = 0; i < ours[0].pixels.size(); ++i) {
    const int d = int(ours[0].pixels[i]) - int(theirs[0].pixels[i]);
    EXPECT_LE(std::abs(d), 1);
    off += d != 0;
  }
  std::printf("  %s: postprocess of our decode: %lld of %zu values one step off\n", name.c_str(),
              (long long)off, ours[0].pixels.size());

  // Tiled decode with diffusers' small tiles. diffusers' tiled_decode does not clamp; ours does.
  const Json& t = c.meta.at("tiling");
  const DecodeOptions o{
      .tiled = true,
      .tile_sample_min_height = t.at("tile_sample_min_height").get<int64_t>(),
      .tile_sample_min_width = t.at("tile_sample_min_width").get<int64_t>(),
      .tile_sample_stride_height = t.at("tile_sample_stride_height").get<int64_t>(),
      .tile_sample_stride_width = t.at("tile_sample_stride_width").get<int64_t>()};
  const Tensor& tl = c.in.at("tiled_latents");
  const Tensor tiled = vae.decode(base, tl, o);
  Tensor want = c.dump.at("tiled.image").clone();
  for (int64_t i = 0; i < want.numel(); ++i) want.f32()[i] = std::clamp(want.f32()[i], -1.f, 1.f);
  ASSERT_EQ(tiled.shape(), want.shape());
  const ErrorStats e = compare(tiled.f32(), want.f32(), tiled.numel());
  std::printf("  %s: tiled decode vs diffusers (clamped): relative %.3g\n", name.c_str(), e.rel());
  EXPECT_LE(e.rel(), kTol) << name << ": tiled decode vs diffusers tiled_decode";
  const Tensor untiled = vae.decode(base, tl);
  const ErrorStats seam = compare(tiled.f32(), untiled.f32(), tiled.numel());
  EXPECT_NEAR(seam.max_abs, c.meta.at("tiled_seam_max_abs_vs_untiled").get<double>(), 1e-3);
}

TEST(QwenImageVaeGolden, ExplicitSize) {
  check_case("rgb_64x48", kFast);
}

TEST(QwenImageVaeGolden, DefaultSizeRoundsDownTo16) {
  check_case("rgb_41x77", kFast);
}

TEST(QwenImageVaeGolden, ReferenceKernels) {
  check_case("rgb_64x48", kRef);
}

TEST(QwenImageVaeGolden, PackUnpackAndNormalise) {
  const Vae& vae = golden_vae();
  const Tensor x = Tensor::from_vector(test::randn(2 * 16 * 4 * 6, 91), {2, 16, 4, 6});
  Tensor y = x.clone();
  vae.normalize(y);
  const auto& cfg = vae.config();
  EXPECT_EQ(y.f32()[(1 * 16 + 7) * 24 + 5],
            (x.f32()[(1 * 16 + 7) * 24 + 5] - cfg.latents_mean[7]) / cfg.latents_std[7]);
  vae.denormalize(y);
  EXPECT_LE(compare(y.f32(), x.f32(), x.numel()).max_abs, 1e-5);
  // Token (py, px) = (1, 2) of batch 1, channel c*4 + dy*2 + dx with c 9, dy 1, dx 0: latent
  // pixel (3, 4) of channel 9.
  const Tensor tok = qwen_vae::pack(x);
  EXPECT_EQ(tok.shape(), (Shape{2, 6, 64}));
  EXPECT_EQ(tok.f32()[(1 * 6 + 1 * 3 + 2) * 64 + 9 * 4 + 2],
            x.f32()[((1 * 16 + 9) * 4 + 3) * 6 + 4]);
  const Tensor back = qwen_vae::unpack(tok, 4, 6);
  EXPECT_TRUE(test::bit_equal(back.f32(), x.f32(), x.numel()));
  test::expect_error([&] { qwen_vae::unpack(tok, 4, 4); }, {"unpack", "[B, 2*2, 4C]"});
  test::expect_error([&] { qwen_vae::unpack(tok, 4, 5); }, {"unpack", "even"});
  test::expect_error([&] { qwen_vae::pack(Tensor::zeros({1, 16, 3, 4})); }, {"pack", "even"});
}

TEST(QwenImageVaeGolden, DoesNotDependOnThreadCountAndBatchEqualsOneAtATime) {
  const Vae& vae = golden_vae();
  const Tensor lat = Tensor::from_vector(test::randn(2 * 16 * 6 * 5, 71), {2, 16, 6, 5});
  const Tensor img = Tensor::from_vector(test::randn(2 * 3 * 40 * 48, 72, 0.5f), {2, 3, 40, 48});
  const DecodeOptions tiled{.tiled = true,
                            .tile_sample_min_height = 24,
                            .tile_sample_min_width = 24,
                            .tile_sample_stride_height = 16,
                            .tile_sample_stride_width = 16};
  set_num_threads(1);
  const Tensor a = vae.decode(kFast, lat), ta = vae.decode(kFast, lat, tiled);
  const Tensor ea = vae.encode(kFast, img);
  set_num_threads(2);
  const Tensor b = vae.decode(kFast, lat), tb = vae.decode(kFast, lat, tiled);
  const Tensor eb = vae.encode(kFast, img);
  set_num_threads(0);
  EXPECT_TRUE(test::bit_equal(a.f32(), b.f32(), a.numel()));
  EXPECT_TRUE(test::bit_equal(ta.f32(), tb.f32(), ta.numel()));
  EXPECT_TRUE(test::bit_equal(ea.f32(), eb.f32(), ea.numel()));
  for (float v : std::vector<float>(ta.f32(), ta.f32() + ta.numel())) ASSERT_LE(std::fabs(v), 1.f);
  // The second image alone gives the second half of the batch.
  const int64_t ni = 3 * 40 * 48, nl = 16 * 6 * 5;
  const Tensor img1 =
      Tensor::from_vector(std::vector<float>(img.f32() + ni, img.f32() + 2 * ni), {1, 3, 40, 48});
  const Tensor lat1 =
      Tensor::from_vector(std::vector<float>(lat.f32() + nl, lat.f32() + 2 * nl), {1, 16, 6, 5});
  const Tensor e1 = vae.encode(kFast, img1), d1 = vae.decode(kFast, lat1);
  EXPECT_TRUE(test::bit_equal(e1.f32(), ea.f32() + e1.numel(), e1.numel()));
  EXPECT_TRUE(test::bit_equal(d1.f32(), a.f32() + d1.numel(), d1.numel()));
}

TEST(QwenImageVaeGolden, Bf16WeightsAreWidenedAndPipelineFolderFindsVae) {
  // The golden model saved as BF16 in a pipeline-shaped folder (<root>/vae/): load widens every
  // weight exactly, so it decodes as the f32 model built from the bf16-rounded tensors.
  Json config;
  const auto all = golden_tensors(&config);
  std::map<std::string, Tensor> narrow, widened;
  std::vector<TensorToWrite> files;
  for (const auto& [name, t] : all) {
    narrow[name] = t.to(DType::kBF16);
    widened[name] = narrow[name].to_f32();
  }
  for (const auto& [name, t] : narrow) files.push_back({name, DType::kBF16, t.shape(), t.raw()});
  test::TempDir tmp;
  write_diffusers_folder((tmp.path() / "vae").string(), config, files);
  const Vae from_bf16 = Vae::load(tmp.path().string());
  const Vae from_f32 = Vae::from_tensors(Config::from_json(config, "golden"), widened);
  const Tensor lat = Tensor::from_vector(test::randn(16 * 2 * 3, 93), {1, 16, 2, 3});
  const Tensor a = from_bf16.decode(kFast, lat), b = from_f32.decode(kFast, lat);
  EXPECT_TRUE(test::bit_equal(a.f32(), b.f32(), a.numel()));
  // Held: f32, the 3-D kernels' last taps, no time_convs.
  int64_t held = 0, time_convs = 0;
  for (const ExpectedTensor& e : qwen_vae::weight_table(from_bf16.config())) {
    const bool tc = e.name.find("time_conv") != std::string::npos;
    time_convs += tc;
    if (!tc) held += shape_numel(e.shape) / (e.shape.size() == 5 ? e.shape[2] : 1) * 4;
  }
  EXPECT_EQ(time_convs, 8);  // two downsample3d and two upsample3d levels, weight and bias
  EXPECT_EQ(from_bf16.weight_bytes(), held);
  EXPECT_LT(held, qwen_vae::parameter_count(from_bf16.config()) * 4 / 2);
}

// ---------------------------------------------------------------------------------------------
// Bad input

TEST(QwenImageVaeErrors, MissingUnexpectedAndMisshapenTensors) {
  Json config;
  const auto all = golden_tensors(&config);
  const Config cfg = Config::from_json(config, "golden");
  EXPECT_NO_THROW(Vae::from_tensors(cfg, all));
  auto missing = all;
  missing.erase("decoder.up_blocks.1.upsamplers.0.time_conv.bias");
  test::expect_error(
      [&] { Vae::from_tensors(cfg, missing, "the test tensors"); },
      {"the test tensors", "missing: decoder.up_blocks.1.upsamplers.0.time_conv.bias"});
  auto wrong = all;
  wrong["encoder.down_blocks.4.conv2.weight"] = Tensor::zeros({4, 4, 3, 3});  // 2-D, not 3-D
  test::expect_error([&] { Vae::from_tensors(cfg, wrong); },
                     {"wrong shape: encoder.down_blocks.4.conv2.weight"});
  auto extra = all;
  extra["decoder.up_blocks.2.upsamplers.0.time_conv.weight"] = Tensor::zeros({8, 4, 3, 1, 1});
  test::expect_error([&] { Vae::from_tensors(cfg, extra); },
                     {"decoder.up_blocks.2.upsamplers.0.time_conv.weight"});
  // On disk: the loader names the folder and the tensor before reading any weight.
  test::TempDir tmp;
  std::vector<TensorToWrite> files;
  for (const auto& [name, t] : missing) files.push_back({name, DType::kF32, t.shape(), t.raw()});
  write_diffusers_folder((tmp.path() / "vae").string(), config, files);
  test::expect_error(
      [&] { Vae::load(tmp.path().string()); },
      {(tmp.path() / "vae").string(), "missing: decoder.up_blocks.1.upsamplers.0.time_conv.bias"});
  // Under a memory budget smaller than the weights: refused from the headers, before anything
  // is read or packed.
  test::TempDir fits;
  std::vector<TensorToWrite> whole;
  for (const auto& [name, t] : all) whole.push_back({name, DType::kF32, t.shape(), t.raw()});
  write_diffusers_folder(fits.path().string(), config, whole);
  set_memory_budget_bytes(int64_t{16} << 10);
  test::expect_error([&] { Vae::load(fits.path().string()); }, {"Qwen-Image VAE", "budget"});
  set_memory_budget_bytes(0);
  EXPECT_NO_THROW(Vae::load(fits.path().string()));
  // A lone .safetensors file takes the released config: the tiny golden tensors do not fit it.
  const std::string lone = (tmp.path() / "vae.safetensors").string();
  write_safetensors(lone, whole);
  test::expect_error([&] { Vae::load(lone); }, {lone, "wrong shape: encoder.conv_in.weight"});
  // A bad config in the folder: the error names config.json and the field.
  Json bad = config;
  bad["latents_std"] = Json::array({1.0});
  test::TempDir tmp2;
  write_diffusers_folder(tmp2.path().string(), bad, files);
  test::expect_error([&] { Vae::load(tmp2.path().string()); }, {"config.json", "latents_std"});
}

TEST(QwenImageVaeErrors, WrongImageAndLatentShapes) {
  const Vae& vae = golden_vae();
  auto zeros = [](Shape s) { return Tensor::zeros(std::move(s)); };
  test::expect_error([&] { vae.encode(kFast, zeros({1, 4, 32, 32})); }, {"[B, 3, H, W]", "RGB"});
  test::expect_error([&] { vae.encode(kFast, zeros({1, 3, 36, 48})); }, {"48x36", "multiple of 8"});
  test::expect_error([&] { vae.encode(kFast, zeros({3, 32, 32})); }, {"[B, 3, H, W]"});
  test::expect_error(
      [&] {
        vae.encode(kFast, Tensor::zeros({1, 3, 32, 32}, DType::kBF16));
      },
      {"f32"});
  test::expect_error([&] { vae.decode(kFast, zeros({1, 64, 2, 2})); }, {"[B, 16, h, w]"});
  test::expect_error([&] { vae.decode(kFast, zeros({1, 16, 2})); }, {"[B, 16, h, w]"});
  Tensor t = zeros({1, 8, 2, 2});
  test::expect_error([&] { vae.normalize(t); }, {"VAE latents"});
  const DecodeOptions odd{.tiled = true, .tile_sample_min_height = 36};
  test::expect_error(
      [&] {
        vae.decode(kFast, zeros({1, 16, 4, 4}), odd);
      },
      {"multiples of 8", "36"});
  const DecodeOptions gap{.tiled = true, .tile_sample_stride_height = 512};
  test::expect_error([&] { vae.decode(kFast, zeros({1, 16, 4, 4}), gap); }, {"gaps"});
  // Images: RGB only, rounded down to 16, postprocess of 3 channels.
  const Image rgb = Image::blank(40, 33, "t");
  EXPECT_EQ(qwen_vae::preprocess(rgb).shape(), (Shape{1, 3, 32, 32}));
  test::expect_error([&] { qwen_vae::preprocess(rgb, 15, 40); }, {"preprocess", "empty"});
  test::expect_error([&] { qwen_vae::preprocess(Image::blank(32, 32, "t", 4)); },
                     {"preprocess", "RGB image", "4 channels"});
  test::expect_error(
      [&] {
        qwen_vae::postprocess(zeros({1, 4, 8, 8}));
      },
      {"postprocess", "[B, 3, H, W]"});
  const auto p = qwen_vae::postprocess(Tensor::from_vector({-2.0f, 1.0f, 0.0f}, {1, 3, 1, 1}));
  EXPECT_EQ(p[0].pixels, (std::vector<uint8_t>{0, 255, 128}));  // 127.5 -> 128 (even)
}

}  // namespace
}  // namespace flowkv
