// The public Pipeline (flowkv/pipeline.h) on the tiny diffusers folders of the golden tests:
// resident and staged give the same bytes, two threads on one Pipeline give the serial results,
// images in memory equal image files, a resident pipeline loads each component once, and every
// request check that needs no weights fails before any weight is loaded.
#include <gtest/gtest.h>

#include <fstream>
#include <iterator>
#include <thread>

#include "flowkv/error.h"
#include "flowkv/generate.h"
#include "flowkv/image.h"
#include "flowkv/io.h"
#include "flowkv/pipeline.h"
#include "golden_util.h"
#include "io/image.h"
#include "io/json.h"
#include "temp_files.h"

namespace flowkv {
namespace {

using test::golden;

std::string klein_kv() {
  return golden("klein_pipeline/kv/pipeline");
}
std::string klein_base() {
  return golden("klein_pipeline/base/pipeline");
}
std::string qwen21() {
  return golden("qwen21_pipeline/pipeline");
}

std::vector<uint8_t> file_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

GenerateRequest klein_edit(uint64_t seed = 7) {
  GenerateRequest r;
  r.prompt = "a fox";
  r.references = {golden("klein_pipeline/reference.png")};
  r.steps = 2;
  r.seed = seed;
  return r;
}

GenerateRequest qwen_cfg() {
  GenerateRequest r;
  r.prompt = "a red fox";
  r.negative_prompt = "blurry";
  r.has_negative_prompt = true;
  r.cfg_scale = 4.0f;
  r.references = {golden("qwen21_pipeline/cond_rgba.png")};
  r.resolution = 64;
  r.steps = 2;
  r.seed = 3;
  return r;
}

void expect_same(const GenerateResult& a, const GenerateResult& b, const std::string& what) {
  EXPECT_EQ(a.width, b.width) << what;
  EXPECT_EQ(a.height, b.height) << what;
  EXPECT_EQ(a.channels, b.channels) << what;
  EXPECT_TRUE(a.pixels == b.pixels) << what << ": the pictures differ";
  EXPECT_EQ(a.parameters, b.parameters) << what;
}

TEST(PipelineApi, ResidentAndStagedGiveTheSameBytes) {
  for (const auto& [dir, req] : {std::pair{klein_kv(), klein_edit()}, {qwen21(), qwen_cfg()}}) {
    const Pipeline staged = Pipeline::open(dir, {.memory = MemoryPolicy::kStaged});
    const Pipeline resident = Pipeline::open(dir, {.memory = MemoryPolicy::kResident});
    EXPECT_EQ(staged.memory(), MemoryPolicy::kStaged);
    EXPECT_EQ(resident.memory(), MemoryPolicy::kResident);
    const GenerateResult s = staged.generate(req);
    const GenerateResult r1 = resident.generate(req);
    const GenerateResult r2 = resident.generate(req);
    expect_same(s, r1, dir + ": staged vs resident");
    expect_same(r1, r2, dir + ": resident, first vs second request");
    // And the one-off generate() of a folder is the staged pipeline.
    expect_same(s, generate(dir, req), dir + ": generate() vs staged");
  }
}

TEST(PipelineApi, AResidentPipelineLoadsEachComponentOnce) {
  const Pipeline resident = Pipeline::open(klein_kv(), {.memory = MemoryPolicy::kResident});
  EXPECT_EQ(resident.stats().component_loads, 0) << "open loads no weights";
  (void)resident.generate(klein_edit(1));
  const PipelineStats first = resident.stats();
  EXPECT_EQ(first.component_loads, 3) << "text encoder, VAE, transformer";
  EXPECT_EQ(first.resident_components, 3);
  for (uint64_t seed : {2, 3}) (void)resident.generate(klein_edit(seed));
  EXPECT_EQ(resident.stats().component_loads, first.component_loads)
      << "later requests load nothing";
  EXPECT_EQ(resident.stats().requests, 3);

  const Pipeline staged = Pipeline::open(klein_kv(), {.memory = MemoryPolicy::kStaged});
  (void)staged.generate(klein_edit(1));
  (void)staged.generate(klein_edit(2));
  // Per request: text encoder, VAE (references), transformer, VAE again (decode).
  EXPECT_EQ(staged.stats().component_loads, 8);
  EXPECT_EQ(staged.stats().resident_components, 0);

  resident.release();
  EXPECT_EQ(resident.stats().resident_components, 0);
  (void)resident.generate(klein_edit(1));
  EXPECT_EQ(resident.stats().component_loads, first.component_loads + 3);
}

TEST(PipelineApi, TwoThreadsOnOnePipelineEqualTheSerialResults) {
  for (const MemoryPolicy memory : {MemoryPolicy::kResident, MemoryPolicy::kStaged}) {
    const Pipeline p = Pipeline::open(klein_kv(), {.memory = memory});
    const GenerateResult serial_a = p.generate(klein_edit(11));
    const GenerateResult serial_b = p.generate(klein_edit(12));
    const Pipeline fresh = Pipeline::open(klein_kv(), {.memory = memory});
    GenerateResult a, b;
    // A fresh pipeline: both threads race for the first load of every component too.
    std::thread ta([&] { a = fresh.generate(klein_edit(11)); });
    std::thread tb([&] { b = fresh.generate(klein_edit(12)); });
    ta.join();
    tb.join();
    const std::string what = memory_policy_name(memory);
    expect_same(a, serial_a, what + ": thread a");
    expect_same(b, serial_b, what + ": thread b");
    if (memory == MemoryPolicy::kResident) EXPECT_EQ(fresh.stats().component_loads, 3);
  }
}

TEST(PipelineApi, ImagesInMemoryEqualImageFiles) {
  const Pipeline p = Pipeline::open(klein_kv(), {.memory = MemoryPolicy::kResident});
  const GenerateResult from_file = p.generate(klein_edit());
  GenerateRequest bytes = klein_edit();
  bytes.references.clear();
  bytes.images = {
      InputImage{.name = "upload", .encoded = file_bytes(golden("klein_pipeline/reference.png"))}};
  expect_same(p.generate(bytes), from_file, "encoded bytes");
  GenerateRequest decoded = klein_edit();
  decoded.references.clear();
  decoded.images = {
      InputImage{.name = "pixels", .decoded = load_image(golden("klein_pipeline/reference.png"))}};
  expect_same(p.generate(decoded), from_file, "decoded image");

  const Pipeline q = Pipeline::open(qwen21(), {.memory = MemoryPolicy::kResident});
  GenerateRequest rgba = qwen_cfg();
  rgba.references.clear();
  rgba.images = {
      InputImage{.name = "rgba", .encoded = file_bytes(golden("qwen21_pipeline/cond_rgba.png"))}};
  expect_same(q.generate(rgba), q.generate(qwen_cfg()), "RGBA bytes");
}

TEST(PipelineApi, PrepareDecodesOnceAndGivesTheLayout) {
  const Pipeline p = Pipeline::open(klein_kv(), {.memory = MemoryPolicy::kResident});
  const PreparedRequest prepared = p.prepare(klein_edit());
  EXPECT_EQ(prepared.layout().width, 80);
  EXPECT_EQ(prepared.layout().height, 64);
  ASSERT_EQ(prepared.layout().image_tokens.size(), 1u);
  EXPECT_EQ(p.stats().component_loads, 0) << "prepare loads no weights";
  const GenerateResult a = p.generate(prepared.with_seed(5));
  expect_same(a, p.generate(klein_edit(5)), "with_seed");
  EXPECT_EQ(prepared.request().seed, 7u) << "with_seed copies";
}

// Every check that needs no weights runs before any weight loads.
TEST(PipelineApi, BadRequestsFailBeforeAnyWeightLoads) {
  const Pipeline p = Pipeline::open(klein_kv(), {.memory = MemoryPolicy::kResident});
  auto refused = [&](GenerateRequest r, const std::string& words) {
    try {
      (void)p.generate(r);
      ADD_FAILURE() << "accepted; expected: " << words;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
    }
    EXPECT_EQ(p.stats().component_loads, 0) << words;
  };
  GenerateRequest r = klein_edit();
  r.steps = -1;
  refused(r, "steps: -1");
  r = klein_edit();
  r.references = {"/nonexistent/reference.png"};
  refused(r, "/nonexistent/reference.png");
  r = klein_edit();
  r.references.clear();
  r.images = {InputImage{.name = "upload 1", .encoded = {'n', 'o', 't', ' ', 'a', 'n', ' ', 'i'}}};
  refused(r, "upload 1");
  r = klein_edit();
  r.references.clear();
  r.images = {InputImage{
      .name = "short", .decoded = Image{.width = 4, .height = 4, .channels = 3, .pixels = {1, 2}}}};
  refused(r, "short");
  r = klein_edit();
  r.width = 8, r.height = 8;
  refused(r, "smaller than one latent token");
  r = klein_edit();
  r.prompt = std::string("a\0b", 3);
  refused(r, "NUL");
  r = klein_edit();
  r.dtype = "int8";
  refused(r, "opened to compute in 'auto'");
  r = klein_edit();
  r.has_negative_prompt = true;
  r.cfg_scale = 3;
  refused(r, "classifier-free guidance");
}

// Qwen-Image-2.1's released scheduler stretches to shift_terminal 0.02: one step is 0 / 0 in
// diffusers (NaN sigmas). Refused by name when the request is prepared, before any load.
TEST(PipelineApi, AScheduleDiffusersCannotComputeIsRefusedBeforeAnyLoad) {
  const Pipeline q = Pipeline::open(qwen21(), {.memory = MemoryPolicy::kResident});
  GenerateRequest r = qwen_cfg();
  r.steps = 1;
  try {
    (void)q.generate(r);
    ADD_FAILURE() << "a one-step stretched schedule accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("shift_terminal"), std::string::npos) << e.what();
  }
  EXPECT_EQ(q.stats().component_loads, 0);
}

// The pipeline class's __call__ defaults, as diffusers 0.42.1 has them.
TEST(PipelineApi, DefaultStepsAreThePipelineClasss) {
  EXPECT_EQ(Pipeline::open(klein_kv()).default_steps(), 4);     // Flux2KleinKVPipeline
  EXPECT_EQ(Pipeline::open(klein_base()).default_steps(), 50);  // Flux2KleinPipeline
  EXPECT_EQ(Pipeline::open(qwen21()).default_steps(), 40);      // QwenImage21Pipeline
  GenerateRequest r = klein_edit();
  r.steps = 0;
  const Pipeline p = Pipeline::open(klein_kv(), {.memory = MemoryPolicy::kStaged});
  const GenerateResult res = p.generate(r);
  EXPECT_NE(res.parameters.find("Steps: 4"), std::string::npos) << res.parameters;
}

// Components as CPU users download them: a GGUF transformer or text encoder inside the folder,
// or given in place of the folder's.
TEST(PipelineApi, GgufComponentsInTheFolderOrGivenInItsPlace) {
  namespace fs = std::filesystem;
  test::TempDir tmp;
  const fs::path dir = tmp.path() / "pipeline";
  fs::copy(klein_kv(), dir, fs::copy_options::recursive);
  const std::string t_gguf = tmp.file("transformer-q8_0.gguf");
  const std::string te_gguf = tmp.file("text-encoder-q8_0.gguf");
  (void)quantize_checkpoint(klein_kv() + "/transformer", t_gguf, DType::kQ8_0);
  (void)quantize_checkpoint(klein_kv() + "/text_encoder", te_gguf, DType::kQ8_0);
  for (const char* name : {"transformer", "text_encoder"}) {
    fs::remove_all(dir / name);
    fs::create_directories(dir / name);
  }
  fs::copy_file(t_gguf, dir / "transformer" / "model-q8_0.gguf");
  fs::copy_file(te_gguf, dir / "text_encoder" / "model-q8_0.gguf");

  const GenerateResult in_folder = Pipeline::open(dir.string()).generate(klein_edit());
  const GenerateResult given =
      Pipeline::open(klein_kv(), {.transformer = t_gguf, .text_encoder = te_gguf})
          .generate(klein_edit());
  expect_same(in_folder, given, "GGUF in the folder vs given in its place");
  // Q8_0 against the f32 weights: close, not equal (2 levels at most here).
  const GenerateResult f32 = Pipeline::open(klein_kv()).generate(klein_edit());
  ASSERT_EQ(f32.pixels.size(), given.pixels.size());
  int worst = 0;
  for (size_t i = 0; i < f32.pixels.size(); ++i)
    worst = std::max(worst, std::abs(int(f32.pixels[i]) - int(given.pixels[i])));
  EXPECT_LE(worst, 8);

  // Two GGUF files and no config: which one is meant is not guessed.
  fs::copy_file(t_gguf, dir / "transformer" / "other.gguf");
  try {
    (void)Pipeline::open(dir.string());
    ADD_FAILURE() << "two GGUF files accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("2 GGUF files"), std::string::npos) << e.what();
  }
  EXPECT_THROW(Pipeline::open(klein_kv(), {.transformer = tmp.file("none.gguf")}), Error);
}

// The folder's scheduler/scheduler_config.json decides the schedule: diffusers' pictures of the
// tiny pipelines under other configs (python/ref/dump_scheduler_pipelines.py), within +-1.
TEST(PipelineApi, TheFoldersSchedulerConfigIsHonoured) {
  namespace fs = std::filesystem;
  const std::string root = golden("scheduler_pipelines");
  int cases = 0;
  for (const auto& entry : fs::directory_iterator(root)) {
    const std::string dir = entry.path().string();
    const Json meta = read_json_file(dir + "/meta.json");
    test::TempDir tmp;
    const fs::path pipe = tmp.path() / "pipeline";
    fs::copy(golden(meta["pipeline"].get<std::string>()), pipe, fs::copy_options::recursive);
    fs::copy_file(dir + "/scheduler_config.json", pipe / "scheduler" / "scheduler_config.json",
                  fs::copy_options::overwrite_existing);
    const Json& q = meta["request"];
    GenerateRequest r = test::golden_request(q);
    const GenerateResult got = Pipeline::open(pipe.string()).generate(r);
    const Image want =
        load_image(dir + "/output.png", got.channels == 4 ? PixelFormat::kRGBA : PixelFormat::kRGB);
    ASSERT_EQ(got.width, want.width) << dir;
    ASSERT_EQ(got.height, want.height) << dir;
    const test::PixelDiff d = test::diff_pixels(got.pixels, want.pixels);
    EXPECT_LE(d.worst, 1) << dir << ": " << d.differ << " values differ";
    ++cases;
  }
  EXPECT_EQ(cases, 5);
}

// A scheduler config flowkv does not run is refused by name when the pipeline opens.
TEST(PipelineApi, AnUnsupportedSchedulerConfigIsRefusedByName) {
  namespace fs = std::filesystem;
  test::TempDir tmp;
  const fs::path pipe = tmp.path() / "pipeline";
  fs::copy(klein_kv(), pipe, fs::copy_options::recursive);
  Json cfg = read_json_file((pipe / "scheduler" / "scheduler_config.json").string());
  cfg["stochastic_sampling"] = true;
  std::ofstream((pipe / "scheduler" / "scheduler_config.json").string()) << cfg.dump();
  try {
    (void)Pipeline::open(pipe.string());
    ADD_FAILURE() << "stochastic_sampling accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("stochastic_sampling"), std::string::npos) << e.what();
  }
  fs::remove(pipe / "scheduler" / "scheduler_config.json");
  EXPECT_THROW(Pipeline::open(pipe.string()), Error);  // named by model_index.json, missing
}

TEST(PipelineApi, OptionsAreChecked) {
  EXPECT_THROW(parse_memory_policy("lazy"), Error);
  EXPECT_EQ(parse_memory_policy("staged"), MemoryPolicy::kStaged);
  EXPECT_THROW(Pipeline::open(klein_kv(), {.dtype = "f64"}), Error);
  EXPECT_THROW(Pipeline::open(golden("klein_pipeline")), Error);  // no model_index.json
  // auto: resident where the weights fit the budget, else staged.
  EXPECT_EQ(Pipeline::open(klein_kv(), {.memory = MemoryPolicy::kAuto, .memory_budget_bytes = 1})
                .memory(),
            MemoryPolicy::kStaged);
  EXPECT_EQ(Pipeline::open(klein_kv(), {.memory = MemoryPolicy::kAuto}).memory(),
            MemoryPolicy::kResident);
}

}  // namespace
}  // namespace flowkv
