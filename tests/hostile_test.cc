// Hostile files and hostile callers (level 7 of the test ladder): each reproducer of the
// reliability review, as a hostile user would try it, ends in a flowkv::Error that names the
// problem: no out-of-bounds read, no foreign exception, no undefined arithmetic, no allocation
// before the size is checked, no NaN passing silently, no knob outside its range.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>

#include "flowkv/flux2.h"
#include "flowkv/image.h"
#include "flowkv/inspect.h"
#include "flowkv/io.h"
#include "flowkv/limits.h"
#include "flowkv/model.h"
#include "flowkv/runtime.h"
#include "flowkv/step_cache.h"
#include "io/checkpoint.h"
#include "io/json.h"
#include "io/mapped_file.h"
#include "io/safetensors.h"
#include "models/flux2/config.h"
#include "models/qwen_image/config.h"
#include "temp_files.h"

namespace flowkv {
namespace {

namespace fs = std::filesystem;
using test::expect_error;
using test::TempDir;

// The smallest header naming the modulation tensor, so that the file reads as FLUX.2.
std::string flux2_header(const std::string& extra) {
  return R"({"double_stream_modulation_img.linear.weight":{"dtype":"F32","shape":[1],)"
         R"("data_offsets":[0,4]})" +
         extra + "}";
}

// A folder with `config` as config.json and one small valid safetensors file.
void folder_with_config(const TempDir& d, const std::string& config) {
  test::write_file(d.file("config.json"), config);
  test::write_file(d.file("diffusion_pytorch_model.safetensors"),
                   test::safetensors_bytes(flux2_header(""), 4));
}

// Finding 1: offsets above 2^63 turned negative and pointed before the data section.
TEST(HostileFiles, DataOffsetsAbove2To63AreRefused) {
  TempDir d;
  const std::string far = R"({"w":{"dtype":"F32","shape":[4],)"
                          R"("data_offsets":[18446742974197923840,18446742974197923856]}})";
  test::write_file(d.file("far.safetensors"), test::safetensors_bytes(far, 16));
  expect_error([&] { read_safetensors_header(d.file("far.safetensors")); },
               {"'w'", "data_offsets[0]", "18446742974197923840"});
  // [2^64-8, size-8] on the first tensor: 8 bytes of header text would load as weights.
  const std::string back = R"({"w":{"dtype":"F32","shape":[2],)"
                           R"("data_offsets":[18446744073709551608,0]}})";
  test::write_file(d.file("back.safetensors"), test::safetensors_bytes(back, 0));
  expect_error([&] { read_safetensors_header(d.file("back.safetensors")); },
               {"'w'", "data_offsets[0]"});
  // Through the loader and inspect, as `forward --model` and `inspect` meet it.
  expect_error([&] { Flux2Transformer::load(d.file("far.safetensors")); }, {"data_offsets"});
  const InspectReport r = inspect(d.file("far.safetensors"));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.problems[0].find("data_offsets"), std::string::npos) << r.problems[0];
}

TEST(HostileFiles, ShapeEntriesAbove2To63AreRefused) {
  TempDir d;
  const std::string h = R"({"w":{"dtype":"F32","shape":[0,9223372036854775808],)"
                        R"("data_offsets":[0,0]}})";
  test::write_file(d.file("x.safetensors"), test::safetensors_bytes(h, 0));
  expect_error([&] { read_safetensors_header(d.file("x.safetensors")); }, {"'w'", "shape"});
  // A product past 64 bits is refused too, not wrapped.
  const std::string wrap = R"({"w":{"dtype":"F32","shape":[4294967296,4294967296],)"
                           R"("data_offsets":[0,0]}})";
  test::write_file(d.file("wrap.safetensors"), test::safetensors_bytes(wrap, 0));
  expect_error([&] { read_safetensors_header(d.file("wrap.safetensors")); }, {"'w'", "overflows"});
}

// Finding 2: foreign exceptions (nlohmann's out_of_range, std::stoll, filesystem_error).
TEST(HostileFiles, NumbersBeyondDoubleRangeAreFlowkvErrors) {
  TempDir d;
  folder_with_config(d, R"({"_class_name":"Flux2Transformer2DModel","num_layers":1e400})");
  expect_error([&] { Flux2Transformer::load(d.path().string()); },
               {"config.json", "not valid JSON", "number overflow"});
  EXPECT_FALSE(inspect(d.path().string()).ok());
  test::write_file(d.file("h.safetensors"),
                   test::safetensors_bytes(R"({"w":{"dtype":"F32","shape":[1e400]}})", 0));
  expect_error([&] { read_safetensors_header(d.file("h.safetensors")); },
               {"h.safetensors", "number overflow"});
  TempDir s;
  test::write_file(s.file("config.json"), R"({"_class_name":"Flux2Transformer2DModel"})");
  test::write_file(s.file("diffusion_pytorch_model.safetensors.index.json"),
                   R"({"metadata":{"total_size":1e400},"weight_map":{}})");
  expect_error([&] { scan_checkpoint(s.path().string()); }, {"index.json", "number overflow"});
}

// Deep nesting parses without recursion in nlohmann but is copied and printed recursively: it
// must stop at the parser, not overflow the stack later (found by fuzz_inspect_folder).
TEST(HostileFiles, DeeplyNestedJsonIsRefusedAtTheParser) {
  const std::string deep = std::string(1000000, '[') + std::string(1000000, ']');
  expect_error([&] { parse_json(R"({"eps":)" + deep + "}", "config.json"); },
               {"config.json", "nested deeper than"});
  TempDir d;
  folder_with_config(d, R"({"_class_name":"Flux2Transformer2DModel","x":)" + deep + "}");
  const InspectReport r = inspect(d.path().string());
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.problems[0].find("nested deeper than"), std::string::npos) << r.problems[0];
  // A bracket inside a string is text, not nesting.
  EXPECT_EQ(
      parse_json(R"({"s":")" + std::string(100, '[') + R"("})", "x")["s"].get<std::string>().size(),
      100u);
}

TEST(HostileFiles, HugeBlockIndexInATensorNameIsAProblemNotACrash) {
  TempDir d;
  const std::string h =
      flux2_header(R"(,"transformer_blocks.99999999999999999999999.x":{"dtype":"F32","shape":[1],)"
                   R"("data_offsets":[4,8]})");
  test::write_file(d.file("m.safetensors"), test::safetensors_bytes(h, 8));
  expect_error([&] { Flux2Transformer::load(d.file("m.safetensors")); },
               {"transformer_blocks.99999999999999999999999.x", "block index", "limit"});
  const InspectReport r = inspect(d.file("m.safetensors"));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.problems.back().find("block index"), std::string::npos);
}

TEST(HostileFiles, SymlinkLoopsAreFlowkvErrors) {
  TempDir d;
  fs::create_symlink(d.file("loop"), d.file("loop"));
  expect_error([&] { scan_checkpoint(d.file("loop")); }, {"loop", "symbolic links"});
  expect_error([&] { inspect(d.file("loop")); }, {"loop"});
  TempDir f;
  fs::create_symlink(f.file("config.json"), f.file("config.json"));
  expect_error([&] { Flux2Transformer::load(f.path().string()); }, {"config.json"});
}

// Finding 3: unchecked size arithmetic in configs.
TEST(HostileFiles, ConfigSizesOutsideTheLimitsAreRefused) {
  const std::string src = "config.json";
  auto flux = [&](const std::string& fields) {
    flux2::Config::from_json(parse_json("{" + fields + "}", src), src);
  };
  expect_error(
      [&] {
        flux(R"("axes_dims_rope":[4611686018427387904,4611686018427387904,)"
             R"(4611686018427387904,4611686018427387904])");
      },
      {"axes_dims_rope"});
  expect_error([&] { flux(R"("num_attention_heads":1099511627776,"attention_head_dim":128)"); },
               {"num_attention_heads"});
  expect_error([&] { flux(R"("num_attention_heads":65536,"attention_head_dim":65536)"); },
               {"num_attention_heads * attention_head_dim"});
  expect_error([&] { flux(R"("mlp_ratio":1e300)"); }, {"mlp_ratio"});
  expect_error([&] { flux(R"("patch_size":3.5)"); }, {"patch_size", "integer"});
  auto qwen = [&](const std::string& fields) {
    qwen::Config21::from_json(parse_json("{" + fields + "}", src), src);
  };
  expect_error([&] { qwen(R"("num_attention_heads":4294967296)"); }, {"num_attention_heads"});
  expect_error([&] { qwen(R"("num_attention_heads":65536,"attention_head_dim":65536)"); },
               {"attention heads"});
  expect_error([&] { qwen(R"("eps":"tiny")"); }, {"eps", "number"});
}

// Finding 4: nothing runs until the machine is out of memory, and nothing hangs.
TEST(HostileFiles, LayerCountsBeyondTheLimitAreRefusedBeforeLoading) {
  for (const char* layers : {"1000000", "1099511627776"}) {
    TempDir d;
    folder_with_config(
        d, std::string(R"({"_class_name":"Flux2Transformer2DModel","num_layers":)") + layers + "}");
    expect_error([&] { Flux2Transformer::load(d.path().string()); },
                 {"num_layers", std::to_string(limits::kMaxBlocks)});
  }
}

TEST(HostileFiles, DevicesAndFifosAreRefusedWithoutReadingOrHanging) {
  TempDir d;
  fs::create_symlink("/dev/zero", d.file("config.json"));
  expect_error([&] { Flux2Transformer::load(d.path().string()); },
               {"config.json", "not a regular file"});
  TempDir f;
  ASSERT_EQ(::mkfifo(f.file("config.json").c_str(), 0600), 0);
  expect_error([&] { Flux2Transformer::load(f.path().string()); },
               {"config.json", "not a regular file"});
  TempDir s;
  ASSERT_EQ(::mkfifo(s.file("m.safetensors").c_str(), 0600), 0);
  expect_error([&] { Flux2Transformer::load(s.file("m.safetensors")); }, {"m.safetensors"});
}

TEST(HostileCallers, ModelsBeyondTheMemoryBudgetAreRefusedBeforeLoading) {
  TempDir d;
  Flux2Transformer::write_builtin("small", 0, "f32", d.path().string());
  set_memory_budget(1 << 20);
  expect_error([&] { Flux2Transformer::load(d.path().string()); },
               {"loading", "memory budget is 0.00 GiB", "set by the caller"});
  set_memory_budget(0);
  EXPECT_GT(Flux2Transformer::load(d.path().string()).parameters(), 0);
}

TEST(HostileCallers, RequestsBeyondTheLimitsAreRefusedBeforeAllocating) {
  const Flux2Transformer m = Flux2Transformer::builtin("tiny");
  DenoiseInputs in;
  in.height = in.width = 2;
  in.prompt.embeds = Tensor::zeros({1, 2, m.text_channels()});
  in.noise = Tensor::zeros({1, 4, m.in_channels()});
  const Tensor ref = Tensor::zeros({1, 1, m.in_channels()});
  for (int64_t i = 0; i <= limits::kMaxReferences; ++i) in.references.push_back({ref, 1, 1});
  expect_error([&] { denoise(m, in, {}); }, {"reference", "at most"});
  in.references.clear();
  DenoiseOptions too_many_steps;
  too_many_steps.steps = limits::kMaxSteps + 1;
  expect_error([&] { denoise(m, in, too_many_steps); }, {"steps"});
  // A grid whose product overflows, given with a tensor that cannot match it.
  in.height = in.width = int64_t{1} << 32;
  expect_error([&] { denoise(m, in, {}); }, {"grid"});
  // Activations past the budget: refused with the figures, before the run.
  in.height = in.width = 2;
  set_memory_budget(1 << 10);
  expect_error([&] { denoise(m, in, {}); }, {"activations", "memory budget"});
  set_memory_budget(0);
  expect_error([] { set_threads(limits::kMaxThreads + 1); }, {"threads"});
}

// Finding 5: NaN and infinity never pass silently.
TEST(HostileFiles, NonFiniteWeightsAreRefusedAtLoadAndFoundByInspectValues) {
  TempDir d;
  Flux2Transformer::write_builtin("tiny", 0, "f32", d.path().string());
  const std::string file = d.file("diffusion_pytorch_model.safetensors");
  const SafetensorsHeader h = read_safetensors_header(file);
  const TensorInfo* victim = nullptr;
  for (const TensorInfo& t : h.tensors) {
    if (t.name == "transformer_blocks.0.attn.to_k.weight") victim = &t;
  }
  ASSERT_NE(victim, nullptr);
  std::string bytes = test::read_file(file);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::memcpy(&bytes[static_cast<size_t>(h.data_start + victim->begin + 4 * 7)], &nan, 4);
  test::write_file(file, bytes);
  expect_error([&] { Flux2Transformer::load(d.path().string()); },
               {"transformer_blocks.0.attn.to_k.weight", "NaN or infinity", "element 7"});
  EXPECT_TRUE(inspect(d.path().string()).ok());  // headers only: the files are well formed
  const InspectReport r = inspect(d.path().string(), {.check_values = true});
  ASSERT_EQ(r.problems.size(), 1u);
  EXPECT_NE(r.problems[0].find("transformer_blocks.0.attn.to_k.weight"), std::string::npos);
}

TEST(HostileCallers, CheckFiniteNamesTheFirstNonFiniteTensor) {
  const Flux2Transformer m = Flux2Transformer::builtin("tiny");
  Flux2Call c;
  c.img = Tensor::zeros({1, 4, m.in_channels()});
  c.txt = Tensor::zeros({1, 2, m.text_channels()});
  c.img_ids = Tensor::zeros({4, 4});
  c.txt_ids = Tensor::zeros({2, 4});
  c.timestep = Tensor::from_vector({0.5f}, {1});
  c.check_finite = true;
  EXPECT_EQ(first_non_finite(m.forward(c)), -1);
  c.txt.f32()[3] = std::numeric_limits<float>::infinity();
  expect_error([&] { m.forward(c); }, {"'txt'", "NaN or infinity", "element 3"});
  c.txt.f32()[3] = 0;
  for (int64_t i = 0; i < c.img.numel(); ++i) c.img.f32()[i] = 3e38f;  // finite; overflows inside
  expect_error([&] { m.forward(c); }, {"first intermediate that holds NaN or infinity"});
}

TEST(HostileCallers, CacheKnobsOutsideTheirRangesAreRefused) {
  for (const char* spec :
       {"teacache:threshold=nan", "teacache:threshold=inf", "fbcache:threshold=-1",
        "fora:interval=0", "pab:skip=2.5", "magcache:ratios=1.0/nan", "taylorseer:order=1e300",
        "seacache:residual_order=2", "seacache:power_exp=0", "seacache:max_consecutive_cached=-1",
        "seacache:retention_steps=1.5"}) {
    expect_error([&] { check_step_caches({spec}); }, {"cache option"});
  }
  expect_error([] { check_step_caches({"fbcache:threshold=0.1,threshold=0.2"}); },
               {"threshold", "twice"});
  check_step_caches({"fbcache:threshold=0.1", "taylorseer:interval=2"});  // sound ones pass
}

// Issue 27: every file a user names goes through one reader (read_file). A FIFO is refused at
// once (O_NONBLOCK: the open cannot block, and nothing is ever read from it), /dev/zero is
// refused before a byte is read (it would fill memory), a folder is refused, and a file over
// the limit is refused before anything is read or allocated.
TEST(HostileFiles, TheOneReaderRefusesWhatIsNotAFileWithoutBlocking) {
  TempDir d;
  ASSERT_EQ(::mkfifo(d.file("prompts.txt").c_str(), 0600), 0);
  const auto t0 = std::chrono::steady_clock::now();
  expect_error([&] { read_file(d.file("prompts.txt"), 1 << 20, "--prompts file"); },
               {"--prompts file", "prompts.txt", "not a regular file", "FIFO"});
  expect_error([&] { load_image(d.file("prompts.txt")); }, {"prompts.txt", "FIFO"});
  expect_error([&] { MappedFile::open(d.file("prompts.txt")); }, {"prompts.txt", "FIFO"});
  expect_error([&] { read_json_file(d.file("prompts.txt")); }, {"prompts.txt", "FIFO"});
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 5.0);

  expect_error([&] { read_file("/dev/zero", int64_t{1} << 40, "image"); },
               {"image /dev/zero", "not a regular file", "character device"});
  expect_error([&] { MappedFile::open("/dev/zero"); }, {"/dev/zero", "character device"});
  expect_error([&] { read_file_prefix("/dev/zero", 8); }, {"/dev/zero", "character device"});
  fs::create_symlink("/dev/zero", d.file("zero.png"));  // through a link: what it points to
  expect_error([&] { load_image(d.file("zero.png")); }, {"zero.png", "character device"});
  expect_error([&] { read_file(d.path().string(), 100); }, {"not a regular file", "folder"});
  expect_error([&] { read_file(d.file("missing.txt"), 100, "--prompts file"); },
               {"cannot open --prompts file", "missing.txt", "No such file"});
}

TEST(HostileFiles, TheOneReaderRefusesAFileOverItsLimitBeforeReadingIt) {
  TempDir d;
  // A 1 TiB sparse file: refused by its size alone (reading or allocating it would not end).
  const std::string big = d.file("huge.txt");
  test::write_file(big, "");
  fs::resize_file(big, uint64_t{1} << 40);
  expect_error(
      [&] { read_file(big, limits::kMaxPromptFileBytes, "--prompts file"); },
      {"--prompts file", "huge.txt", "1099511627776 bytes", "more than the limit of 67108864"});
  expect_error([&] { load_image(big); }, {"huge.txt", "more than the limit of 268435456"});
  expect_error([&] { read_json_file(big); }, {"huge.txt", "more than the limit"});
  // At the limit: read whole, byte for byte.
  const std::string text = "one\ntwo\r\n\n";
  test::write_file(d.file("p.txt"), text);
  EXPECT_EQ(read_file(d.file("p.txt"), static_cast<int64_t>(text.size())), text);
  expect_error([&] { read_file(d.file("p.txt"), static_cast<int64_t>(text.size()) - 1); },
               {"p.txt", "more than the limit"});
  test::write_file(d.file("empty.txt"), "");
  EXPECT_EQ(read_file(d.file("empty.txt"), 0), "");
}

TEST(HostileFiles, TheOneReaderRefusesAFileThatGrowsWhileRead) {
  // /proc files say 0 bytes and hold more: the shape of a file appended to while it is read.
  expect_error([&] { read_file("/proc/self/status", 1 << 20); }, {"/proc/self/status", "grew"});
}

}  // namespace
}  // namespace flowkv
