// The Qwen3 text encoder against transformers (tests/golden/qwen3, python/ref/dump_qwen3.py):
// every hidden state of a tiny random Qwen3ForCausalLM on right-padded ids with a mask, the
// Klein stacking, bf16 weights, thread-count independence, and bad input.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "core/memory.h"
#include "core/parallel.h"
#include "flowkv/io.h"
#include "golden_util.h"
#include "io/checkpoint.h"
#include "models/qwen3/config.h"
#include "models/qwen3/model.h"
#include "models/qwen3/weights.h"
#include "ops/linear.h"
#include "temp_files.h"
#include "test_util.h"

namespace flowkv {
namespace {

using test::compare;
using test::expect_error;
using test::golden;

// f32 tolerance: max |got - ref| <= kF32Rel * max |ref| and NMSE <= kF32Nmse for every hidden
// state. The two sides reduce in different orders (GEMM blocking, softmax), so they differ by
// f32 rounding only, growing slowly with depth (measured: at most 7e-7 relative, NMSE 2e-13).
constexpr double kF32Rel = 5e-6;
constexpr double kF32Nmse = 1e-11;

struct Golden {
  std::map<std::string, Tensor> dump = test::load_tensors(golden("qwen3/dump.safetensors"));
  std::map<std::string, Tensor> inputs = test::load_tensors(golden("qwen3/inputs.safetensors"));
  std::vector<int32_t> ids, mask;
  int64_t batch = 0, seq = 0;
  Golden() {
    const Tensor& i = inputs.at("input_ids");
    batch = i.dim(0), seq = i.dim(1);
    for (int64_t k = 0; k < i.numel(); ++k) {
      ids.push_back(static_cast<int32_t>(i.f32()[k]));
      mask.push_back(static_cast<int32_t>(inputs.at("attention_mask").f32()[k]));
    }
  }
  qwen3::EncodeArgs args() const { return {ids, mask, batch}; }
};

struct Ctx {
  Arena arena;
  ExecContext ec{&arena, KernelPath::kFast, nullptr};
};

test::ErrorStats expect_close(const Tensor& got, const Tensor& ref, double rel, double nmse,
                              const std::string& what) {
  EXPECT_EQ(got.shape(), ref.shape()) << what;
  const test::ErrorStats e = compare(got.f32(), ref.f32(), ref.numel());
  EXPECT_LE(e.rel(), rel) << what << ": max abs error " << e.max_abs << ", max |ref| " << e.max_ref;
  EXPECT_LE(e.nmse(), nmse) << what;
  std::printf("  %-22s max rel error %.3g, NMSE %.3g\n", what.c_str(), e.rel(), e.nmse());
  return e;
}

TEST(Qwen3, EveryHiddenStateMatchesTransformers) {
  Golden g;
  Ctx c;
  const auto enc = qwen3::Encoder::load(golden("qwen3/f32"));
  EXPECT_EQ(enc.compute_dtype(), DType::kF32);
  const int64_t n = enc.config().num_hidden_layers;
  std::vector<int64_t> all;
  for (int64_t k = 0; k <= n; ++k) all.push_back(k);
  const auto hs = enc.hidden_states(c.ec, g.args(), all);
  ASSERT_EQ(hs.size(), all.size());
  for (int64_t k = 0; k <= n; ++k) {
    const std::string name = "hidden_states." + std::to_string(k);
    expect_close(hs[k], g.dump.at(name), kF32Rel, kF32Nmse, name);
  }
  // The embeddings are exact (a row copy).
  EXPECT_TRUE(test::bit_equal(hs[0].f32(), g.dump.at("hidden_states.0").f32(), hs[0].numel()));
}

TEST(Qwen3, KleinStackingMatchesThePipeline) {
  Golden g;
  Ctx c;
  const auto enc = qwen3::Encoder::load(golden("qwen3/f32"));
  for (const auto& [layers, name] : std::vector<std::pair<std::vector<int64_t>, std::string>>{
           {{1, 3, 5}, "klein.1_3_5"}, {{2, 4, 6}, "klein.2_4_6"}}) {
    const Tensor e = qwen3::klein_prompt_embeds(c.ec, enc, g.args(), layers);
    ASSERT_EQ(e.shape(), (Shape{g.batch, g.seq, 3 * enc.config().hidden_size}));
    expect_close(e, g.dump.at(name), kF32Rel, kF32Nmse, name);
  }
}

TEST(Qwen3, LoadsOnlyTheLayersAskedFor) {
  Golden g;
  Ctx c;
  const auto full = qwen3::Encoder::load(golden("qwen3/f32"));
  const auto part = qwen3::Encoder::load(golden("qwen3/f32"), {.last_hidden_state = 3});
  EXPECT_EQ(part.last_hidden_state(), 3);
  EXPECT_LT(part.weight_bytes(), full.weight_bytes());
  const std::vector<int64_t> idx = {1, 3};
  const auto a = full.hidden_states(c.ec, g.args(), idx);
  const auto b = part.hidden_states(c.ec, g.args(), idx);
  for (size_t i = 0; i < idx.size(); ++i) {
    EXPECT_TRUE(test::bit_equal(a[i].f32(), b[i].f32(), a[i].numel()));
  }
  const std::vector<int64_t> four = {4};
  expect_error([&] { part.hidden_states(c.ec, g.args(), four); },
               {"hidden state 4", "indices 0..3"});
  // Klein's default (9, 18, 27) is beyond this tiny model.
  expect_error([&] { qwen3::klein_prompt_embeds(c.ec, full, g.args()); },
               {"hidden state 9", "indices 0..6"});
  expect_error([&] { qwen3::Encoder::load(golden("qwen3/f32"), {.last_hidden_state = 7}); },
               {"hidden state 7", "only 6 layers"});
}

TEST(Qwen3, LoadsFromAPipelineFolder) {
  // A diffusers pipeline folder (model_index.json beside text_encoder/, no config.json).
  test::TempDir dir;
  std::filesystem::create_directory_symlink(std::filesystem::absolute(golden("qwen3/bf16")),
                                            dir.path() / "text_encoder");
  test::write_file(dir.file("model_index.json"), "{}");
  const auto enc = qwen3::Encoder::load(dir.path().string());
  EXPECT_EQ(enc.config().hidden_size, 64);
  EXPECT_EQ(enc.compute_dtype(), DType::kBF16);
}

TEST(Qwen3, Bf16WeightsStayTwoBytesAndCloseToF32) {
  Golden g;
  Ctx c;
  // The bf16 folder has tied embeddings (no lm_head) and the same weight values as f32/.
  const auto f32 = qwen3::Encoder::load(golden("qwen3/f32"));
  const auto bf = qwen3::Encoder::load(golden("qwen3/bf16"));
  EXPECT_EQ(bf.compute_dtype(), DType::kBF16);
  const qwen3::Config& cfg = bf.config();
  // Linear weights and embeddings held at 2 bytes each (as stored), norms as f32.
  int64_t linear = 0, norms = 0;
  for (const ExpectedTensor& e : qwen3::needed_table(cfg, cfg.num_hidden_layers)) {
    (e.shape.size() == 2 ? linear : norms) += shape_numel(e.shape);
  }
  std::printf("  weight bytes: bf16 %lld, f32 %lld (%lld matrix and %lld norm values)\n",
              static_cast<long long>(bf.weight_bytes()), static_cast<long long>(f32.weight_bytes()),
              static_cast<long long>(linear), static_cast<long long>(norms));
  EXPECT_EQ(bf.weight_bytes(), 2 * linear + 4 * norms);
  EXPECT_EQ(f32.weight_bytes(), 4 * linear + 4 * norms);
  const std::vector<int64_t> layers = {1, 3, 5};
  const Tensor e = qwen3::klein_prompt_embeds(c.ec, bf, g.args(), layers);
  // bf16 activations (the GEMM inputs, q/k/v, the residual stream) against the f32 run of the
  // same weights, and against transformers' own bf16 run (what the pipeline computes).
  expect_close(e, g.dump.at("klein.1_3_5"), 0.05, 2e-4, "bf16 vs f32 reference");
  expect_close(e, g.dump.at("klein_bf16.1_3_5"), 0.05, 2e-4, "bf16 vs bf16 reference");
  for (int64_t i = 0; i < e.numel(); ++i) {
    ASSERT_EQ(e.f32()[i], round_bf16(e.f32()[i])) << "the embeddings are cast to bf16";
  }
}

TEST(Qwen3, GgufQuantizedWeightsLoadThroughTheSameTable) {
  // flowkv's GGUF conversion keeps the transformers names and carries config.json: the matrices
  // (embeddings included) become Q8_0 blocks, held as stored and widened per panel (or per
  // looked-up row).
  Golden g;
  Ctx c;
  test::TempDir dir;
  const std::string file = dir.file("te.gguf");
  quantize_checkpoint(golden("qwen3/f32"), file, DType::kQ8_0);
  const auto q = qwen3::Encoder::load(file);
  const auto bf = qwen3::Encoder::load(golden("qwen3/bf16"));
  EXPECT_EQ(q.compute_dtype(), DType::kF32);
  EXPECT_LT(q.weight_bytes(), bf.weight_bytes());
  const std::vector<int64_t> layers = {1, 3, 5};
  const Tensor e = qwen3::klein_prompt_embeds(c.ec, q, g.args(), layers);
  // 8-bit blocks of every matrix, the embeddings too (measured NMSE 2.1e-4).
  expect_close(e, g.dump.at("klein.1_3_5"), 0.05, 1e-3, "q8_0 vs f32 reference");
}

TEST(Qwen3, OneAndTwoThreadsAreBitIdentical) {
  Golden g;
  Ctx c;
  for (const char* dir : {"qwen3/f32", "qwen3/bf16"}) {
    const auto enc = qwen3::Encoder::load(golden(dir));
    const std::vector<int64_t> layers = {1, 3, 6};
    set_num_threads(1);
    const Tensor a = qwen3::klein_prompt_embeds(c.ec, enc, g.args(), layers);
    set_num_threads(2);
    const Tensor b = qwen3::klein_prompt_embeds(c.ec, enc, g.args(), layers);
    set_num_threads(0);
    EXPECT_TRUE(test::bit_equal(a.f32(), b.f32(), a.numel())) << dir;
  }
}

TEST(Qwen3, ReferenceKernelsAgreeWithFastKernels) {
  Golden g;
  Ctx c;
  const auto enc = qwen3::Encoder::load(golden("qwen3/f32"), {.keep_plain = true});
  const std::vector<int64_t> layers = {1, 3, 6};
  const Tensor fast = qwen3::klein_prompt_embeds(c.ec, enc, g.args(), layers);
  ExecContext ref{&c.arena, KernelPath::kReference, nullptr};
  const Tensor slow = qwen3::klein_prompt_embeds(ref, enc, g.args(), layers);
  expect_close(fast, slow, kF32Rel, kF32Nmse, "fast vs reference");
}

TEST(Qwen3, PaddedRowsDoNotChangeRealRows) {
  // Row 1 of the golden batch has no padding; alone it gives the same result as in the batch,
  // and row 0's real tokens do not depend on what its padded positions hold.
  Golden g;
  Ctx c;
  const auto enc = qwen3::Encoder::load(golden("qwen3/f32"));
  const std::vector<int64_t> idx = {5};
  const Tensor both = enc.hidden_states(c.ec, g.args(), idx)[0];
  std::vector<int32_t> ids0(g.ids.begin(), g.ids.begin() + g.seq);
  std::vector<int32_t> mask0(g.mask.begin(), g.mask.begin() + g.seq);
  const Tensor a = enc.hidden_states(c.ec, {ids0, mask0, 1}, idx)[0];
  for (int64_t j = 0; j < g.seq; ++j) {
    if (mask0[j] == 0) ids0[j] = 7;  // other padding ids
  }
  const Tensor b = enc.hidden_states(c.ec, {ids0, mask0, 1}, idx)[0];
  const int64_t H = enc.config().hidden_size, real = 11;
  EXPECT_LE(compare(a.f32(), both.f32(), g.seq * H).rel(), 1e-6);
  EXPECT_TRUE(test::bit_equal(a.f32(), b.f32(), real * H));
  // Left padding leaves the first query rows with no allowed key: their attention output is
  // zero (transformers' backends disagree there), never NaN.
  std::vector<int32_t> left(g.seq, 1);
  left[0] = left[1] = 0;
  const Tensor l = enc.hidden_states(c.ec, {ids0, left, 1}, idx)[0];
  for (int64_t i = 0; i < l.numel(); ++i) ASSERT_TRUE(std::isfinite(l.f32()[i])) << i;
}

TEST(Qwen3, BadTokensAndMasksAreErrors) {
  Golden g;
  Ctx c;
  const auto enc = qwen3::Encoder::load(golden("qwen3/f32"));
  const std::vector<int64_t> idx = {1};
  std::vector<int32_t> ids = g.ids, mask = g.mask;
  ids[3] = 300;
  expect_error(
      [&] {
        enc.hidden_states(c.ec, {ids, mask, g.batch}, idx);
      },
      {"token id 300", "position 3", "[0, 300)"});
  ids[3] = -1;
  expect_error([&] { enc.hidden_states(c.ec, {ids, mask, g.batch}, idx); }, {"token id -1"});
  ids = g.ids;
  mask[5] = 2;
  expect_error(
      [&] {
        enc.hidden_states(c.ec, {ids, mask, g.batch}, idx);
      },
      {"mask value 2", "position 5"});
  mask.pop_back();
  expect_error([&] { enc.hidden_states(c.ec, {ids, mask, g.batch}, idx); }, {"mask has"});
  expect_error([&] { enc.hidden_states(c.ec, {ids, {}, 3}, idx); }, {"3 equal rows"});
  expect_error([&] { enc.hidden_states(c.ec, {{}, {}, 1}, idx); }, {"token ids"});
  // Activations beyond the memory budget are refused before they are allocated.
  set_memory_budget_bytes(64 << 10);
  expect_error([&] { enc.hidden_states(c.ec, g.args(), idx); }, {"qwen3 encode activations"});
  set_memory_budget_bytes(0);
}

TEST(Qwen3, MissingAndMisshapenTensorsAreErrors) {
  const CheckpointScan scan = scan_checkpoint(golden("qwen3/f32"));
  const auto cfg = qwen3::Config::from_json(*scan.config, "config.json");
  CheckpointScan missing = scan;
  missing.tensors.erase("model.layers.4.mlp.up_proj.weight");
  expect_error(
      [&] { qwen3::Encoder::from_scan(missing, cfg, {}); },
      {"does not hold a Qwen3 text encoder", "missing: model.layers.4.mlp.up_proj.weight"});
  qwen3::Config wide = cfg;
  wide.intermediate_size = 97;
  expect_error([&] { qwen3::Encoder::from_scan(scan, wide, {}); },
               {"wrong shape: model.layers.0.mlp.gate_proj.weight is [96, 64], expected [97, 64]"});
  qwen3::Config deeper = cfg;
  deeper.num_hidden_layers = 7;
  expect_error([&] { qwen3::Encoder::from_scan(scan, deeper, {}); },
               {"missing: model.layers.6.input_layernorm.weight"});
  CheckpointScan extra = scan;
  extra.tensors["model.layers.0.self_attn.q_proj.bias"] =
      extra.tensors.at("model.layers.0.input_layernorm.weight");
  expect_error([&] { qwen3::Encoder::from_scan(extra, cfg, {}); },
               {"unexpected: model.layers.0.self_attn.q_proj.bias"});
  test::TempDir dir;
  expect_error([&] { qwen3::Encoder::load(dir.path().string()); }, {"no config.json"});
}

Json tiny_config() {
  return parse_json(test::read_file(golden("qwen3/f32/config.json")), "config.json");
}

TEST(Qwen3Config, ReadsTransformersConfigs) {
  const qwen3::Config c = qwen3::Config::from_json(tiny_config(), "config.json");
  EXPECT_EQ(c.hidden_size, 64);
  EXPECT_EQ(c.num_key_value_heads, 2);
  EXPECT_EQ(c.head_dim, 16);
  EXPECT_EQ(c.rope_theta, 1e6);  // from rope_parameters
  EXPECT_EQ(c.dtype, "float32");
  // The older layout: top-level rope_theta, rope_scaling null, torch_dtype (Qwen3-8B's file).
  Json old = tiny_config();
  old.erase("rope_parameters");
  old["rope_theta"] = 5000;
  old["rope_scaling"] = nullptr;
  old["torch_dtype"] = "bfloat16";
  const qwen3::Config o = qwen3::Config::from_json(old, "config.json");
  EXPECT_EQ(o.rope_theta, 5000);
  EXPECT_EQ(o.dtype, "bfloat16");
  old["rope_scaling"] = {{"type", "default"}};
  EXPECT_EQ(qwen3::Config::from_json(old, "c").rope_theta, 5000);
  // A missing num_key_value_heads means as many as the query heads.
  Json mha = tiny_config();
  mha.erase("num_key_value_heads");
  EXPECT_EQ(qwen3::Config::from_json(mha, "c").num_key_value_heads, 4);
  // Round trip.
  const Json w = c.to_json();
  EXPECT_EQ(qwen3::Config::from_json(w, "rt").to_json(), w);
  qwen3::Config r;
  ASSERT_TRUE(qwen3::released_config("qwen3-8b", &r));
  EXPECT_EQ(qwen3::variant_name(r), "Qwen3-8B (FLUX.2 Klein 9B text encoder)");
  ASSERT_TRUE(qwen3::released_config("qwen3-4b", &r));
  EXPECT_EQ(r.hidden_size * 3, 7680);  // Klein 4B's joint_attention_dim
}

TEST(Qwen3Config, ImpossibleAndUnsupportedConfigsAreErrors) {
  auto with = [](const char* key, Json v) {
    Json j = tiny_config();
    j[key] = std::move(v);
    return j;
  };
  auto refused = [](const Json& j, std::initializer_list<std::string> frags) {
    expect_error([&] { qwen3::Config::from_json(j, "te/config.json"); }, frags);
  };
  refused(with("hidden_size", 0), {"te/config.json", "hidden_size is 0"});
  refused(with("hidden_size", 65), {"hidden_size must be even"});
  refused(with("num_hidden_layers", 100000), {"num_hidden_layers"});
  refused(with("num_key_value_heads", 3), {"not a multiple of num_key_value_heads"});
  refused(with("num_key_value_heads", 8), {"num_key_value_heads is 8"});
  refused(with("head_dim", 15), {"head_dim must be even"});
  refused(with("vocab_size", -1), {"vocab_size"});
  refused(with("vocab_size", "many"), {"vocab_size"});
  refused(with("rms_norm_eps", 0), {"rms_norm_eps must be positive"});
  refused(with("attention_bias", true), {"attention_bias is true"});
  refused(with("hidden_act", "gelu"), {"hidden_act is \"gelu\""});
  refused(with("model_type", "llama"), {"model_type is \"llama\""});
  refused(with("rope_parameters", {{"rope_type", "yarn"}, {"factor", 4}}),
          {"RoPE type \"yarn\" is not supported"});
  refused(with("rope_scaling", {{"type", "linear"}}), {"rope_scaling", "\"linear\""});
  refused(with("rope_parameters", 3), {"rope_parameters must be an object"});
  refused(with("layer_types", {"full_attention", "sliding_attention"}),
          {"layer type \"sliding_attention\""});
  Json sliding = tiny_config();
  sliding.erase("layer_types");
  sliding["use_sliding_window"] = true;
  sliding["sliding_window"] = 8;
  sliding["max_window_layers"] = 2;
  refused(sliding, {"sliding-window attention is not supported"});
  refused(Json::array(), {"not a JSON object"});
}

}  // namespace
}  // namespace flowkv

namespace flowkv {
namespace {

// Measurement, not a check (run with FLOWKV_QWEN3_BENCH=1): a 2-layer slice of Qwen3-8B (the
// Klein 9B text encoder) at real width, bf16 zero weights (holes of a sparse file), 512 tokens
// as Klein pads them; prints the time per layer and the 27-layer extrapolation.
TEST(Qwen3Bench, RealWidthTwoLayerSlice) {
  if (!std::getenv("FLOWKV_QWEN3_BENCH")) GTEST_SKIP() << "set FLOWKV_QWEN3_BENCH=1 to run";
  qwen3::Config cfg;
  ASSERT_TRUE(
      qwen3::released_config(std::getenv("FLOWKV_QWEN3_BENCH_4B") ? "qwen3-4b" : "qwen3-8b", &cfg));
  cfg.num_hidden_layers = 2;
  test::TempDir dir;
  write_zero_folder(dir.path().string(), cfg.to_json(), qwen3::weight_table(cfg), DType::kBF16);
  const auto t0 = std::chrono::steady_clock::now();
  const auto enc = qwen3::Encoder::load(dir.path().string());
  const auto t1 = std::chrono::steady_clock::now();
  const int64_t L = 512;
  std::vector<int32_t> ids(L, 151643), mask(L, 0);
  for (int64_t i = 0; i < 40; ++i) ids[i] = static_cast<int32_t>(1000 + i), mask[i] = 1;
  Arena arena;
  Profile prof;
  ExecContext ec{&arena, KernelPath::kFast, nullptr, &prof};
  const std::vector<int64_t> one = {1}, two = {1, 2};
  (void)qwen3::klein_prompt_embeds(ec, enc, {ids, mask, 1}, one);  // warm-up (arena, pages)
  auto time = [&](std::span<const int64_t> layers) {
    double best = 1e30;
    for (int run = 0; run < 3; ++run) {
      const auto a = std::chrono::steady_clock::now();
      (void)qwen3::klein_prompt_embeds(ec, enc, {ids, mask, 1}, layers);
      best = std::min(best,
                      std::chrono::duration<double>(std::chrono::steady_clock::now() - a).count());
    }
    return best;
  };
  prof = {};
  const double t_one = time(one), t_two = time(two);
  // The work outside the layers (512 embedding rows, the stacking) is negligible, so a layer
  // costs about half the 2-layer time; the difference of the two runs says the same when the
  // machine is quiet.
  const double per_layer = t_two / 2, fixed = std::max(0.0, t_one - (t_two - t_one));
  std::printf(
      "  Qwen3 2-layer slice, hidden %lld, %d threads, compute %s, load %.2f s, weights held "
      "%.2f GiB\n",
      static_cast<long long>(cfg.hidden_size), num_threads(),
      enc.compute_dtype() == DType::kBF16 ? "bf16" : "f32",
      std::chrono::duration<double>(t1 - t0).count(),
      static_cast<double>(enc.weight_bytes()) / (1 << 30));
  std::printf(
      "  512 tokens: 1 layer %.3f s, 2 layers %.3f s -> %.3f s per layer (difference %.3f s)\n",
      t_one, t_two, per_layer, t_two - t_one);
  std::printf("  linear %.2f GFLOP/s over %lld calls, attention %.2f GFLOP/s\n",
              prof.linear.flops / prof.linear.seconds / 1e9,
              static_cast<long long>(prof.linear.calls),
              prof.attention.flops / prof.attention.seconds / 1e9);
  std::printf("  extrapolated 27-layer Klein encode: %.1f s (%.1f GFLOP per layer)\n",
              fixed + 27 * per_layer, prof.linear.flops / (prof.linear.calls / 4.0) / 1e9);
}

}  // namespace
}  // namespace flowkv
