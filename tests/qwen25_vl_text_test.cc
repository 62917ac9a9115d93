// The Qwen2.5-VL language side (Qwen-Image's prompt encoder) against transformers and diffusers
// (tests/golden/qwen25_vl_text, python/ref/dump_qwen25_vl_text.py): the 3-D positions of
// get_rope_index, the decoder's hidden states with injected image embeddings, both config and
// tensor layouts, the T2I and Edit-Plus templates' ids and QwenImagePipeline /
// QwenImageEditPlusPipeline.encode_prompt; the drop indices against the released tokenizer; and
// bad input.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <functional>
#include <vector>

#include "core/parallel.h"
#include "golden_util.h"
#include "io/json.h"
#include "io/safetensors.h"
#include "models/qwen25_vl/config.h"
#include "models/qwen25_vl/prompt.h"
#include "models/qwen25_vl/text_model.h"
#include "models/qwen25_vl/weights.h"
#include "models/qwen3/weights.h"
#include "temp_files.h"
#include "test_util.h"
#include "text/tokenizer.h"

namespace flowkv {
namespace {

using qwen25_vl::Grid;
using test::expect_error;
using test::golden;

// f32: the two sides differ by reduction order only.
constexpr double kF32Rel = 1e-5;
constexpr double kF32Nmse = 1e-10;

struct Ctx {
  Arena arena;
  ExecContext ec{&arena, KernelPath::kFast, nullptr};
};

struct Case {
  std::map<std::string, Tensor> t;
  Json meta;
  std::vector<Grid> grids;

  explicit Case(const std::string& name) {
    t = test::load_tensors(golden("qwen25_vl_text/" + name + ".safetensors"));
    meta = read_json_file(golden("qwen25_vl_text/meta.json"))["cases"][name];
    if (t.count("image_grid_thw")) {
      const Tensor& g = t.at("image_grid_thw");
      for (int64_t i = 0; i < g.dim(0); ++i) {
        grids.push_back({static_cast<int64_t>(g.f32()[3 * i]),
                         static_cast<int64_t>(g.f32()[3 * i + 1]),
                         static_cast<int64_t>(g.f32()[3 * i + 2])});
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
  qwen25_vl::VisionEmbeds vision() const { return {t.at("image_embeds")}; }
};

const std::vector<std::string> kT2iCases = {"t2i_short", "t2i_empty", "t2i_long"};

text::Tokenizer tiny_tokenizer() {
  return text::Tokenizer::from_json_file(golden("qwen25_vl_text/tokenizer/tokenizer.json"));
}

const qwen25_vl::TextModel& model() {
  static const qwen25_vl::TextModel m =
      qwen25_vl::TextModel::load(golden("qwen25_vl_text/text_encoder"));
  return m;
}

void expect_close(const Tensor& got, const Tensor& ref, const std::string& what) {
  ASSERT_EQ(got.numel(), ref.numel()) << what;
  const test::ErrorStats e = test::compare(got.f32(), ref.f32(), ref.numel());
  EXPECT_LE(e.rel(), kF32Rel) << what << ": max abs error " << e.max_abs << ", max |ref| "
                              << e.max_ref;
  EXPECT_LE(e.nmse(), kF32Nmse) << what;
  std::printf("  %-26s max rel error %.3g, NMSE %.3g\n", what.c_str(), e.rel(), e.nmse());
}

TEST(Qwen25VLText, ReadsTheConfig) {
  const qwen25_vl::Config& c = model().config();
  EXPECT_EQ(c.text.hidden_size, 32);
  EXPECT_EQ(c.text.num_hidden_layers, 3);
  EXPECT_EQ(c.text.num_attention_heads, 4);
  EXPECT_EQ(c.text.num_key_value_heads, 2);
  EXPECT_EQ(c.text.head_dim, 8);
  EXPECT_EQ(c.text.vocab_size, 1050);
  EXPECT_TRUE(c.text.attention_bias);
  EXPECT_FALSE(c.text.qk_norm);
  EXPECT_DOUBLE_EQ(c.text.rope_theta, 1000000.0);
  EXPECT_DOUBLE_EQ(c.text.rms_norm_eps, 1e-6);
  EXPECT_EQ(c.mrope_section, (std::array<int64_t, 3>{1, 1, 2}));
  EXPECT_EQ(c.image_token_id, 1036);
  EXPECT_EQ(c.video_token_id, 1037);
  EXPECT_EQ(c.vision_start_token_id, 1033);
  EXPECT_EQ(c.vision_end_token_id, 1034);
  EXPECT_EQ(c.spatial_merge_size, 2);
  EXPECT_EQ(model().compute_dtype(), DType::kF32);
  EXPECT_EQ(model().layout(), qwen25_vl::Layout::kModel);
}

TEST(Qwen25VLText, BothConfigLayoutsReadTheSame) {
  // text_encoder/: transformers 5.24's (text_config nested); text_encoder_alt/: the flat 4.x
  // layout with rope_scaling {"type": "mrope"}.
  const auto path = [](const char* d) {
    return golden(std::string("qwen25_vl_text/") + d + "/config.json");
  };
  const Json nested = read_json_file(path("text_encoder"));
  const Json flat = read_json_file(path("text_encoder_alt"));
  ASSERT_TRUE(nested.contains("text_config"));
  ASSERT_FALSE(flat.contains("text_config"));
  const auto a = qwen25_vl::Config::from_json(nested, "nested");
  const auto b = qwen25_vl::Config::from_json(flat, "flat");
  EXPECT_EQ(a.text.to_json(), b.text.to_json());
  EXPECT_EQ(a.mrope_section, b.mrope_section);
  EXPECT_EQ(a.image_token_id, b.image_token_id);
  EXPECT_EQ(a.spatial_merge_size, b.spatial_merge_size);
}

TEST(Qwen25VLText, ReadsTheReleasedQwenImageConfig) {
  // The layout of Qwen-Image's text_encoder/config.json (Qwen2.5-VL-7B-Instruct, transformers
  // 4.x: flat, rope_scaling with type "mrope"), trimmed to the fields that matter.
  const Json j = parse_json(R"({
    "architectures": ["Qwen2_5_VLForConditionalGeneration"], "model_type": "qwen2_5_vl",
    "attention_dropout": 0.0, "bos_token_id": 151643, "eos_token_id": 151645,
    "hidden_act": "silu", "hidden_size": 3584, "image_token_id": 151655,
    "intermediate_size": 18944, "max_position_embeddings": 128000, "max_window_layers": 28,
    "num_attention_heads": 28, "num_hidden_layers": 28, "num_key_value_heads": 4,
    "rms_norm_eps": 1e-06, "rope_scaling": {"mrope_section": [16, 24, 24], "rope_type": "default",
    "type": "mrope"}, "rope_theta": 1000000.0, "sliding_window": 32768,
    "tie_word_embeddings": false, "torch_dtype": "bfloat16", "use_cache": true,
    "use_sliding_window": false, "video_token_id": 151656,
    "vision_config": {"depth": 32, "hidden_act": "silu", "hidden_size": 1280,
      "intermediate_size": 3420, "num_heads": 16, "in_chans": 3, "out_hidden_size": 3584,
      "patch_size": 14, "spatial_merge_size": 2, "spatial_patch_size": 14, "window_size": 112,
      "fullatt_block_indexes": [7, 15, 23, 31], "tokens_per_second": 2, "temporal_patch_size": 2},
    "vision_end_token_id": 151653, "vision_start_token_id": 151652, "vision_token_id": 151654,
    "vocab_size": 152064})",
                            "released");
  const auto c = qwen25_vl::Config::from_json(j, "released");
  EXPECT_EQ(c.text.hidden_size, 3584);
  EXPECT_EQ(c.text.head_dim, 128);
  EXPECT_EQ(c.text.num_key_value_heads, 4);
  EXPECT_EQ(c.text.intermediate_size, 18944);
  EXPECT_EQ(c.text.vocab_size, 152064);
  EXPECT_EQ(c.text.dtype, "bfloat16");
  EXPECT_EQ(c.mrope_section, (std::array<int64_t, 3>{16, 24, 24}));
  EXPECT_EQ(c.image_token_id, 151655);
  // "type": "mrope" alone (Qwen2.5-VL-7B-Instruct's own config) is the default RoPE too.
  Json b = j;
  b["rope_scaling"] = parse_json(R"({"type": "mrope", "mrope_section": [16, 24, 24]})", "rope");
  EXPECT_EQ(qwen25_vl::Config::from_json(b, "old").mrope_section, c.mrope_section);
  // The table: q/k/v biases, no q/k norms, no lm_head.
  const auto table = qwen25_vl::text_weight_table(c);
  EXPECT_EQ(table.size(), 2u + 28u * 12u + 0u);
  int64_t n = 0;
  for (const auto& e : table) {
    EXPECT_EQ(e.name.find("q_norm"), std::string::npos) << e.name;
    EXPECT_EQ(e.name.find("lm_head"), std::string::npos);
    n += shape_numel(e.shape);
  }
  // Qwen2.5-VL-7B's language model without lm_head: 7.07 B parameters.
  EXPECT_EQ(n, 7070619136);
}

TEST(Qwen25VLText, PositionsMatchGetRopeIndex) {
  const Case c("mm");
  EXPECT_EQ(qwen25_vl::rope_positions(model().config(), c.ids(), c.grids), c.ints("position_ids"));
  // Text only: 0..L-1 on every axis.
  const std::vector<int32_t> text = {1, 2, 3};
  EXPECT_EQ(qwen25_vl::rope_positions(model().config(), text, {}),
            (std::vector<int64_t>{0, 1, 2, 0, 1, 2, 0, 1, 2}));
}

TEST(Qwen25VLText, HiddenStatesMatchTransformers) {
  const Case c("mm");
  Ctx ctx;
  const std::vector<int32_t> ids = c.ids();
  const qwen25_vl::VisionEmbeds v = c.vision();
  qwen25_vl::TextTrace trace;
  const Tensor out = model().forward(ctx.ec, {.ids = ids, .grids = c.grids, .vision = &v}, &trace);
  ASSERT_EQ(trace.layers.size(), 3u);
  for (int k = 0; k < 3; ++k) {
    expect_close(trace.layers[k], c.t.at("layer." + std::to_string(k)),
                 "mm.layer." + std::to_string(k));
  }
  expect_close(out, c.t.at("final"), "mm.final");
  // The other tensor layout (model.language_model.*) and config layout: the same numbers.
  const auto alt = qwen25_vl::TextModel::load(golden("qwen25_vl_text/text_encoder_alt"));
  EXPECT_EQ(alt.layout(), qwen25_vl::Layout::kLanguageModel);
  const Tensor b = alt.forward(ctx.ec, {.ids = ids, .grids = c.grids, .vision = &v});
  EXPECT_TRUE(test::bit_equal(out.f32(), b.f32(), out.numel()));
}

TEST(Qwen25VLText, TracerSeesTheLayers) {
  const Case c("mm");
  test::CaptureTracer tracer;
  Arena arena;
  ExecContext ec{&arena, KernelPath::kFast, &tracer};
  const std::vector<int32_t> ids = c.ids();
  const qwen25_vl::VisionEmbeds v = c.vision();
  const Tensor out = model().forward(ec, {.ids = ids, .grids = c.grids, .vision = &v});
  for (const char* name : {"inputs_embeds", "layers.0", "layers.1", "layers.2", "norm"}) {
    EXPECT_TRUE(tracer.got.count(name)) << name;
  }
  EXPECT_TRUE(test::bit_equal(tracer.got.at("norm").f32(), out.f32(), out.numel()));
  // The image rows of inputs_embeds are the given embeddings, in order.
  const Tensor& e = tracer.got.at("inputs_embeds");
  int64_t k = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] != model().config().image_token_id) continue;
    EXPECT_TRUE(test::bit_equal(e.f32() + i * 32, v.embeds.f32() + k * 32, 32)) << i;
    ++k;
  }
  EXPECT_EQ(k, v.embeds.dim(0));
}

TEST(Qwen25VLText, TextToImagePromptIdsMatchTheTokenizer) {
  const auto tok = tiny_tokenizer();
  for (const std::string& name : kT2iCases) {
    SCOPED_TRACE(name);
    const Case c(name);
    const auto p = qwen25_vl::prompt_tokens(tok, qwen25_vl::Template::kTextToImage,
                                            c.meta["prompt"].get<std::string>(), {}, 2);
    EXPECT_EQ(p.ids, c.ids());
    EXPECT_EQ(p.drop, 34);
    EXPECT_EQ(p.truncated, name == "t2i_long");
  }
  EXPECT_EQ(Case("t2i_long").ids().size(), 1024u + 34u);
}

TEST(Qwen25VLText, TextToImageMatchesThePipeline) {
  const auto tok = tiny_tokenizer();
  for (const std::string& name : kT2iCases) {
    SCOPED_TRACE(name);
    const Case c(name);
    const auto p = qwen25_vl::prompt_tokens(tok, qwen25_vl::Template::kTextToImage,
                                            c.meta["prompt"].get<std::string>(), {}, 2);
    Ctx ctx;
    const Tensor e = qwen25_vl::encode_prompt(ctx.ec, model(), p, nullptr, 512);
    const Tensor& ref = c.t.at("prompt_embeds");
    ASSERT_EQ(e.shape(), (Shape{1, ref.dim(0), 32}));
    expect_close(e, ref, name + ".prompt_embeds");
    // The whole sequence, before the drop and the cut (not dumped for the long prompt).
    if (!c.t.count("hidden")) continue;
    const Tensor h =
        model().forward(ctx.ec, {.ids = p.ids, .positions = qwen25_vl::Positions::kSequential});
    expect_close(h, c.t.at("hidden"), name + ".hidden");
  }
  EXPECT_EQ(Case("t2i_long").t.at("prompt_embeds").dim(0), 512);  // the cut bit
}

TEST(Qwen25VLText, EditPlusMatchesThePipeline) {
  const auto tok = tiny_tokenizer();
  const Case c("edit");
  const auto p = qwen25_vl::prompt_tokens(tok, qwen25_vl::Template::kEditPlus,
                                          c.meta["prompt"].get<std::string>(), c.grids, 2);
  EXPECT_EQ(p.ids, c.ids());
  EXPECT_EQ(p.drop, 64);
  EXPECT_EQ(p.image_tokens, c.t.at("image_embeds").dim(0));
  const qwen25_vl::VisionEmbeds v = c.vision();
  Ctx ctx;
  // diffusers 0.42.1 over transformers 5.24: positions 0..L-1.
  const Tensor seq =
      qwen25_vl::encode_prompt(ctx.ec, model(), p, &v, 0, qwen25_vl::Positions::kSequential);
  expect_close(seq, c.t.at("prompt_embeds"), "edit.prompt_embeds (5.24)");
  // get_rope_index's 3-D positions (transformers 4.x; the default).
  const Tensor mrope = qwen25_vl::encode_prompt(ctx.ec, model(), p, &v, 0);
  expect_close(mrope, c.t.at("prompt_embeds_mrope"), "edit.prompt_embeds (mrope)");
}

// bf16 activations against transformers' own bf16 run (what the pipelines compute) and against
// the f32 run of the same weights; the output is bf16 values, as the pipelines'.
void expect_bf16_close(const Tensor& got, const Tensor& ref16, const Tensor& ref32,
                       const std::string& what) {
  ASSERT_EQ(got.numel(), ref16.numel()) << what;
  const test::ErrorStats s16 = test::compare(got.f32(), ref16.f32(), got.numel());
  const test::ErrorStats s32 = test::compare(got.f32(), ref32.f32(), got.numel());
  std::printf(
      "  %s bf16 vs bf16 reference: max rel %.3g, NMSE %.3g; vs f32: max rel %.3g, "
      "NMSE %.3g\n",
      what.c_str(), s16.rel(), s16.nmse(), s32.rel(), s32.nmse());
  EXPECT_LE(s16.rel(), 0.05) << what;
  EXPECT_LE(s16.nmse(), 2e-4) << what;
  EXPECT_LE(s32.rel(), 0.05) << what;
  EXPECT_LE(s32.nmse(), 5e-4) << what;
  for (int64_t i = 0; i < got.numel(); ++i) {
    ASSERT_EQ(got.f32()[i], round_bf16(got.f32()[i])) << what << " " << i;
  }
}

TEST(Qwen25VLText, Bf16CheckpointComputesInBf16LikeThePipelines) {
  const auto m = qwen25_vl::TextModel::load(golden("qwen25_vl_text/text_encoder_bf16"));
  EXPECT_EQ(m.compute_dtype(), DType::kBF16);
  EXPECT_LT(m.weight_bytes(), model().weight_bytes());
  const auto tok = tiny_tokenizer();
  Ctx ctx;
  {
    const Case c("t2i_short_bf16"), f32("t2i_short");
    const auto p = qwen25_vl::prompt_tokens(tok, qwen25_vl::Template::kTextToImage,
                                            c.meta["prompt"].get<std::string>(), {}, 2);
    const Tensor e = qwen25_vl::encode_prompt(ctx.ec, m, p, nullptr, 512);
    expect_bf16_close(e, c.t.at("prompt_embeds"), f32.t.at("prompt_embeds"), "t2i");
  }
  {
    // The vision tower's bf16 output, as the pipeline fed it.
    const Case c("edit_bf16"), f32("edit");
    const auto p = qwen25_vl::prompt_tokens(tok, qwen25_vl::Template::kEditPlus,
                                            c.meta["prompt"].get<std::string>(), c.grids, 2);
    const qwen25_vl::VisionEmbeds v = c.vision();
    const Tensor seq =
        qwen25_vl::encode_prompt(ctx.ec, m, p, &v, 0, qwen25_vl::Positions::kSequential);
    expect_bf16_close(seq, c.t.at("prompt_embeds"), f32.t.at("prompt_embeds"), "edit");
    const Tensor mrope = qwen25_vl::encode_prompt(ctx.ec, m, p, &v, 0);
    expect_bf16_close(mrope, c.t.at("prompt_embeds_mrope"), f32.t.at("prompt_embeds_mrope"),
                      "edit mrope");
  }
}

TEST(Qwen25VLText, RealTokenizerDropIndices) {
  // The released tokenizer: the template's text before the prompt is the pipelines' drop index.
  const auto tok =
      text::Tokenizer::from_json_file(std::string(FLOWKV_TOKENIZER_DIR) + "/tokenizer.json");
  for (auto t : {qwen25_vl::Template::kTextToImage, qwen25_vl::Template::kEditPlus}) {
    const std::string full = qwen25_vl::template_text(t, "", 0);
    const std::string head = full.substr(0, full.find("<|im_start|>user\n") + 17);
    EXPECT_EQ(static_cast<int64_t>(tok.encode(head).size()), qwen25_vl::drop_index(t));
  }
  const Json meta = read_json_file(golden("qwen25_vl_text/meta.json"));
  EXPECT_EQ(meta["t2i_template_head_tokens_real"].get<int64_t>(), 34);
  EXPECT_EQ(meta["edit_template_head_tokens_real"].get<int64_t>(), 64);
  const qwen25_vl::Config cfg;  // Qwen2_5_VLConfig's default token ids are the real tokenizer's
  EXPECT_EQ(*tok.token_id("<|image_pad|>"), cfg.image_token_id);
  EXPECT_EQ(*tok.token_id("<|vision_start|>"), cfg.vision_start_token_id);
}

TEST(Qwen25VLText, PromptErrors) {
  const auto tok = tiny_tokenizer();
  using qwen25_vl::Template;
  const std::vector<Grid> two = {Grid{1, 6, 4}, Grid{1, 4, 8}};
  expect_error([&] { qwen25_vl::prompt_tokens(tok, Template::kTextToImage, "x", two, 2); },
               {"text-to-image template takes no images"});
  expect_error(
      [&] { qwen25_vl::prompt_tokens(tok, Template::kEditPlus, "a <|image_pad|>", two, 2); },
      {"<|image_pad|>", "3 placeholders for 2 image(s)"});
  expect_error(
      [&] { qwen25_vl::prompt_tokens(tok, Template::kEditPlus, "a <|video_pad|>", {}, 2); },
      {"<|video_pad|>"});
  const std::vector<Grid> odd = {Grid{1, 4, 3}};
  expect_error([&] { qwen25_vl::prompt_tokens(tok, Template::kEditPlus, "x", odd, 2); },
               {"image 1 grid (1, 4, 3)", "spatial merge size 2"});
  // A literal <|image_pad|> in a T2I prompt is only a token (the tokenizer-only pipeline).
  const auto p = qwen25_vl::prompt_tokens(tok, Template::kTextToImage, "a <|image_pad|>", {}, 2);
  EXPECT_EQ(p.image_tokens, 1);
  Ctx ctx;
  EXPECT_EQ(qwen25_vl::encode_prompt(ctx.ec, model(), p, nullptr, 512).dim(1),
            static_cast<int64_t>(p.ids.size()) - 34);
  // Edit-Plus: images without vision embeddings.
  const Case c("edit");
  const auto e = qwen25_vl::prompt_tokens(tok, Template::kEditPlus, "x", c.grids, 2);
  expect_error([&] { qwen25_vl::encode_prompt(ctx.ec, model(), e, nullptr, 0); },
               {"2 image(s)", "no vision embeddings"});
}

TEST(Qwen25VLText, ForwardErrors) {
  const Case c("mm");
  const auto& m = model();
  Ctx ctx;
  const std::vector<int32_t> ids = c.ids();
  const qwen25_vl::VisionEmbeds v = c.vision();
  const std::vector<Grid> one = {c.grids[0]};
  expect_error([&] { m.forward(ctx.ec, {.ids = ids, .grids = one, .vision = &v}); },
               {"placeholder run 2", "no image grid"});
  const std::vector<Grid> swapped = {c.grids[1], c.grids[0]};
  expect_error([&] { m.forward(ctx.ec, {.ids = ids, .grids = swapped, .vision = &v}); },
               {"image 1 has 6 <|image_pad|> tokens", "makes 12"});
  qwen25_vl::VisionEmbeds bad{Tensor::zeros({5, 32})};
  expect_error([&] { m.forward(ctx.ec, {.ids = ids, .grids = c.grids, .vision = &bad}); },
               {"vision embeddings have shape [5, 32]", "expected [18, 32]"});
  const std::vector<int32_t> text_ids = {1, 2, 3};
  expect_error([&] { m.forward(ctx.ec, {.ids = text_ids, .vision = &v}); },
               {"no <|image_pad|> token"});
  const std::vector<int32_t> out_of_vocab = {1, 5000};
  expect_error([&] { m.forward(ctx.ec, {.ids = out_of_vocab}); },
               {"token id 5000", "outside the vocabulary"});
  const std::vector<int32_t> video = {1, 1037};
  expect_error([&] { m.forward(ctx.ec, {.ids = video}); }, {"<|video_pad|>", "not supported"});
  expect_error([&] { m.forward(ctx.ec, {.ids = {}}); }, {"no token ids"});
}

TEST(Qwen25VLText, ConfigErrors) {
  const Json j = read_json_file(golden("qwen25_vl_text/text_encoder/config.json"));
  auto bad = [&](const std::function<void(Json&)>& edit, std::initializer_list<std::string> words) {
    Json b = j;
    edit(b);
    expect_error([&] { qwen25_vl::Config::from_json(b, "cfg"); }, words);
  };
  bad([](Json& b) { b["model_type"] = "qwen3_vl"; }, {"cfg", "\"qwen2_5_vl\""});
  bad(
      [](Json& b) {
        b["text_config"]["rope_parameters"]["mrope_section"] = {1, 1};
      },
      {"mrope_section", "3 sizes"});
  bad(
      [](Json& b) {
        b["text_config"]["rope_parameters"]["mrope_section"] = {1, 1, 1};
      },
      {"mrope_section [1, 1, 1] sums to 3", "head_dim / 2 = 4"});
  bad([](Json& b) { b["text_config"]["rope_parameters"]["rope_type"] = "yarn"; },
      {"text_config", "yarn"});
  bad([](Json& b) { b["text_config"]["head_dim"] = 16; }, {"head_dim differs", "8"});
  bad([](Json& b) { b["text_config"]["hidden_size"] = 30; }, {"not a multiple"});
  bad([](Json& b) { b["text_config"]["hidden_act"] = "gelu"; }, {"hidden_act"});
  bad([](Json& b) { b["image_token_id"] = 5000; },
      {"image_token_id 5000", "outside the vocabulary"});
  bad(
      [](Json& b) {
        b["text_config"]["use_sliding_window"] = true;
        b["text_config"]["sliding_window"] = 16;
        b["text_config"].erase("layer_types");
        b["text_config"]["max_window_layers"] = 1;
      },
      {"sliding"});
  // Missing fields take Qwen2_5_VLTextConfig's defaults.
  Json b = j;
  b["text_config"].erase("rms_norm_eps");
  EXPECT_DOUBLE_EQ(qwen25_vl::Config::from_json(b, "defaults").text.rms_norm_eps, 1e-5);
}

// A copy of the golden checkpoint's tensors with `edit` applied to the list, beside its config.
void write_checkpoint(const test::TempDir& dir,
                      const std::function<void(std::vector<TensorToWrite>&)>& edit) {
  const std::string src = golden("qwen25_vl_text/text_encoder");
  std::filesystem::copy_file(src + "/config.json", dir.file("config.json"));
  const auto ts = test::load_tensors(src + "/model.safetensors");
  std::vector<TensorToWrite> out;
  for (const auto& [name, t] : ts) out.push_back({name, DType::kF32, t.shape(), t.f32()});
  edit(out);
  write_safetensors(dir.file("model.safetensors"), out);
}

TEST(Qwen25VLText, CheckpointErrorsComeBeforeAllocation) {
  const qwen3::LayerW q_bias = qwen3::LayerW::kQBias;
  const std::string name = qwen3::weight_name(1, q_bias, "model.");
  {
    test::TempDir dir;
    write_checkpoint(dir, [&](auto& v) {
      std::erase_if(v, [&](const TensorToWrite& t) { return t.name == name; });
    });
    expect_error([&] { qwen25_vl::TextModel::load(dir.path().string()); },
                 {"language model", "missing: " + name});
  }
  {
    // A huge wrong shape: refused from the header, nothing read or allocated.
    test::TempDir dir;
    write_checkpoint(dir, [&](auto& v) {
      for (TensorToWrite& t : v) {
        if (t.name == "model.embed_tokens.weight") t = {t.name, DType::kF32, {4096, 4096}};
      }
    });
    expect_error([&] { qwen25_vl::TextModel::load(dir.path().string()); },
                 {"wrong shape: model.embed_tokens.weight is [4096, 4096]", "[1050, 32]"});
  }
}

TEST(Qwen25VLText, ThreadCountDoesNotChangeTheResult) {
  const Case c("mm");
  const std::vector<int32_t> ids = c.ids();
  const qwen25_vl::VisionEmbeds v = c.vision();
  auto run = [&](int threads) {
    Ctx ctx;
    set_num_threads(threads);
    Tensor t = model().forward(ctx.ec, {.ids = ids, .grids = c.grids, .vision = &v});
    set_num_threads(0);
    return t;
  };
  const Tensor a = run(1), b = run(2);
  EXPECT_TRUE(test::bit_equal(a.f32(), b.f32(), a.numel()));
}

TEST(Qwen25VLText, ReferenceKernelsAgreeWithFastKernels) {
  const Case c("mm");
  const std::vector<int32_t> ids = c.ids();
  const qwen25_vl::VisionEmbeds v = c.vision();
  const auto plain =
      qwen25_vl::TextModel::load(golden("qwen25_vl_text/text_encoder"), {.keep_plain = true});
  Ctx fast;
  Arena arena;
  ExecContext ref{&arena, KernelPath::kReference, nullptr};
  const Tensor a = plain.forward(fast.ec, {.ids = ids, .grids = c.grids, .vision = &v});
  const Tensor b = plain.forward(ref, {.ids = ids, .grids = c.grids, .vision = &v});
  expect_close(a, b, "fast vs reference");
}

}  // namespace
}  // namespace flowkv
