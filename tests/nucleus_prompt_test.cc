// NucleusMoE-Image's prompt encoder against diffusers' NucleusMoEImagePipeline.encode_prompt
// (tests/golden/nucleus_prompt, python/ref/dump_nucleus_prompt.py): the chat-templated text, the
// processor's ids and attention mask (right and left padding and truncation, padding to a
// multiple of 8), hidden_states[return_index] over the padded rows, the mask (None when all
// ones), the row count without a model, and bad input.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "golden_util.h"
#include "io/json.h"
#include "models/qwen3_vl/nucleus_prompt.h"
#include "models/qwen3_vl/text_model.h"
#include "temp_files.h"
#include "test_util.h"
#include "text/tokenizer.h"

namespace flowkv {
namespace {

using test::expect_error;
using test::golden;

// f32 tolerance, as tests/qwen3_vl_text_test.cc: the two sides differ by reduction order only.
constexpr double kF32Rel = 1e-5;

struct Ctx {
  Arena arena;
  ExecContext ec{&arena, KernelPath::kFast, nullptr};
};

const Json& meta() {
  static const Json m = read_json_file(golden("nucleus_prompt/meta.json"));
  return m;
}

const qwen3_vl::NucleusPromptEncoder& encoder(const std::string& proc) {
  static const qwen3_vl::NucleusPromptEncoder right = qwen3_vl::NucleusPromptEncoder::load(
      golden("nucleus_prompt/text_encoder"), golden("nucleus_prompt/processor"));
  static const qwen3_vl::NucleusPromptEncoder left = qwen3_vl::NucleusPromptEncoder::load(
      golden("nucleus_prompt/text_encoder"), golden("nucleus_prompt/processor_left"));
  return proc == "processor" ? right : left;
}

struct Case {
  std::string name, prompt, proc, text;
  int64_t max_length = 0, return_index = 0;
  std::map<std::string, Tensor> t;
  explicit Case(const std::string& n) : name(n) {
    const Json& c = meta()["cases"][n];
    prompt = c["prompt"].get<std::string>();
    proc = c["processor"].get<std::string>();
    text = c["text"].get<std::string>();
    max_length = c["max_sequence_length"].get<int64_t>();
    return_index = c["return_index"].get<int64_t>();
    t = test::load_tensors(golden("nucleus_prompt/" + n + ".safetensors"));
  }
  template <class T>
  std::vector<T> ints(const std::string& key) const {
    const Tensor& x = t.at(key);
    std::vector<T> v;
    for (int64_t i = 0; i < x.numel(); ++i) v.push_back(static_cast<T>(x.f32()[i]));
    return v;
  }
};

std::vector<std::string> case_names() {
  std::vector<std::string> v;
  for (const auto& [k, _] : meta()["cases"].items()) v.push_back(k);
  return v;
}

TEST(NucleusPrompt, TemplateTextMatchesTheChatTemplate) {
  EXPECT_EQ(meta()["system_prompt"].get<std::string>(), qwen3_vl::kNucleusSystemPrompt);
  for (const std::string& n : case_names()) {
    const Case c(n);
    EXPECT_EQ(qwen3_vl::nucleus_prompt_text(c.prompt), c.text) << n;
  }
}

TEST(NucleusPrompt, PaddingConfigIsRead) {
  const auto& r = encoder("processor").padding();
  const auto& l = encoder("processor_left").padding();
  EXPECT_FALSE(r.pad_left);
  EXPECT_FALSE(r.truncate_left);
  EXPECT_TRUE(l.pad_left);
  EXPECT_TRUE(l.truncate_left);
  EXPECT_EQ(r.pad_id, meta()["pad_token_id"].get<int32_t>());
  EXPECT_EQ(l.pad_id, r.pad_id);
}

TEST(NucleusPrompt, IdsAndMaskMatchTheProcessor) {
  for (const std::string& n : case_names()) {
    SCOPED_TRACE(n);
    const Case c(n);
    const auto& e = encoder(c.proc);
    const auto tok =
        qwen3_vl::nucleus_prompt_tokens(e.tokenizer(), e.padding(), c.prompt, c.max_length);
    EXPECT_EQ(tok.ids, c.ints<int32_t>("input_ids"));
    EXPECT_EQ(tok.mask, c.ints<uint8_t>("attention_mask"));
    EXPECT_EQ(tok.untruncated, meta()["cases"][n]["untruncated_tokens"].get<int64_t>());
    EXPECT_EQ(tok.truncated, tok.untruncated > c.max_length);
    EXPECT_EQ(static_cast<int64_t>(tok.ids.size()) % 8, 0);
    EXPECT_EQ(
        qwen3_vl::nucleus_prompt_rows(golden("nucleus_prompt/" + c.proc), c.prompt, c.max_length),
        static_cast<int64_t>(tok.ids.size()));
  }
}

TEST(NucleusPrompt, EmbeddingsMatchEncodePrompt) {
  for (const std::string& n : case_names()) {
    SCOPED_TRACE(n);
    const Case c(n);
    Ctx ctx;
    const auto got = encoder(c.proc).encode(ctx.ec, c.prompt, c.max_length, c.return_index);
    const Tensor& ref = c.t.at("prompt_embeds");
    ASSERT_EQ(got.embeds.shape(), ref.shape());
    const test::ErrorStats s = test::compare(got.embeds.f32(), ref.f32(), ref.numel());
    EXPECT_LE(s.rel(), kF32Rel) << "max abs " << s.max_abs << ", max |ref| " << s.max_ref;
    std::printf("  %-12s L=%3lld  max rel error %.3g\n", n.c_str(),
                static_cast<long long>(ref.dim(1)), s.rel());
    if (c.t.count("mask")) {
      EXPECT_EQ(got.mask, c.ints<uint8_t>("mask"));
    } else {
      EXPECT_TRUE(got.mask.empty());
    }
  }
}

TEST(NucleusPrompt, CasesCoverWhatTheyClaim) {
  // The dump's cases exercise padding, no padding, truncation on both sides and the empty prompt.
  EXPECT_TRUE(meta()["cases"]["whole"]["mask_none"].get<bool>());
  EXPECT_FALSE(meta()["cases"]["short"]["mask_none"].get<bool>());
  EXPECT_EQ(meta()["cases"]["trunc"]["tokens"].get<int64_t>(), 16);
  EXPECT_TRUE(meta()["hidden_states_last_is_normed"].get<bool>());
  const Case l("left_short"), r("short");
  EXPECT_EQ(l.ints<int32_t>("attention_mask").front(), 0);
  EXPECT_EQ(r.ints<int32_t>("attention_mask").back(), 0);
}

TEST(NucleusPrompt, PipelineFolderGivesThePipelinesBranches) {
  // tests/golden/nucleus_pipeline (dump_nucleus_pipeline.py): the prompt and the default
  // negative prompt "" as NucleusMoEImagePipeline.__call__ encoded them for the cfg case.
  const Json m = read_json_file(golden("nucleus_pipeline/meta.json"));
  const auto st = test::load_tensors(golden("nucleus_pipeline/cfg/stages.safetensors"));
  const auto enc =
      qwen3_vl::NucleusPromptEncoder::load(golden("nucleus_pipeline/pipeline/text_encoder"),
                                           golden("nucleus_pipeline/pipeline/processor"));
  for (const std::string branch : {"prompt", "negative"}) {
    SCOPED_TRACE(branch);
    const std::string prompt = branch == "prompt" ? m["prompt"].get<std::string>() : "";
    Ctx ctx;
    const auto got = enc.encode(ctx.ec, prompt);
    const Tensor& ref = st.at(branch + "_embeds");
    ASSERT_EQ(got.embeds.shape(), ref.shape());
    const test::ErrorStats s = test::compare(got.embeds.f32(), ref.f32(), ref.numel());
    EXPECT_LE(s.rel(), kF32Rel);
    std::printf("  pipeline %-8s L=%3lld  max rel error %.3g\n", branch.c_str(),
                static_cast<long long>(ref.dim(1)), s.rel());
    const auto tok = qwen3_vl::nucleus_prompt_tokens(enc.tokenizer(), enc.padding(), prompt);
    const Tensor& ids = st.at(branch + "_ids");
    ASSERT_EQ(static_cast<int64_t>(tok.ids.size()), ids.numel());
    for (int64_t i = 0; i < ids.numel(); ++i)
      EXPECT_EQ(tok.ids[i], static_cast<int32_t>(ids.f32()[i]));
    ASSERT_EQ(st.count(branch + "_mask") == 1, !got.mask.empty());
    if (!got.mask.empty()) {
      const Tensor& mask = st.at(branch + "_mask");
      for (int64_t i = 0; i < mask.numel(); ++i) EXPECT_EQ(got.mask[i], mask.f32()[i]);
    }
  }
}

TEST(NucleusPrompt, BadInputIsRefused) {
  const auto& e = encoder("processor");
  // The reference refuses a max_length that is not a multiple of 8 (meta "refused").
  EXPECT_EQ(meta()["refused"]["max_sequence_length"].get<int64_t>(), 13);
  expect_error([&] { qwen3_vl::nucleus_prompt_tokens(e.tokenizer(), e.padding(), "a", 13); },
               {"max_sequence_length 13", "multiple of 8"});
  expect_error([&] { qwen3_vl::nucleus_prompt_tokens(e.tokenizer(), e.padding(), "a", 0); },
               {"multiple of 8"});
  expect_error(
      [&] { qwen3_vl::nucleus_prompt_tokens(e.tokenizer(), e.padding(), "a <|image_pad|>"); },
      {"<|image_pad|>"});
  expect_error(
      [&] { qwen3_vl::nucleus_prompt_tokens(e.tokenizer(), e.padding(), "a <|video_pad|>"); },
      {"<|video_pad|>"});
  Ctx ctx;
  expect_error([&] { e.encode(ctx.ec, "a", 1024, 11); }, {"outside [-11, 10]"});
  expect_error([&] { e.encode(ctx.ec, "a", 1024, -12); }, {"outside [-11, 10]"});
}

}  // namespace
}  // namespace flowkv
