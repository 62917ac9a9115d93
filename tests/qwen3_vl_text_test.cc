// The Qwen3-VL language side (Qwen-Image 2.1's prompt encoder) against transformers and
// diffusers (tests/golden/qwen3_vl_text, python/ref/dump_qwen3_vl_text.py): the pipeline's
// template and the processor's ids, the 3-D positions of get_rope_index, the decoder's hidden
// states with the vision outputs scattered and deepstack-injected, the pipeline's prompt_embeds
// and image_pad_mask; the drop index of the released tokenizer; and bad input.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <vector>

#include "core/parallel.h"
#include "golden_util.h"
#include "io/json.h"
#include "models/qwen3_vl/config.h"
#include "models/qwen3_vl/prompt.h"
#include "models/qwen3_vl/text_model.h"
#include "temp_files.h"
#include "test_util.h"
#include "text/tokenizer.h"

namespace flowkv {
namespace {

using qwen3_vl::Grid;
using test::expect_error;
using test::golden;

// f32 tolerance, as tests/qwen3_test.cc: the two sides differ by f32 reduction order only.
constexpr double kF32Rel = 1e-5;
constexpr double kF32Nmse = 1e-10;

struct Ctx {
  Arena arena;
  ExecContext ec{&arena, KernelPath::kFast, nullptr};
};

// One dumped case: its tensors, prompt and grids.
struct Case {
  std::map<std::string, Tensor> t;
  std::string prompt;
  std::vector<Grid> grids;
  qwen3_vl::VisionOutputs vision;

  explicit Case(const std::string& name) {
    t = test::load_tensors(golden("qwen3_vl_text/" + name + ".safetensors"));
    const Json meta = read_json_file(golden("qwen3_vl_text/meta.json"));
    prompt = meta["cases"][name]["prompt"].get<std::string>();
    if (t.count("image_grid_thw")) {
      const Tensor& g = t.at("image_grid_thw");
      for (int64_t i = 0; i < g.dim(0); ++i) {
        grids.push_back({static_cast<int64_t>(g.f32()[3 * i]),
                         static_cast<int64_t>(g.f32()[3 * i + 1]),
                         static_cast<int64_t>(g.f32()[3 * i + 2])});
      }
      vision.embeds = t.at("image_embeds");
      for (int k = 0; t.count("deepstack." + std::to_string(k)); ++k) {
        vision.deepstack.push_back(t.at("deepstack." + std::to_string(k)));
      }
    }
  }
  std::vector<int64_t> ints(const std::string& name) const {
    const Tensor& x = t.at(name);
    std::vector<int64_t> v;
    for (int64_t i = 0; i < x.numel(); ++i) v.push_back(static_cast<int64_t>(x.f32()[i]));
    return v;
  }
  std::vector<int32_t> ids() const {
    std::vector<int32_t> v;
    for (int64_t x : ints("input_ids")) v.push_back(static_cast<int32_t>(x));
    return v;
  }
  const qwen3_vl::VisionOutputs* vis() const { return grids.empty() ? nullptr : &vision; }
};

const std::vector<std::string> kCases = {"t2i", "ti2i", "empty", "special"};

text::Tokenizer tiny_tokenizer() {
  return text::Tokenizer::from_json_file(golden("qwen3_vl_text/processor/tokenizer.json"));
}

const qwen3_vl::TextModel& model() {
  static const qwen3_vl::TextModel m =
      qwen3_vl::TextModel::load(golden("qwen3_vl_text/text_encoder"));
  return m;
}

void expect_close(const Tensor& got, const Tensor& ref, const std::string& what) {
  ASSERT_EQ(got.shape(), ref.shape()) << what;
  const test::ErrorStats e = test::compare(got.f32(), ref.f32(), ref.numel());
  EXPECT_LE(e.rel(), kF32Rel) << what << ": max abs error " << e.max_abs << ", max |ref| "
                              << e.max_ref;
  EXPECT_LE(e.nmse(), kF32Nmse) << what;
  std::printf("  %-22s max rel error %.3g, NMSE %.3g\n", what.c_str(), e.rel(), e.nmse());
}

TEST(Qwen3VLText, ReadsTheConfig) {
  const qwen3_vl::Config& c = model().config();
  EXPECT_EQ(c.text.hidden_size, 32);
  EXPECT_EQ(c.text.num_hidden_layers, 3);
  EXPECT_EQ(c.text.num_key_value_heads, 2);
  EXPECT_EQ(c.text.head_dim, 8);
  EXPECT_DOUBLE_EQ(c.text.rope_theta, 5000000.0);
  EXPECT_EQ(c.mrope_section, (std::array<int64_t, 3>{2, 1, 1}));
  EXPECT_EQ(c.image_token_id, 1036);
  EXPECT_EQ(c.video_token_id, 1037);
  EXPECT_EQ(c.vision_start_token_id, 1033);
  EXPECT_EQ(c.spatial_merge_size, 2);
  EXPECT_EQ(model().compute_dtype(), DType::kF32);
}

TEST(Qwen3VLText, PromptIdsMatchTheProcessor) {
  const auto tok = tiny_tokenizer();
  const Json meta = read_json_file(golden("qwen3_vl_text/meta.json"));
  EXPECT_EQ(qwen3_vl::drop_index(tok), meta["drop_idx"].get<int64_t>());
  EXPECT_EQ(qwen3_vl::system_text(), meta["system_text"].get<std::string>());
  for (const std::string& name : kCases) {
    SCOPED_TRACE(name);
    const Case c(name);
    const auto p = qwen3_vl::prompt_tokens(tok, model().config(), c.prompt, c.grids);
    EXPECT_EQ(p.ids, c.ids());
    EXPECT_EQ(p.drop_idx, meta["drop_idx"].get<int64_t>());
    const std::vector<int64_t> mask = c.ints("image_pad_mask");
    ASSERT_EQ(p.image_pad_mask.size(), mask.size());
    for (size_t i = 0; i < mask.size(); ++i) EXPECT_EQ(p.image_pad_mask[i], mask[i]) << i;
  }
}

TEST(Qwen3VLText, LiteralSpecialTokensAreMatchedAsTokens) {
  // "<|im_start|>", "<|vision_start|>", "<|endoftext|>" and "<think>" written in a prompt become
  // those tokens, as the reference tokenizes them (the "special" case's ids are the processor's).
  const auto tok = tiny_tokenizer();
  const Case c("special");
  const auto p = qwen3_vl::prompt_tokens(tok, model().config(), c.prompt, {});
  const std::vector<int32_t> user = tok.encode("<|im_start|>cat<|vision_start|>");
  ASSERT_GE(user.size(), 3u);
  EXPECT_EQ(user.front(), *tok.token_id("<|im_start|>"));
  EXPECT_EQ(user.back(), *tok.token_id("<|vision_start|>"));
  int64_t im_start = 0;
  for (int32_t id : p.ids) im_start += id == *tok.token_id("<|im_start|>");
  EXPECT_EQ(im_start, 4);  // system, user, the prompt's own, assistant
}

TEST(Qwen3VLText, PositionsMatchGetRopeIndex) {
  for (const std::string& name : kCases) {
    SCOPED_TRACE(name);
    const Case c(name);
    const std::vector<int32_t> ids = c.ids();
    EXPECT_EQ(qwen3_vl::rope_positions(model().config(), ids, c.grids), c.ints("position_ids"));
  }
}

TEST(Qwen3VLText, HiddenStatesMatchTransformers) {
  for (const std::string& name : kCases) {
    SCOPED_TRACE(name);
    const Case c(name);
    Ctx ctx;
    const std::vector<int32_t> ids = c.ids();
    qwen3_vl::TextTrace trace;
    const Tensor last =
        model().forward(ctx.ec, {.ids = ids, .grids = c.grids, .vision = c.vis()}, &trace);
    ASSERT_EQ(trace.layers.size(), 3u);
    expect_close(trace.layers[0], c.t.at("layer0"), name + ".layer0");
    expect_close(last, c.t.at("last_prenorm"), name + ".last_prenorm");
    if (!c.grids.empty()) {
      // layer 1's input is layer 0's output with deepstack feature 0 added at the image rows.
      EXPECT_FALSE(test::bit_equal(c.t.at("layer0").f32(), c.t.at("layer0_ds").f32(),
                                   c.t.at("layer0").numel()));
    }
  }
}

TEST(Qwen3VLText, TracerSeesTheDeepstackInjection) {
  const Case c("ti2i");
  test::CaptureTracer tracer;
  Arena arena;
  ExecContext ec{&arena, KernelPath::kFast, &tracer};
  const std::vector<int32_t> ids = c.ids();
  model().forward(ec, {.ids = ids, .grids = c.grids, .vision = c.vis()});
  // Two deepstack features: layers 0 and 1 have an injected state, layer 2 not.
  for (const char* name : {"inputs_embeds", "layers.0", "layers.0.deepstack", "layers.1",
                           "layers.1.deepstack", "layers.2"}) {
    EXPECT_TRUE(tracer.got.count(name)) << name;
  }
  EXPECT_FALSE(tracer.got.count("layers.2.deepstack"));
  expect_close(tracer.got.at("layers.0"), c.t.at("layer0"), "traced layers.0");
  expect_close(tracer.got.at("layers.0.deepstack"), c.t.at("layer0_ds"), "layers.0.deepstack");
  // The injection touches the image rows only.
  const Tensor& a = tracer.got.at("layers.0");
  const Tensor& b = tracer.got.at("layers.0.deepstack");
  for (int64_t i = 0; i < a.dim(0); ++i) {
    const bool image = ids[static_cast<size_t>(i)] == model().config().image_token_id;
    EXPECT_EQ(!test::bit_equal(a.f32() + i * 32, b.f32() + i * 32, 32), image) << i;
  }
}

TEST(Qwen3VLText, Bf16CheckpointComputesInBf16LikeThePipeline) {
  const Case c("ti2i_bf16");
  const Case f32("ti2i");
  const auto m = qwen3_vl::TextModel::load(golden("qwen3_vl_text/text_encoder_bf16"));
  EXPECT_EQ(m.compute_dtype(), DType::kBF16);
  EXPECT_LT(m.weight_bytes(), model().weight_bytes());
  Ctx ctx;
  const auto e = qwen3_vl::prompt_embeds(ctx.ec, m, tiny_tokenizer(), c.prompt, c.grids, c.vis());
  // bf16 activations against transformers' own bf16 run (what the pipeline computes) and
  // against the f32 run of the same weights; the output is bf16 values, as the pipeline's.
  const test::ErrorStats s16 =
      test::compare(e.embeds.f32(), c.t.at("prompt_embeds").f32(), e.embeds.numel());
  const test::ErrorStats s32 =
      test::compare(e.embeds.f32(), f32.t.at("prompt_embeds").f32(), e.embeds.numel());
  std::printf(
      "  bf16 vs bf16 reference: max rel %.3g, NMSE %.3g; vs f32: max rel %.3g, NMSE %.3g\n",
      s16.rel(), s16.nmse(), s32.rel(), s32.nmse());
  EXPECT_LE(s16.rel(), 0.05);
  EXPECT_LE(s16.nmse(), 2e-4);
  EXPECT_LE(s32.rel(), 0.05);
  EXPECT_LE(s32.nmse(), 5e-4);
  for (int64_t i = 0; i < e.embeds.numel(); ++i) {
    ASSERT_EQ(e.embeds.f32()[i], round_bf16(e.embeds.f32()[i])) << i;
  }
}

TEST(Qwen3VLText, PromptEmbedsMatchThePipeline) {
  const auto tok = tiny_tokenizer();
  for (const std::string& name : kCases) {
    SCOPED_TRACE(name);
    const Case c(name);
    Ctx ctx;
    const auto e = qwen3_vl::prompt_embeds(ctx.ec, model(), tok, c.prompt, c.grids, c.vis());
    expect_close(e.embeds, c.t.at("prompt_embeds"), name + ".prompt_embeds");
    const std::vector<int64_t> mask = c.ints("image_pad_mask");
    ASSERT_EQ(e.image_pad_mask.size(), mask.size());
    for (size_t i = 0; i < mask.size(); ++i) EXPECT_EQ(e.image_pad_mask[i], mask[i]) << i;
  }
}

TEST(Qwen3VLText, ReferenceKernelsAgreeWithFastKernels) {
  const Case c("ti2i");
  const std::vector<int32_t> ids = c.ids();
  const auto plain =
      qwen3_vl::TextModel::load(golden("qwen3_vl_text/text_encoder"), {.keep_plain = true});
  Ctx fast;
  Arena arena;
  ExecContext ref{&arena, KernelPath::kReference, nullptr};
  const Tensor a = plain.forward(fast.ec, {.ids = ids, .grids = c.grids, .vision = c.vis()});
  const Tensor b = plain.forward(ref, {.ids = ids, .grids = c.grids, .vision = c.vis()});
  expect_close(a, b, "fast vs reference");
}

TEST(Qwen3VLText, ThreadCountDoesNotChangeTheResult) {
  const Case c("ti2i");
  const std::vector<int32_t> ids = c.ids();
  auto run = [&](int threads) {
    Ctx ctx;
    set_num_threads(threads);
    Tensor t = model().forward(ctx.ec, {.ids = ids, .grids = c.grids, .vision = c.vis()});
    set_num_threads(0);
    return t;
  };
  const Tensor a = run(1), b = run(2);
  EXPECT_TRUE(test::bit_equal(a.f32(), b.f32(), a.numel()));
}

TEST(Qwen3VLText, RealTokenizerDropIndex) {
  // The released Qwen3 tokenizer (the one Qwen-Image 2.1's processor ships has the same
  // vocabulary and special tokens): the system message is 14 tokens.
  const auto tok =
      text::Tokenizer::from_json_file(std::string(FLOWKV_TOKENIZER_DIR) + "/tokenizer.json");
  const Json meta = read_json_file(golden("qwen3_vl_text/meta.json"));
  EXPECT_EQ(qwen3_vl::drop_index(tok), meta["drop_idx_real_tokenizer"].get<int64_t>());
  EXPECT_EQ(qwen3_vl::drop_index(tok), 14);
  const qwen3_vl::Config cfg;  // Qwen3VLConfig's default token ids are the real tokenizer's
  EXPECT_EQ(*tok.token_id("<|image_pad|>"), cfg.image_token_id);
  EXPECT_EQ(*tok.token_id("<|video_pad|>"), cfg.video_token_id);
  EXPECT_EQ(*tok.token_id("<|vision_start|>"), cfg.vision_start_token_id);
  EXPECT_EQ(*tok.token_id("<|vision_end|>"), cfg.vision_end_token_id);
}

TEST(Qwen3VLText, PromptErrors) {
  const auto tok = tiny_tokenizer();
  const qwen3_vl::Config& cfg = model().config();
  const std::vector<Grid> two = {Grid{1, 4, 8}, Grid{1, 6, 4}};
  // The processor refuses these (meta.json "refused" holds its messages).
  expect_error([&] { qwen3_vl::prompt_tokens(tok, cfg, "a <|image_pad|> b", {}); },
               {"<|image_pad|>", "1 placeholders for 0 image(s)"});
  expect_error([&] { qwen3_vl::prompt_tokens(tok, cfg, "a <|image_pad|> b", two); },
               {"<|image_pad|>", "3 placeholders for 2 image(s)"});
  expect_error([&] { qwen3_vl::prompt_tokens(tok, cfg, "a <|video_pad|>", {}); },
               {"<|video_pad|>"});
  const std::vector<Grid> zero = {Grid{1, 0, 4}};
  expect_error([&] { qwen3_vl::prompt_tokens(tok, cfg, "x", zero); }, {"image 1 grid (1, 0, 4)"});
  const std::vector<Grid> odd = {Grid{1, 4, 3}};
  expect_error([&] { qwen3_vl::prompt_tokens(tok, cfg, "x", odd); },
               {"image 1 grid (1, 4, 3)", "spatial merge size 2"});
  // A tokenizer whose <|image_pad|> is another id than the model's.
  qwen3_vl::Config other = cfg;
  other.image_token_id = 5;
  expect_error([&] { qwen3_vl::prompt_tokens(tok, other, "x", two); },
               {"image_token_id 5", "belong together"});
}

TEST(Qwen3VLText, ForwardErrors) {
  const Case c("ti2i");
  Ctx ctx;
  const std::vector<int32_t> ids = c.ids();
  const auto& m = model();
  const std::span<const Grid> one(c.grids.data(), 1);
  expect_error([&] { m.forward(ctx.ec, {.ids = ids, .grids = one, .vision = c.vis()}); },
               {"image placeholder run 2", "1 grid(s) given"});
  const std::vector<Grid> three = {c.grids[0], c.grids[1], c.grids[1]};
  expect_error([&] { m.forward(ctx.ec, {.ids = ids, .grids = three, .vision = c.vis()}); },
               {"3 image grid(s) given", "2 run(s)"});
  const std::vector<Grid> swapped = {c.grids[1], c.grids[0]};
  expect_error([&] { m.forward(ctx.ec, {.ids = ids, .grids = swapped, .vision = c.vis()}); },
               {"image 1 has 8 <|image_pad|> tokens", "makes 6"});
  const std::vector<Grid> odd = {Grid{1, 3, 8}, c.grids[1]};
  expect_error([&] { m.forward(ctx.ec, {.ids = ids, .grids = odd, .vision = c.vis()}); },
               {"not a multiple of the spatial merge size 2"});
  expect_error([&] { m.forward(ctx.ec, {.ids = ids, .grids = c.grids, .vision = nullptr}); },
               {"14 <|image_pad|> tokens but no vision outputs"});
  qwen3_vl::VisionOutputs bad = c.vision;
  bad.embeds = Tensor::empty({13, 32});
  expect_error([&] { m.forward(ctx.ec, {.ids = ids, .grids = c.grids, .vision = &bad}); },
               {"vision embeddings", "expected [14, 32]"});
  bad = c.vision;
  bad.deepstack[1] = Tensor::empty({14, 16});
  expect_error([&] { m.forward(ctx.ec, {.ids = ids, .grids = c.grids, .vision = &bad}); },
               {"deepstack feature 1", "expected [14, 32]"});
  const Case t("t2i");
  const std::vector<int32_t> text_ids = t.ids();
  expect_error([&] { m.forward(ctx.ec, {.ids = text_ids, .vision = &c.vision}); },
               {"vision outputs given", "no <|image_pad|>"});
  std::vector<int32_t> out_of_vocab = text_ids;
  out_of_vocab[3] = 1050;
  expect_error([&] { m.forward(ctx.ec, {.ids = out_of_vocab}); },
               {"token id 1050 at position 3", "[0, 1050)"});
  std::vector<int32_t> video = text_ids;
  video[2] = 1037;
  expect_error([&] { m.forward(ctx.ec, {.ids = video}); }, {"<|video_pad|>", "not supported"});
  expect_error([&] { m.forward(ctx.ec, {.ids = {}}); }, {"no token ids"});
}

TEST(Qwen3VLText, ReadsTheReleasedConfigLayout) {
  // The layout of Qwen's Qwen3-VL-8B-Instruct config.json (transformers 4.57: the RoPE dict in
  // text_config.rope_scaling, rope_theta beside it), shapes of the 8B model.
  const Json j = parse_json(R"({
    "architectures": ["Qwen3VLForConditionalGeneration"], "model_type": "qwen3_vl",
    "image_token_id": 151655, "video_token_id": 151656, "vision_start_token_id": 151652,
    "vision_end_token_id": 151653, "tie_word_embeddings": false,
    "text_config": {"model_type": "qwen3_vl_text", "vocab_size": 151936, "hidden_size": 4096,
      "intermediate_size": 12288, "num_hidden_layers": 36, "num_attention_heads": 32,
      "num_key_value_heads": 8, "head_dim": 128, "hidden_act": "silu", "attention_bias": false,
      "attention_dropout": 0.0, "max_position_embeddings": 262144, "rms_norm_eps": 1e-06,
      "rope_scaling": {"mrope_interleaved": true, "mrope_section": [24, 20, 20],
                       "rope_type": "default"},
      "rope_theta": 5000000, "dtype": "bfloat16", "use_cache": true},
    "vision_config": {"model_type": "qwen3_vl", "depth": 27, "hidden_size": 1152,
      "out_hidden_size": 4096, "spatial_merge_size": 2, "patch_size": 16,
      "deepstack_visual_indexes": [8, 16, 24]}})",
                            "released");
  const qwen3_vl::Config c = qwen3_vl::Config::from_json(j, "released");
  EXPECT_EQ(c.text.hidden_size, 4096);
  EXPECT_EQ(c.text.num_hidden_layers, 36);
  EXPECT_EQ(c.text.num_key_value_heads, 8);
  EXPECT_DOUBLE_EQ(c.text.rope_theta, 5000000.0);
  EXPECT_EQ(c.mrope_section, (std::array<int64_t, 3>{24, 20, 20}));
  EXPECT_EQ(c.image_token_id, 151655);
  EXPECT_EQ(c.spatial_merge_size, 2);
  EXPECT_EQ(c.text.dtype, "bfloat16");
  // Without any rope_theta, Qwen3VLTextConfig's default (500000), not Qwen3Config's.
  Json b = j;
  b["text_config"].erase("rope_theta");
  EXPECT_DOUBLE_EQ(qwen3_vl::Config::from_json(b, "no theta").text.rope_theta, 500000.0);
}

TEST(Qwen3VLText, ConfigAndCheckpointErrors) {
  const Json j = read_json_file(golden("qwen3_vl_text/text_encoder/config.json"));
  {
    Json b = j;
    b["model_type"] = "qwen2_5_vl";
    expect_error([&] { qwen3_vl::Config::from_json(b, "cfg"); }, {"cfg", "\"qwen3_vl\""});
  }
  {
    Json b = j;
    b["text_config"]["rope_parameters"]["mrope_section"] = {2, 1};
    expect_error([&] { qwen3_vl::Config::from_json(b, "cfg"); }, {"mrope_section", "3 sizes"});
    b["text_config"]["rope_parameters"]["mrope_section"] = {2, 1, 9};
    expect_error([&] { qwen3_vl::Config::from_json(b, "cfg"); }, {"mrope_section[2] is 9"});
  }
  {
    Json b = j;
    b["text_config"]["rope_parameters"]["rope_type"] = "yarn";
    expect_error([&] { qwen3_vl::Config::from_json(b, "cfg"); }, {"text_config", "yarn"});
  }
  {
    Json b = j;
    b["image_token_id"] = 5000;
    expect_error([&] { qwen3_vl::Config::from_json(b, "cfg"); },
                 {"image_token_id 5000", "outside the vocabulary"});
  }
  {
    Json b = j;
    b.erase("text_config");
    expect_error([&] { qwen3_vl::Config::from_json(b, "cfg"); }, {"text_config is missing"});
  }
  {
    // A config with one more layer than the file holds: the missing tensors are named.
    test::TempDir dir;
    Json b = j;
    b["text_config"]["num_hidden_layers"] = 4;
    test::write_file(dir.file("config.json"), b.dump());
    std::filesystem::create_symlink(
        std::filesystem::absolute(golden("qwen3_vl_text/text_encoder/model.safetensors")),
        dir.path() / "model.safetensors");
    expect_error([&] { qwen3_vl::TextModel::load(dir.path().string()); },
                 {"language model", "model.language_model.layers.3.self_attn.q_proj.weight"});
  }
}

TEST(Qwen3VLText, LoadsFromAPipelineFolder) {
  test::TempDir dir;
  std::filesystem::create_directory_symlink(
      std::filesystem::absolute(golden("qwen3_vl_text/text_encoder")), dir.path() / "text_encoder");
  test::write_file(dir.file("model_index.json"), "{}");
  const auto m = qwen3_vl::TextModel::load(dir.path().string());
  EXPECT_EQ(m.config().text.hidden_size, 32);
  EXPECT_EQ(m.weight_bytes(), model().weight_bytes());
}

}  // namespace
}  // namespace flowkv
