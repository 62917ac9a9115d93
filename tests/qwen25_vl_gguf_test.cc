// Qwen2.5-VL text encoders from GGUF files (models/qwen25_vl/source.h), on the tiny Qwen-Image
// pipeline's text encoder (tests/golden/qwen_image_pipeline/pipeline/text_encoder, f32):
//  - `flowkv quantize` of the folder (F16, BF16, Q8_0): the language model and the vision tower
//    (its 5-D Conv3d weight stored folded, io/gguf.h) load back and match the f32 folder;
//  - llama.cpp's names ("qwen2vl"): tests/golden/qwen25_vl_gguf/text_encoder-f16.gguf, written by
//    llama.cpp's gguf-py (python/ref/dump_qwen25_vl_gguf.py, its own QWEN2VL name map), and an
//    F32 one written here: the same outputs as the safetensors folder and as flowkv's own F16
//    quantization; the config from the metadata; text-to-image prompts work, the vision tower is
//    refused by name;
//  - malformed files: one Error naming the key or tensor, from the headers alone.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <set>
#include <stdexcept>
#include <tuple>
#include <vector>

#include "core/exec_context.h"
#include "flowkv/io.h"
#include "golden_util.h"
#include "io/checkpoint.h"
#include "io/gguf.h"
#include "io/json.h"
#include "models/qwen25_vl/prompt_encoder.h"
#include "models/qwen25_vl/source.h"
#include "models/qwen25_vl/text_model.h"
#include "models/qwen25_vl/vision.h"
#include "temp_files.h"
#include "test_util.h"

namespace flowkv {
namespace {

namespace fs = std::filesystem;
using test::expect_error;
using test::golden;

std::string te_dir() {
  return golden("qwen_image_pipeline/pipeline/text_encoder");
}
std::string pipeline_dir(const char* sub) {
  return golden(std::string("qwen_image_pipeline/pipeline/") + sub);
}
std::string llama_f16() {
  return golden("qwen25_vl_gguf/text_encoder-f16.gguf");
}

struct Ctx {
  Arena arena;
  ExecContext ec{&arena, KernelPath::kFast, nullptr};
};

// One picture of 4x4 patches (4 merged tokens) and a prompt around its placeholders.
const std::vector<qwen25_vl::Grid> kGrids = {{1, 4, 4}};

Tensor pixels() {
  const int64_t n = 16, d = 3 * 2 * 14 * 14;
  const std::vector<float> v = test::randn(n * d, 11);
  Tensor t = Tensor::empty({n, d});
  std::copy(v.begin(), v.end(), t.f32());
  return t;
}

std::vector<int32_t> ids(const qwen25_vl::Config& c, bool image) {
  std::vector<int32_t> v = {5, 900, 17, 2001, 33, 1500, 7};
  if (!image) return v;
  v.push_back(static_cast<int32_t>(c.vision_start_token_id));
  for (int i = 0; i < 4; ++i) v.push_back(static_cast<int32_t>(c.image_token_id));
  v.push_back(static_cast<int32_t>(c.vision_end_token_id));
  for (int32_t x : {44, 1200, 9}) v.push_back(x);
  return v;
}

// The language model's output on a text prompt and on one with the picture's embeddings.
struct Outputs {
  Tensor text, image;
};
Outputs run(const qwen25_vl::TextModel& m, const Tensor& vision_embeds) {
  Ctx ctx;
  Outputs o;
  const std::vector<int32_t> a = ids(m.config(), false), b = ids(m.config(), true);
  o.text = m.forward(ctx.ec, {.ids = a});
  const qwen25_vl::VisionEmbeds ve{vision_embeds};
  o.image = m.forward(ctx.ec, {.ids = b, .grids = kGrids, .vision = &ve});
  return o;
}

Tensor run_vision(const qwen25_vl::VisionTower& v) {
  Ctx ctx;
  return v.forward(ctx.ec, pixels(), kGrids);
}

struct Reference {
  Tensor vision;
  Outputs out;
};
const Reference& reference() {
  static const Reference r = [] {
    Reference x;
    x.vision = run_vision(qwen25_vl::VisionTower::load(te_dir()));
    x.out = run(qwen25_vl::TextModel::load(te_dir()), x.vision);
    return x;
  }();
  return r;
}

test::ErrorStats stats(const Tensor& got, const Tensor& ref) {
  EXPECT_EQ(got.shape(), ref.shape());
  return test::compare(got.f32(), ref.f32(), ref.numel());
}

void expect_bit_equal(const Tensor& got, const Tensor& ref, const std::string& what) {
  ASSERT_EQ(got.shape(), ref.shape()) << what;
  EXPECT_TRUE(test::bit_equal(got.f32(), ref.f32(), ref.numel())) << what;
}

struct QuantCase {
  DType type;
  double max_rel;  // the language model's and the vision tower's outputs against f32
  double max_nmse;
};

// ---- flowkv quantize of a text_encoder/ folder ----

TEST(Qwen25VLGguf, QuantizedFolderLoadsBack) {
  const Reference& ref = reference();
  test::TempDir tmp;
  // Measured: F16 max rel error 1.7e-3 (NMSE 1.5e-6), BF16 1.5e-2 (9.2e-5), Q8_0 5.2e-2
  // (1.3e-3). The tiny random model's final norm amplifies the weights' rounding ~15-40x.
  for (const QuantCase& q :
       {QuantCase{DType::kF16, 2.5e-3, 3e-6}, QuantCase{DType::kBF16, 3e-2, 2e-4},
        QuantCase{DType::kQ8_0, 0.1, 3e-3}}) {
    const std::string name(dtype_name(q.type));
    const std::string file = tmp.file("te-" + name + ".gguf");
    const QuantizeReport rep = quantize_checkpoint(te_dir(), file, q.type);
    EXPECT_GT(rep.quantized, 0) << name;
    // The Conv3d weight, stored folded to 4-D, reads back 5-D.
    const CheckpointScan scan = scan_checkpoint(file);
    ASSERT_TRUE(scan.tensors.count("visual.patch_embed.proj.weight")) << name;
    EXPECT_EQ(scan.tensors.at("visual.patch_embed.proj.weight").shape, (Shape{32, 3, 2, 14, 14}));
    EXPECT_NE(scan.gguf->find("flowkv.shape.visual.patch_embed.proj.weight"), nullptr);
    ASSERT_TRUE(scan.config.has_value());

    const qwen25_vl::TextModel m = qwen25_vl::TextModel::load(file);
    const qwen25_vl::VisionTower v = qwen25_vl::VisionTower::load(file);
    const Tensor vis = run_vision(v);
    const Outputs o = run(m, vis);
    for (const auto& [what, got, want] :
         {std::tuple{"vision", &vis, &ref.vision}, std::tuple{"text", &o.text, &ref.out.text},
          std::tuple{"image prompt", &o.image, &ref.out.image}}) {
      const test::ErrorStats e = stats(*got, *want);
      EXPECT_LE(e.rel(), q.max_rel) << name << " " << what;
      EXPECT_LE(e.nmse(), q.max_nmse) << name << " " << what;
      std::printf("  %-5s %-13s max rel error %.3g, NMSE %.3g\n", name.c_str(), what, e.rel(),
                  e.nmse());
    }
    // The same GGUF in a text_encoder/ folder beside config.json (no safetensors) reads the same.
    const fs::path dir = tmp.path() / ("dir-" + name);
    fs::create_directories(dir);
    fs::copy_file(te_dir() + "/config.json", dir / "config.json");
    fs::copy_file(file, dir / "model.gguf");
    expect_bit_equal(run(qwen25_vl::TextModel::load(dir.string()), vis).image, o.image,
                     name + " in a folder");
    expect_bit_equal(run_vision(qwen25_vl::VisionTower::load(dir.string())), vis,
                     name + " vision in a folder");
  }
}

// ---- llama.cpp's names ----

// The golden llama.cpp file's metadata and tensors, for variants written here.
struct LlamaFile {
  GgufFile file = GgufFile::open(llama_f16());
  GgufMetadata meta = file.header().metadata;
  std::vector<Tensor> data;
  std::vector<TensorToWrite> tensors;
  LlamaFile() {
    for (const TensorInfo& t : file.header().tensors) {
      data.push_back(file.view(t));
      tensors.push_back({t.name, t.dtype, t.shape, data.back().raw()});
    }
  }
  void set(const std::string& key, GgufValue v) {
    for (auto& [k, x] : meta) {
      if (k == key) {
        x = std::move(v);
        return;
      }
    }
    meta.emplace_back(key, std::move(v));
  }
  void erase_key(const std::string& key) {
    std::erase_if(meta, [&](const auto& kv) { return kv.first == key; });
  }
  void erase_tensor(const std::string& name) {
    std::erase_if(tensors, [&](const TensorToWrite& t) { return t.name == name; });
  }
  TensorToWrite& tensor(const std::string& name) {
    for (TensorToWrite& t : tensors) {
      if (t.name == name) return t;
    }
    throw std::runtime_error("no tensor " + name);
  }
  std::string write(const std::string& path) const {
    write_gguf(path, meta, tensors);
    return path;
  }
};

// The F32 llama.cpp file: the golden's metadata, the folder's f32 weights under llama.cpp names.
std::string write_llama_f32(const std::string& path) {
  LlamaFile f;
  const CheckpointScan scan = scan_checkpoint(te_dir());
  const CheckpointReader reader(scan);
  std::vector<Tensor> keep;
  f.tensors.clear();
  for (const auto& [name, info] : scan.tensors) {
    const std::string n = qwen25_vl::to_llama_cpp_name(name);
    if (n.empty()) continue;  // the vision tower, lm_head
    keep.push_back(reader.get(name).to(DType::kF32));
    f.tensors.push_back({n, DType::kF32, info.shape, keep.back().raw()});
  }
  f.set("general.file_type", GgufValue::u32(0));
  return f.write(path);
}

TEST(Qwen25VLGguf, NameTableIsGgufPys) {
  // Every tensor gguf-py named in the golden file maps back to a language-model weight, and the
  // table covers them all.
  const GgufHeader h = read_gguf_header(llama_f16());
  const CheckpointScan folder = scan_checkpoint(te_dir());
  std::set<std::string> named;
  for (const auto& [name, info] : folder.tensors) {
    const std::string n = qwen25_vl::to_llama_cpp_name(name);
    if (!n.empty()) named.insert(n);
  }
  std::set<std::string> in_file;
  for (const TensorInfo& t : h.tensors) in_file.insert(t.name);
  EXPECT_EQ(named, in_file);
  EXPECT_EQ(in_file.size(), 2u + 12u * 3u);
  EXPECT_EQ(qwen25_vl::to_llama_cpp_name("model.layers.2.self_attn.q_proj.bias"),
            "blk.2.attn_q.bias");
  EXPECT_EQ(qwen25_vl::to_llama_cpp_name("model.embed_tokens.weight"), "token_embd.weight");
  EXPECT_EQ(qwen25_vl::to_llama_cpp_name("visual.blocks.0.attn.qkv.weight"), "");
}

TEST(Qwen25VLGguf, ConfigFromLlamaCppMetadata) {
  const qwen25_vl::Config c = qwen25_vl::config_from_llama_cpp(read_gguf_header(llama_f16()));
  const qwen25_vl::Config want = qwen25_vl::text_encoder_config(te_dir());
  EXPECT_EQ(c.text.to_json(), want.text.to_json());
  EXPECT_EQ(c.mrope_section, want.mrope_section);
  EXPECT_EQ(c.image_token_id, want.image_token_id);
  EXPECT_EQ(c.video_token_id, want.video_token_id);
  EXPECT_EQ(c.vision_start_token_id, want.vision_start_token_id);
  EXPECT_EQ(c.vision_end_token_id, want.vision_end_token_id);
  EXPECT_EQ(c.text.vocab_size, 2074);
  EXPECT_EQ(c.text.hidden_size, 32);
  EXPECT_EQ(c.mrope_section, (std::array<int64_t, 3>{1, 1, 2}));
}

TEST(Qwen25VLGguf, OneLayerSeedLoadsAndRuns) {
  // The fuzz seed (python/ref/dump_qwen25_vl_gguf.py one_layer): the whole path, token ids from
  // its six-token list.
  const qwen25_vl::TextModel m =
      qwen25_vl::TextModel::load(golden("qwen25_vl_gguf/one_layer.gguf"));
  EXPECT_EQ(m.config().text.num_hidden_layers, 1);
  EXPECT_EQ(m.config().text.vocab_size, 6);
  EXPECT_EQ(m.config().image_token_id, 1);
  EXPECT_EQ(m.config().vision_end_token_id, 4);
  Ctx ctx;
  const std::vector<int32_t> a = {0, 5, 3, 4, 5};
  const Tensor out = m.forward(ctx.ec, {.ids = a});
  EXPECT_EQ(out.shape(), (Shape{5, 8}));
  EXPECT_TRUE(std::isfinite(out.f32()[39]));
}

TEST(Qwen25VLGguf, LlamaCppFilesGiveTheFolderOutputs) {
  const Reference& ref = reference();
  test::TempDir tmp;
  // F32: the same weights, the same arithmetic.
  const std::string f32 = write_llama_f32(tmp.file("llama-f32.gguf"));
  const qwen25_vl::TextModel m32 = qwen25_vl::TextModel::load(f32);
  const Outputs o32 = run(m32, ref.vision);
  expect_bit_equal(o32.text, ref.out.text, "llama.cpp F32, text");
  expect_bit_equal(o32.image, ref.out.image, "llama.cpp F32, image prompt");
  // gguf-py's F16 file: the weights flowkv's F16 quantization writes, so the same outputs.
  const std::string q16 = tmp.file("flowkv-f16.gguf");
  quantize_checkpoint(te_dir(), q16, DType::kF16);
  const Outputs o16 = run(qwen25_vl::TextModel::load(llama_f16()), ref.vision);
  const Outputs f16 = run(qwen25_vl::TextModel::load(q16), ref.vision);
  expect_bit_equal(o16.text, f16.text, "llama.cpp F16 against flowkv's F16, text");
  expect_bit_equal(o16.image, f16.image, "llama.cpp F16 against flowkv's F16, image prompt");
  // Qwen2.5-VL-7B's files hold output.weight (untied embeddings): the LM head is not read.
  {
    LlamaFile f;
    const TensorToWrite embed = f.tensor("token_embd.weight");
    f.tensors.push_back({"output.weight", embed.dtype, embed.shape, embed.data});
    const std::string path = f.write(tmp.file("untied.gguf"));
    const qwen25_vl::TextModel m = qwen25_vl::TextModel::load(path);
    EXPECT_FALSE(m.config().tie_word_embeddings);
    expect_bit_equal(run(m, ref.vision).image, o16.image, "llama.cpp F16 with output.weight");
  }
  // Without a token list the ids come from the config.json beside the file.
  {
    LlamaFile f;
    f.erase_key("tokenizer.ggml.tokens");
    const fs::path d = tmp.path() / "no_tokens";
    fs::create_directories(d);
    fs::copy_file(te_dir() + "/config.json", d / "config.json");
    f.write((d / "te.gguf").string());
    expect_bit_equal(run(qwen25_vl::TextModel::load(d.string()), ref.vision).image, o16.image,
                     "llama.cpp F16 without tokens, beside config.json");
    expect_error([&] { qwen25_vl::TextModel::load((d / "te.gguf").string()); },
                 {"image_token_id 151655 is outside the vocabulary [0, 2074)"});
  }
  const test::ErrorStats e = stats(o16.image, ref.out.image);
  EXPECT_LE(e.rel(), 2.5e-3);
  std::printf("  llama.cpp F16 against f32: max rel error %.3g, NMSE %.3g\n", e.rel(), e.nmse());

  // In a text_encoder/ folder beside the pipeline's config.json: the same, and the prompt
  // encoder serves text to image but refuses pictures by name.
  const fs::path dir = tmp.path() / "text_encoder";
  fs::create_directories(dir);
  fs::copy_file(te_dir() + "/config.json", dir / "config.json");
  fs::copy_file(f32, dir / "qwen2.5-vl-f32.gguf");
  expect_bit_equal(run(qwen25_vl::TextModel::load(dir.string()), ref.vision).image, ref.out.image,
                   "llama.cpp F32 in a folder");
  Ctx ctx;
  const auto want = qwen25_vl::PromptEncoder::load(te_dir(), pipeline_dir("tokenizer"), "")
                        .encode(ctx.ec, "a red fox in the snow", {}, 512);
  for (const std::string& te : {dir.string(), f32}) {
    const auto got = qwen25_vl::PromptEncoder::load(te, pipeline_dir("tokenizer"), "")
                         .encode(ctx.ec, "a red fox in the snow", {}, 512);
    expect_bit_equal(got.embeds, want.embeds, "prompt encoder on " + te);
  }
  for (const std::string& te : {dir.string(), f32, llama_f16()}) {
    expect_error(
        [&] {
          qwen25_vl::PromptEncoder::load(te, pipeline_dir("tokenizer"), pipeline_dir("processor"));
        },
        {"the text encoder GGUF holds no vision tower", "mmproj", "Edit-Plus"});
    expect_error([&] { qwen25_vl::VisionTower::load(te); }, {"holds no vision tower"});
  }
  EXPECT_EQ(qwen25_vl::encoder_shape(f32).hidden_size, 32);
}

// ---- malformed files ----

TEST(Qwen25VLGgufBadInput, LlamaCppMapping) {
  test::TempDir tmp;
  int k = 0;
  auto bad = [&](const std::function<void(LlamaFile&)>& change,
                 std::initializer_list<std::string> fragments) {
    LlamaFile f;
    change(f);
    const std::string path = f.write(tmp.file("bad" + std::to_string(k++) + ".gguf"));
    expect_error([&] { qwen25_vl::open_text_encoder(path); }, fragments);
    expect_error([&] { qwen25_vl::TextModel::load(path); }, {path});
  };
  bad([](LlamaFile& f) { f.erase_tensor("blk.1.attn_k.bias"); },
      {"does not hold the Qwen2.5-VL language model", "missing: blk.1.attn_k.bias [16]"});
  bad(
      [](LlamaFile& f) {
        TensorToWrite& t = f.tensor("blk.2.ffn_up.weight");
        t.shape = {24, 32};
      },
      {"wrong shape: blk.2.ffn_up.weight is [24, 32], expected [48, 32]"});
  bad([](LlamaFile& f) { f.tensor("blk.0.attn_q.bias").name = "blk.0.attn_q_norm.weight"; },
      {"missing: blk.0.attn_q.bias", "unexpected: blk.0.attn_q_norm.weight"});
  bad([](LlamaFile& f) { f.set("general.architecture", GgufValue::string("llama")); },
      {"general.architecture is \"llama\"", "qwen2vl"});
  bad([](LlamaFile& f) { f.erase_key("qwen2vl.block_count"); }, {"qwen2vl.block_count is missing"});
  bad([](LlamaFile& f) { f.set("qwen2vl.block_count", GgufValue::u32(4)); },
      {"missing: blk.3.attn_q.weight"});
  bad([](LlamaFile& f) { f.set("qwen2vl.attention.head_count", GgufValue::string("4")); },
      {"qwen2vl.attention.head_count is STRING, expected an integer"});
  bad([](LlamaFile& f) { f.set("qwen2vl.embedding_length", GgufValue::u64(~uint64_t{0})); },
      {"qwen2vl.embedding_length", "outside [1, "});
  bad(
      [](LlamaFile& f) {
        f.set("qwen2vl.rope.dimension_sections", GgufValue::i32s({1, 1, 1, 0}));
      },
      {"mrope_section", "sums to 3"});
  bad(
      [](LlamaFile& f) {
        f.set("qwen2vl.rope.dimension_sections", GgufValue::i32s({1, 1, 1, 1}));
      },
      {"qwen2vl.rope.dimension_sections has a fourth section of 1"});
  bad([](LlamaFile& f) { f.set("qwen2vl.rope.freq_base", GgufValue::f32(-1)); },
      {"qwen2vl.rope.freq_base", "positive"});
  bad([](LlamaFile& f) { f.set("qwen2vl.attention.head_count_kv", GgufValue::u32(3)); },
      {"num_key_value_heads"});

  // A config.json beside the GGUF that describes another model.
  const fs::path dir = tmp.path() / "te";
  fs::create_directories(dir);
  Json cfg = read_json_file(te_dir() + "/config.json");
  cfg["text_config"]["num_key_value_heads"] = 4;
  test::write_file((dir / "config.json").string(), cfg.dump());
  fs::copy_file(llama_f16(), dir / "te.gguf");
  expect_error([&] { qwen25_vl::TextModel::load(dir.string()); },
               {"config.json does not describe the language model of", "te.gguf",
                "num_key_value_heads: 4", "2"});
  // Two GGUF files in the folder.
  fs::copy_file(llama_f16(), dir / "other.gguf");
  expect_error([&] { qwen25_vl::TextModel::load(dir.string()); }, {"2 GGUF files"});
}

TEST(Qwen25VLGgufBadInput, FoldedShapes) {
  test::TempDir tmp;
  std::vector<float> v(2 * 3 * 4 * 5 * 6 * 7);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i);
  // Six dimensions: stored [2*3*4, 5, 6, 7] and read back as written.
  write_gguf(tmp.file("six.gguf"), {}, {{"w", DType::kF32, {2, 3, 4, 5, 6, 7}, v.data()}});
  const GgufFile f = GgufFile::open(tmp.file("six.gguf"));
  ASSERT_EQ(f.header().tensors.size(), 1u);
  EXPECT_EQ(f.header().tensors[0].shape, (Shape{2, 3, 4, 5, 6, 7}));
  const Tensor t = f.view("w");
  EXPECT_EQ(t.shape(), (Shape{2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(t.f32()[v.size() - 1], static_cast<float>(v.size() - 1));
  expect_error(
      [&] {
        write_gguf(tmp.file("nine.gguf"), {},
                   {{"w", DType::kF32, {1, 1, 1, 1, 1, 1, 1, 1, 2}, v.data()}});
      },
      {"\"w\" has 9 dimensions (1 to 8)"});
  // Hostile keys: a shape of another element count, one that changes the rows, no such tensor,
  // too few sizes, not integers.
  const std::vector<TensorToWrite> four = {{"w", DType::kF32, {24, 5, 6, 7}, v.data()}};
  auto key = [](std::vector<int64_t> s) {
    GgufValue x;
    x.type = GgufType::kArray;
    x.array_type = GgufType::kI64;
    x.ai = std::move(s);
    return x;
  };
  int k = 0;
  auto bad = [&](GgufMetadata meta, std::initializer_list<std::string> fragments) {
    const std::string path = tmp.file("bad" + std::to_string(k++) + ".gguf");
    write_gguf(path, meta, four);
    expect_error([&] { read_gguf_header(path); }, fragments);
  };
  bad({{"flowkv.shape.w", key({2, 3, 4, 5, 6, 8})}},
      {"flowkv.shape.w", "[2, 3, 4, 5, 6, 8] does not fold to the stored [24, 5, 6, 7]"});
  bad({{"flowkv.shape.w", key({2, 3, 4, 6, 5, 7})}}, {"does not fold"});
  bad({{"flowkv.shape.v", key({2, 3, 4, 5, 6, 7})}}, {"flowkv.shape.v\" names no tensor"});
  bad({{"flowkv.shape.w", key({24, 5, 6, 7})}}, {"integer array of 5 to 8 sizes"});
  bad({{"flowkv.shape.w", key({2, 3, 4, 5, 6, -7})}}, {"size 5 is not a positive integer"});
  bad({{"flowkv.shape.w", GgufValue::strings({"2", "3", "4", "5", "6"})}},
      {"integer array of 5 to 8 sizes"});
}

}  // namespace
}  // namespace flowkv
