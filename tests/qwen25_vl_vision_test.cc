// The Qwen2.5-VL vision side against transformers 5.24 (python/ref/dump_qwen25_vl_vision.py): the
// image processor with Qwen-Image's preprocessor values (patch 14) on small PNGs, bit for bit,
// and the vision tower (window attention) of a tiny random Qwen2_5_VLForConditionalGeneration,
// intermediate by intermediate.
#include <gtest/gtest.h>

#include <cstring>

#include "core/parallel.h"
#include "golden_util.h"
#include "io/checkpoint.h"
#include "io/image.h"
#include "io/json.h"
#include "models/qwen25_vl/vision.h"
#include "models/qwen25_vl/vision_weights.h"
#include "models/qwen3_vl/image_processor.h"
#include "temp_files.h"
#include "test_util.h"

namespace flowkv {
namespace {

using qwen25_vl::Grid;
using test::expect_error;
using test::golden;

const std::string kDir = "qwen25_vl_vision/";

Json meta() {
  return read_json_file(golden(kDir + "meta.json"));
}

std::vector<Grid> grid_of(const Tensor& t) {
  std::vector<Grid> g;
  for (int64_t i = 0; i < t.dim(0); ++i) {
    const float* r = t.f32() + i * 3;
    g.push_back(
        {static_cast<int64_t>(r[0]), static_cast<int64_t>(r[1]), static_cast<int64_t>(r[2])});
  }
  return g;
}

std::vector<int64_t> ints_of(const Tensor& t) {
  std::vector<int64_t> v;
  for (int64_t i = 0; i < t.numel(); ++i) v.push_back(static_cast<int64_t>(t.f32()[i]));
  return v;
}

struct Ctx {
  Arena arena;
  ExecContext ec{&arena, KernelPath::kFast, nullptr};
};

// Qwen-Image's processor/preprocessor_config.json as released (top-level min / max pixels).
const char* kQwenImagePreprocessor = R"({
  "min_pixels": 3136, "max_pixels": 12845056, "patch_size": 14, "temporal_patch_size": 2,
  "merge_size": 2, "image_mean": [0.48145466, 0.4578275, 0.40821073],
  "image_std": [0.26862954, 0.26130258, 0.27577711],
  "image_processor_type": "Qwen2VLImageProcessor", "processor_class": "Qwen2_5_VLProcessor"})";

TEST(Qwen25VLProcessor, EveryCaseMatchesTransformersBitForBit) {
  const Json m = meta();
  const auto dump = test::load_tensors(golden(kDir + "processor.safetensors"));
  // The golden folder's preprocessor_config.json (save_pretrained's spelling) and the released
  // one read to the same processor.
  const auto released = qwen3_vl::ImageProcessorConfig::from_json(
      parse_json(kQwenImagePreprocessor, "released"), "released");
  const auto saved =
      qwen3_vl::ImageProcessorConfig::read(golden(kDir + "text_encoder/preprocessor_config.json"));
  EXPECT_EQ(saved.min_pixels, released.min_pixels);
  EXPECT_EQ(saved.max_pixels, released.max_pixels);
  EXPECT_EQ(saved.patch_size, 14);
  EXPECT_EQ(saved.image_mean, released.image_mean);
  EXPECT_EQ(saved.image_std, released.image_std);
  int cases = 0;
  for (const Json& c : m["processor_cases"]) {
    const std::string name = c["case"].get<std::string>();
    Json j = parse_json(kQwenImagePreprocessor, "released");
    for (const auto& [k, v] : c["overrides"].items()) j[k] = v;
    const auto cfg = qwen3_vl::ImageProcessorConfig::from_json(j, "test preprocessor config");
    std::vector<Image> images;
    for (const Json& n : c["images"]) {
      images.push_back(load_image(golden(kDir + "in/" + n.get<std::string>() + ".png")));
    }
    const auto got = qwen3_vl::process_images(cfg, images);
    const Tensor& ref = dump.at(name + ".pixel_values");
    EXPECT_EQ(got.grid_thw, grid_of(dump.at(name + ".grid_thw"))) << name;
    ASSERT_EQ(got.pixel_values.shape(), ref.shape()) << name;
    const auto e = test::compare(got.pixel_values.f32(), ref.f32(), ref.numel());
    EXPECT_TRUE(test::bit_equal(got.pixel_values.f32(), ref.f32(), ref.numel()))
        << name << ": max abs error " << e.max_abs;
    ++cases;
  }
  EXPECT_EQ(cases, 3);
  // A 1024x1024 condition image: 73x73 patches rounded to 74x74 (multiples of 28 px), 1369
  // merged tokens.
  EXPECT_EQ(qwen3_vl::image_grid(released, 1024, 1024), (Grid{1, 74, 74}));
  EXPECT_EQ(qwen3_vl::image_token_count(released, 1024, 1024), 37 * 37);
}

TEST(Qwen25VLVisionConfig, ReadsBothLayoutsAndRefusesByName) {
  // transformers 5.x (nested text_config, rope_parameters) and 4.x (flat, the old model_type,
  // in_chans, no rope_parameters) give the same tower.
  for (const char* dir : {"text_encoder", "bf16"}) {
    const Json j = read_json_file(golden(kDir + dir + "/config.json"));
    const auto c = qwen25_vl::VisionConfig::from_model_config(j, "config.json");
    EXPECT_EQ(c.depth, 4) << dir;
    EXPECT_EQ(c.hidden_size, 32) << dir;
    EXPECT_EQ(c.intermediate_size, 48) << dir;
    EXPECT_EQ(c.out_hidden_size, 40) << dir;
    EXPECT_EQ(c.window_size, 56) << dir;
    EXPECT_EQ(c.merger_window(), 2) << dir;
    EXPECT_EQ(c.fullatt_block_indexes, (std::vector<int64_t>{2})) << dir;
    EXPECT_EQ(c.rope_theta, 10000.0) << dir;
    EXPECT_EQ(c.patch_dim(), 3 * 2 * 14 * 14) << dir;
    EXPECT_TRUE(c.full_attention(2));
    EXPECT_FALSE(c.full_attention(1));
  }
  // Defaults are transformers' (Qwen2_5_VLVisionConfig()).
  const auto d = qwen25_vl::VisionConfig::from_json(Json::object(), "empty");
  EXPECT_EQ(d.depth, 32);
  EXPECT_EQ(d.hidden_size, 3584);
  EXPECT_EQ(d.intermediate_size, 3420);
  EXPECT_EQ(d.window_size, 112);
  EXPECT_EQ(d.merger_window(), 4);
  EXPECT_EQ(d.fullatt_block_indexes, (std::vector<int64_t>{7, 15, 23, 31}));
  // A top-level rope_theta is the backward-compatible spelling; rope_parameters' own wins.
  EXPECT_EQ(
      qwen25_vl::VisionConfig::from_json(parse_json(R"({"rope_theta": 500})", "t"), "t").rope_theta,
      500.0);
  const Json j = read_json_file(golden(kDir + "text_encoder/config.json"));
  auto bad = [&](const char* key, Json value, std::initializer_list<std::string> what) {
    Json v = j["vision_config"];
    v[key] = std::move(value);
    expect_error([&] { qwen25_vl::VisionConfig::from_json(v, "vc"); }, what);
  };
  bad("hidden_act", "gelu", {"vc", "hidden_act", "gelu"});
  bad("rope_parameters", Json{{"rope_type", "default"}}, {"rope_type", "axial"});
  bad("fullatt_block_indexes", Json::array({0, 4}), {"fullatt_block_indexes[1] = 4"});
  bad("fullatt_block_indexes", "all", {"fullatt_block_indexes", "list"});
  bad("window_size", 27, {"window_size 27", "smaller than one merged token"});
  bad("num_heads", 3, {"not a multiple of num_heads"});
  bad("num_heads", 16, {"head_dim 2", "multiple of 4"});
  bad("patch_size", Json::array({14, 14}), {"patch_size", "list"});
  bad("model_type", "qwen3_vl_vision", {"model_type", "qwen3_vl_vision"});
  bad("depth", 0, {"depth"});
  Json top = j;
  top["model_type"] = "qwen3_vl";
  expect_error([&] { qwen25_vl::VisionConfig::from_model_config(top, "c.json"); },
               {"c.json", "model_type", "qwen3_vl"});
}

TEST(Qwen25VLVision, WindowLayoutMatchesTransformers) {
  const auto dump = test::load_tensors(golden(kDir + "dump.safetensors"));
  const auto proc = test::load_tensors(golden(kDir + "processor.safetensors"));
  const auto c = qwen25_vl::VisionConfig::from_model_config(
      read_json_file(golden(kDir + "text_encoder/config.json")), "config.json");
  const auto grids = grid_of(proc.at("main.grid_thw"));
  const auto l = qwen25_vl::window_layout(c, grids);
  EXPECT_EQ(l.index, ints_of(dump.at("window_index")));
  EXPECT_EQ(l.cu_window_seqlens, ints_of(dump.at("cu_window_seqlens")));
  EXPECT_EQ(l.cu_seqlens, ints_of(dump.at("cu_seqlens")));
  // Image b's 3x3 merged grid in 2x2 windows: 4, 2, 2 and 1 merged tokens (padding dropped).
  EXPECT_EQ(l.cu_window_seqlens, (std::vector<int64_t>{0, 16, 32, 48, 56, 64, 68}));
  // Frames of a video stay in their own windows, frame by frame.
  const auto v = qwen25_vl::window_layout(c, std::vector<Grid>{{2, 4, 4}});
  EXPECT_EQ(v.index, (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(v.cu_window_seqlens, (std::vector<int64_t>{0, 16, 32}));
  EXPECT_EQ(v.cu_seqlens, (std::vector<int64_t>{0, 16, 32}));
}

struct Tower {
  qwen25_vl::VisionTower tower = qwen25_vl::VisionTower::load(golden(kDir + "text_encoder"));
  std::map<std::string, Tensor> dump = test::load_tensors(golden(kDir + "dump.safetensors"));
  std::map<std::string, Tensor> proc = test::load_tensors(golden(kDir + "processor.safetensors"));
  std::vector<std::string> order;
  const Tensor& pv() const { return proc.at("main.pixel_values"); }
  std::vector<Grid> grid() const { return grid_of(proc.at("main.grid_thw")); }
  Tower() {
    const Json m = meta();
    for (const Json& n : m["dump_names"]) order.push_back(n.get<std::string>());
  }
};

TEST(Qwen25VLVision, EveryIntermediateMatchesTransformers) {
  Tower t;
  for (KernelPath path : {KernelPath::kFast, KernelPath::kReference}) {
    if (path == KernelPath::kReference) {
      t.tower = qwen25_vl::VisionTower::load(golden(kDir + "text_encoder"), {.keep_plain = true});
    }
    Ctx c;
    c.ec.kernels = path;
    test::CaptureTracer tracer;
    c.ec.tracer = &tracer;
    EXPECT_EQ(t.tower.compute_dtype(), DType::kF32);
    const Tensor out = t.tower.forward(c.ec, t.pv(), t.grid());
    for (const char* prefix : {"patch_embed", "rope.", "blocks.", "embeds"}) {
      test::expect_matches_dump(tracer.got, t.dump, t.order, prefix, 1e-5);
    }
    EXPECT_TRUE(test::bit_equal(out.f32(), tracer.got.at("embeds").f32(), out.numel()));
    EXPECT_EQ(out.shape(), (Shape{17, 40}));
  }
}

TEST(Qwen25VLVision, FromImagesEndToEnd) {
  // The C++ processor's pixels (bit-equal to the reference's) through the tower.
  Tower t;
  const auto cfg =
      qwen3_vl::ImageProcessorConfig::read(golden(kDir + "text_encoder/preprocessor_config.json"));
  const std::vector<Image> images = {load_image(golden(kDir + "in/a_112x56.png")),
                                     load_image(golden(kDir + "in/b_80x90.png"))};
  const auto p = qwen3_vl::process_images(cfg, images);
  Ctx c;
  const Tensor out = t.tower.forward(c.ec, p.pixel_values, p.grid_thw);
  const Tensor& ref = t.dump.at("embeds");
  const auto e = test::compare(out.f32(), ref.f32(), ref.numel());
  std::printf("  embeds vs transformers f32: max rel error %.3g, NMSE %.3g\n", e.rel(), e.nmse());
  EXPECT_LE(e.rel(), 1e-5);
  // No attention crosses images: each image alone gives its rows unchanged.
  int64_t r0 = 0, m0 = 0;
  for (const Grid& g : p.grid_thw) {
    const int64_t n = g[0] * g[1] * g[2];
    Tensor pv = Tensor::empty({n, p.pixel_values.dim(1)});
    std::memcpy(pv.f32(), p.pixel_values.f32() + r0 * pv.dim(1),
                static_cast<size_t>(pv.numel()) * 4);
    const Tensor one = t.tower.forward(c.ec, pv, std::vector<Grid>{g});
    const auto e1 = test::compare(one.f32(), out.f32() + m0 * 40, one.numel());
    EXPECT_LE(e1.rel(), 1e-6);
    r0 += n;
    m0 += n / 4;
  }
}

TEST(Qwen25VLVision, TwoFrameGridMatchesTransformers) {
  // The same rows read as a two-frame 4x4 grid and a 6x6 image: each frame has its own windows,
  // attends within itself in the full-attention block and takes the position tables again.
  Tower t;
  Ctx c;
  const Tensor out = t.tower.forward(c.ec, t.pv(), std::vector<Grid>{{2, 4, 4}, {1, 6, 6}});
  const Tensor& ref = t.dump.at("frames2.embeds");
  ASSERT_EQ(out.shape(), ref.shape());
  EXPECT_LE(test::compare(out.f32(), ref.f32(), ref.numel()).rel(), 1e-5);
}

TEST(Qwen25VLVision, Bf16CheckpointMatchesTransformersInBf16) {
  // bf16 tensors under "model.visual." (as transformers 4.52-4.57 saved them) with a 4.x flat
  // config; the f32 folder, saved by 5.24, keeps the original "visual." keys (as Qwen-Image's
  // text_encoder/ does).
  Tower t;
  const CheckpointScan scan = scan_checkpoint(golden(kDir + "bf16"));
  EXPECT_EQ(qwen25_vl::detect_vision_prefix(scan), "model.visual.");
  EXPECT_EQ(qwen25_vl::detect_vision_prefix(scan_checkpoint(golden(kDir + "text_encoder"))),
            "visual.");
  const auto tower = qwen25_vl::VisionTower::load(golden(kDir + "bf16"));
  EXPECT_EQ(tower.compute_dtype(), DType::kBF16);
  Ctx c;
  const Tensor out = tower.forward(c.ec, t.pv(), t.grid());
  // bf16 runs are defined to about 1% (torch rounds some products flowkv fuses, e.g. the
  // SwiGLU's silu(gate) * up and RMSNorm's scale).
  const Tensor& ref = t.dump.at("bf16.embeds");
  const auto e = test::compare(out.f32(), ref.f32(), ref.numel());
  std::printf("  embeds vs transformers bf16: max rel error %.3g, NMSE %.3g\n", e.rel(), e.nmse());
  EXPECT_LE(e.rel(), 2e-2);
}

TEST(Qwen25VLVision, ThreadCountDoesNotChangeTheResult) {
  Tower t;
  Ctx c;
  set_num_threads(1);
  const Tensor one = t.tower.forward(c.ec, t.pv(), t.grid());
  set_num_threads(3);
  const Tensor three = t.tower.forward(c.ec, t.pv(), t.grid());
  set_num_threads(0);
  EXPECT_TRUE(test::bit_equal(one.f32(), three.f32(), one.numel()));
}

TEST(Qwen25VLVision, RefusesBadInputsAndCheckpoints) {
  Tower t;
  Ctx c;
  const Tensor& pv = t.pv();
  const auto grid = t.grid();
  expect_error(
      [&] {
        t.tower.forward(c.ec, Tensor::empty({68, 100}), grid);
      },
      {"qwen2.5-vl vision", "rows are 100 wide", "1176"});
  expect_error(
      [&] {
        t.tower.forward(c.ec, pv, std::vector<Grid>{{1, 4, 8}});
      },
      {"32 patches", "68 rows"});
  expect_error(
      [&] {
        t.tower.forward(c.ec, pv, std::vector<Grid>{{1, 4, 8}, {1, 36, 1}});
      },
      {"grid_thw[1]", "multiples of spatial_merge_size 2"});
  expect_error(
      [&] {
        t.tower.forward(c.ec, pv, std::vector<Grid>{{1, 4, 8}, {0, 6, 6}});
      },
      {"grid_thw[1]", "not a positive grid"});
  expect_error([&] { t.tower.forward(c.ec, pv, {}); }, {"no image grid"});
  // A config that does not fit the tensors: every misshapen one is named.
  const CheckpointScan scan = scan_checkpoint(golden(kDir + "text_encoder"));
  auto cfg = qwen25_vl::VisionConfig::from_model_config(*scan.config, "config.json");
  const std::string prefix = qwen25_vl::detect_vision_prefix(scan);
  cfg.intermediate_size = 47;
  expect_error([&] { qwen25_vl::VisionTower::load(scan, cfg, prefix); },
               {"visual.blocks.0.mlp.gate_proj.weight is [48, 32], expected [47, 32]",
                "Qwen2.5-VL vision tower"});
  cfg.intermediate_size = 48;
  cfg.depth = 5;
  expect_error([&] { qwen25_vl::VisionTower::load(scan, cfg, prefix); }, {"visual.blocks.4."});
  cfg.depth = 4;
  expect_error([&] { qwen25_vl::VisionTower::load(scan, cfg, qwen25_vl::kVisionPrefix); },
               {"\"model.visual.\"", "model.visual.patch_embed.proj.weight"});
  // A checkpoint with one misshapen tensor (and a missing one) under its own config.
  auto table = qwen25_vl::vision_weight_table(cfg, qwen25_vl::kVisionPrefixV4);
  for (auto& e : table) {
    if (e.name == "visual.blocks.1.attn.qkv.weight") e.shape = {96, 31};
  }
  std::erase_if(table,
                [](const ExpectedTensor& e) { return e.name.find("merger.ln_q.") != e.name.npos; });
  test::TempDir dir;
  write_zero_folder(dir.path().string(), *scan.config, table, DType::kBF16);
  expect_error([&] { qwen25_vl::VisionTower::load(dir.path().string()); },
               {"visual.blocks.1.attn.qkv.weight", "visual.merger.ln_q.weight"});
  // No tower at all (the language model's tensors only).
  test::TempDir empty;
  write_zero_folder(empty.path().string(), *scan.config,
                    {{"model.language_model.norm.weight", {40}}}, DType::kBF16);
  expect_error([&] { qwen25_vl::VisionTower::load(empty.path().string()); },
               {"no Qwen2.5-VL vision tower", "model.visual.patch_embed.proj.weight",
                "visual.patch_embed.proj.weight"});
}

TEST(Qwen25VLVision, WeightTableOfTheReleasedShape) {
  // Qwen2.5-VL-7B's tower (Qwen-Image's text_encoder/): hidden 1280, 32 blocks, out 3584.
  qwen25_vl::VisionConfig c;
  c.hidden_size = 1280;
  const auto table = qwen25_vl::vision_weight_table(c, qwen25_vl::kVisionPrefixV4);
  EXPECT_EQ(table.size(), 1u + 32u * 12u + 5u);
  EXPECT_EQ(table[0].name, "visual.patch_embed.proj.weight");
  EXPECT_EQ(table[0].shape, (Shape{1280, 3, 2, 14, 14}));
  EXPECT_EQ(table.back().name, "visual.merger.mlp.2.bias");
  const int64_t params = qwen25_vl::vision_parameter_count(c);
  std::printf("  Qwen2.5-VL-7B vision tower: %.1f M parameters\n", params / 1e6);
  EXPECT_GT(params, 650'000'000);
  EXPECT_LT(params, 700'000'000);
  // One 1024x1024 image under Qwen-Image's processor: 74x74 patches, windows of 8x8 patches.
  const auto l = qwen25_vl::window_layout(c, std::vector<Grid>{{1, 74, 74}});
  EXPECT_EQ(l.cu_window_seqlens.size(), 1u + 10u * 10u);
  const double tf = qwen25_vl::vision_flops(c, std::vector<Grid>{{1, 74, 74}}) / 1e12;
  std::printf("  one 1024x1024 image through it: %.2f TFLOPs\n", tf);
  EXPECT_GT(tf, 6.0);
  EXPECT_LT(tf, 9.0);
}

}  // namespace
}  // namespace flowkv
