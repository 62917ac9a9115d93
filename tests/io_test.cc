// Level 7 of the test ladder: every checkpoint parser path with bad input gives a clear error
// naming the problem, leaves nothing behind, and never crashes.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <random>

#include "flowkv/error.h"
#include "flowkv/inspect.h"
#include "io/checkpoint.h"
#include "io/json.h"
#include "io/safetensors.h"
#include "models/flux2/model.h"
#include "temp_files.h"
#include "test_util.h"

namespace flowkv {
namespace {

namespace fs = std::filesystem;

using test::expect_error;
using test::TempDir;
const auto write = test::write_file;

const auto raw_file = test::safetensors_bytes;

TEST(Safetensors, RoundTripsF32Bf16F16) {
  TempDir d;
  std::vector<float> a = {1.5f, -2.0f, 3.25f};
  std::vector<uint16_t> b = {f32_to_bf16(1.0f), f32_to_bf16(-0.5f)};
  std::vector<uint16_t> h = {f32_to_f16(0.25f)};
  write_safetensors(d.file("x.safetensors"), {{"a", DType::kF32, {3}, a.data()},
                                              {"b", DType::kBF16, {1, 2}, b.data()},
                                              {"h", DType::kF16, {1}, h.data()}});
  SafetensorsFile f = SafetensorsFile::open(d.file("x.safetensors"));
  ASSERT_EQ(f.header().tensors.size(), 3u);
  std::map<std::string, Tensor> t;
  for (const auto& info : f.header().tensors) t[info.name] = f.view(info).to_f32();
  EXPECT_EQ(t["a"].f32()[2], 3.25f);
  EXPECT_EQ(t["b"].f32()[1], -0.5f);
  EXPECT_EQ(t["h"].f32()[0], 0.25f);
  EXPECT_FALSE(fs::exists(d.file("x.safetensors.tmp-flowkv")));
}

TEST(Safetensors, BadFilesGiveClearErrors) {
  TempDir d;
  const std::string ok_header = R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  write(d.file("short"), "abc");
  expect_error([&] { read_safetensors_header(d.file("short")); }, {"truncated", "short"});
  write(d.file("past"), raw_file(ok_header, 8).substr(0, 20));
  expect_error([&] { read_safetensors_header(d.file("past")); }, {"header length", "past the end"});
  write(d.file("data_short"), raw_file(ok_header, 4));
  expect_error([&] { read_safetensors_header(d.file("data_short")); }, {"'w'", "past the end"});
  write(d.file("range"),
        raw_file(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,12]}})", 12));
  expect_error([&] { read_safetensors_header(d.file("range")); }, {"'w'", "needs 8"});
  write(d.file("overlap"), raw_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                                    R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                                    12));
  expect_error([&] { read_safetensors_header(d.file("overlap")); }, {"overlap", "'a'", "'b'"});
  write(d.file("dtype"), raw_file(R"({"w":{"dtype":"Q4","shape":[2],"data_offsets":[0,8]}})", 8));
  expect_error([&] { read_safetensors_header(d.file("dtype")); }, {"unknown dtype", "Q4"});
  write(d.file("json"), raw_file(R"({"w":{"dtype":"F32",)", 8));
  expect_error([&] { read_safetensors_header(d.file("json")); }, {"not valid JSON"});
  write(d.file("utf8"),
        raw_file("{\"w\xff\xfe\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8));
  expect_error([&] { read_safetensors_header(d.file("utf8")); }, {"not valid JSON", "UTF-8"});
  write(d.file("neg"), raw_file(R"({"w":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8));
  expect_error([&] { read_safetensors_header(d.file("neg")); }, {"non-negative"});
  write(d.file("huge_len"), std::string("\xff\xff\xff\xff\xff\xff\xff\x7f", 8) + "{}");
  expect_error([&] { read_safetensors_header(d.file("huge_len")); }, {"not plausible"});
}

TEST(Safetensors, RandomCorruptionNeverCrashes) {
  // A small fuzz: flip and truncate bytes of a valid file; every outcome is a parse or an Error.
  TempDir d;
  std::vector<float> a(16, 1.0f);
  write_safetensors(d.file("ok"),
                    {{"a", DType::kF32, {4, 4}, a.data()}, {"b", DType::kF32, {2, 2}, a.data()}});
  std::ifstream in(d.file("ok"), std::ios::binary);
  const std::string good((std::istreambuf_iterator<char>(in)), {});
  std::mt19937 rng(7);
  int errors = 0;
  for (int i = 0; i < 2000; ++i) {
    std::string bad = good;
    const int flips = 1 + static_cast<int>(rng() % 4);
    for (int f = 0; f < flips; ++f) bad[rng() % bad.size()] = static_cast<char>(rng());
    if (rng() % 3 == 0) bad.resize(rng() % bad.size());
    write(d.file("fuzz"), bad);
    try {
      SafetensorsFile f = SafetensorsFile::open(d.file("fuzz"));
      for (const auto& t : f.header().tensors) {
        if (t.dtype_known) (void)f.view(t).to_f32();
      }
    } catch (const Error&) {
      ++errors;
    }
  }
  EXPECT_GT(errors, 100);
}

TEST(Json, MalformedAndNonUtf8ConfigsAreErrors) {
  expect_error([] { parse_json("{\"a\": 1,", "cfg"); }, {"cfg", "not valid JSON"});
  expect_error([] { parse_json("{\"a\": \"\xc3\x28\"}", "cfg"); }, {"cfg", "UTF-8"});
}

// A tiny FLUX.2 folder written by flowkv itself, to damage in various ways.
flux2::Config tiny_config() {
  flux2::Config c;
  c.in_channels = 4;
  c.num_layers = 1;
  c.num_single_layers = 1;
  c.num_attention_heads = 2;
  c.attention_head_dim = 16;
  c.joint_attention_dim = 8;
  c.axes_dims_rope = {4, 4, 4, 4};
  c.guidance_embeds = false;
  return c;
}

void write_tiny(const std::string& dir, const flux2::Config& c, int64_t shard_bytes,
                std::vector<std::vector<float>>* keep) {
  std::vector<TensorToWrite> list;
  for (const ExpectedTensor& e : flux2::weight_table(c)) {
    keep->push_back(test::randn(shape_numel(e.shape), keep->size(), 0.1f));
    list.push_back({e.name, DType::kF32, e.shape, keep->back().data()});
  }
  write_diffusers_folder(dir, c.to_json(), list, shard_bytes);
}

TEST(Checkpoint, ShardedFolderLoadsAndMissingShardIsNamed) {
  TempDir d;
  std::vector<std::vector<float>> keep;
  write_tiny(d.file("m"), tiny_config(), 20000, &keep);
  ASSERT_TRUE(fs::exists(d.file("m/diffusion_pytorch_model.safetensors.index.json")));
  const CheckpointScan scan = scan_checkpoint(d.file("m"));
  EXPECT_GT(scan.files.size(), 2u);
  (void)flux2::Model::load(d.file("m"));
  fs::remove(scan.files[1]);
  const std::string missing = fs::path(scan.files[1]).filename().string();
  expect_error([&] { scan_checkpoint(d.file("m")); }, {"missing shard file", missing.c_str()});
  // inspect lists it among its problems rather than stopping.
  const InspectReport r = inspect(d.file("m"));
  ASSERT_FALSE(r.ok());
  bool named = false;
  for (const auto& p : r.problems) named |= p.find(missing) != std::string::npos;
  EXPECT_TRUE(named);
}

TEST(Checkpoint, ConfigDisagreeingWithTensorsIsOneClearError) {
  TempDir d;
  std::vector<std::vector<float>> keep;
  flux2::Config c = tiny_config();
  write_tiny(d.file("m"), c, int64_t{1} << 40, &keep);
  Json cfg = read_json_file(d.file("m/config.json"));
  cfg["num_single_layers"] = 2;
  cfg["joint_attention_dim"] = 16;
  std::ofstream(d.file("m/config.json")) << cfg.dump();
  expect_error([&] { flux2::Model::load(d.file("m")); },
               {"num_single_layers=2", "joint_attention_dim=16",
                "missing: single_transformer_blocks.1.attn.to_qkv_mlp_proj.weight"});
}

TEST(Checkpoint, WrongShapeDtypeAndUnexpectedTensorsAreListed) {
  TempDir d;
  const flux2::Config c = tiny_config();
  std::vector<std::vector<float>> keep;
  std::vector<TensorToWrite> list;
  std::vector<int64_t> i64(4, 0);
  for (const ExpectedTensor& e : flux2::weight_table(c)) {
    Shape s = e.shape;
    if (e.name == "proj_out.weight") s[0] += 1;
    keep.push_back(std::vector<float>(static_cast<size_t>(shape_numel(s)), 0.0f));
    list.push_back({e.name, DType::kF32, s, keep.back().data()});
  }
  list.push_back({"extra.weight", DType::kF32, {2}, keep[0].data()});
  write_diffusers_folder(d.file("m"), c.to_json(), list);
  expect_error(
      [&] { flux2::Model::load(d.file("m")); },
      {"wrong shape: proj_out.weight is [5, 32], expected [4, 32]", "unexpected: extra.weight"});
}

TEST(Checkpoint, NonFloatDtypeIsListed) {
  TempDir d;
  std::vector<std::vector<float>> keep;
  write_tiny(d.file("m"), tiny_config(), int64_t{1} << 40, &keep);
  // Relabel one 4-byte tensor as I32 in the header (same size, so the offsets stay valid).
  const std::string f = d.file("m/diffusion_pytorch_model.safetensors");
  std::ifstream in(f, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), {});
  in.close();
  const std::string key = "\"transformer_blocks.0.attn.norm_q.weight\":{";
  const size_t at = bytes.find(key);
  ASSERT_NE(at, std::string::npos);
  const size_t dt = bytes.find("\"F32\"", at);
  bytes.replace(dt, 5, "\"I32\"");
  write(f, bytes);
  expect_error([&] { flux2::Model::load(d.file("m")); },
               {"wrong dtype: transformer_blocks.0.attn.norm_q.weight is I32"});
}

TEST(Checkpoint, IndexNamingAFileOutsideTheFolderIsRejected) {
  TempDir d;
  std::vector<std::vector<float>> keep;
  write_tiny(d.file("m"), tiny_config(), 20000, &keep);
  std::ofstream(d.file("m/diffusion_pytorch_model.safetensors.index.json"))
      << R"({"weight_map": {"x_embedder.weight": "../../etc/passwd"}})";
  expect_error([&] { scan_checkpoint(d.file("m")); }, {"not a file in this folder"});
}

TEST(Checkpoint, NotACheckpoint) {
  TempDir d;
  expect_error([&] { scan_checkpoint(d.file("nothing")); }, {"no such file"});
  expect_error([&] { scan_checkpoint(d.path().string()); }, {"no config.json"});
}

}  // namespace
}  // namespace flowkv
