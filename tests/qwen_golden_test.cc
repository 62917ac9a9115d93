// Qwen-Image-2.1 and Qwen-Image against diffusers 0.42.1 dumps (python/ref/dump_qwen.py),
// tensor by tensor in f32, and the 2.1 prefix cache's calls.
#include <gtest/gtest.h>

#include "cache/kv_memory.h"
#include "flowkv/error.h"
#include "golden_util.h"
#include "models/qwen_image/model21.h"
#include "models/qwen_image/model_qwen.h"

namespace flowkv {
namespace {

using test::golden;

// f32: max abs error <= 1e-5 x max |reference| for every tensor (as for FLUX.2).
constexpr double kF32Tol = 1e-5;

using Case = test::GoldenCase;

// The inputs of a diffusers 2.1 call split the way flowkv takes them: condition latents and
// target latents apart, the slot mask of the text rows, the prompt mask as bytes.
struct Inputs21 {
  int64_t B = 0, L = 0, T = 0, n_cond = 0, channels = 0;
  std::vector<uint8_t> slots, valid;
  std::vector<qwen::Grid> cond_grids;
  qwen::Grid target;
  std::vector<float> cond, tgt;
  Inputs21(const Case& c, const std::string& hidden_name) {
    const Tensor& hs = c.in.at(hidden_name);
    const Tensor& enc = c.in.at("encoder_hidden_states");
    const Tensor& shapes = c.in.at("img_shapes");
    B = hs.dim(0), L = enc.dim(1);
    const int64_t k = shapes.dim(0);
    for (int64_t i = 0; i < k; ++i) {
      const qwen::Grid g{static_cast<int64_t>(shapes.f32()[i * 3 + 1]),
                         static_cast<int64_t>(shapes.f32()[i * 3 + 2])};
      if (i + 1 < k)
        cond_grids.push_back(g), n_cond += g.tokens();
      else
        target = g;
    }
    T = target.tokens();
    const Tensor& mask = c.in.at("img_mask");
    for (int64_t r = 0; r < L; ++r) slots.push_back(mask.f32()[r] != 0);
    if (c.in.count("encoder_hidden_states_mask")) {
      const Tensor& m = c.in.at("encoder_hidden_states_mask");
      for (int64_t i = 0; i < m.numel(); ++i) valid.push_back(m.f32()[i] != 0);
    }
    const int64_t C = hs.dim(2), N = hs.dim(1);
    channels = C;
    for (int64_t b = 0; b < B; ++b) {
      const float* row = hs.f32() + b * N * C;
      cond.insert(cond.end(), row, row + n_cond * C);
      tgt.insert(tgt.end(), row + n_cond * C, row + N * C);
    }
  }
  // [text, conditions..., target]; `prefix` is the route and memory of the text and the
  // conditions (one memory), `time` the prefix's modulation time.
  qwen::Args21 args(const Case& c, const char* timestep, float* out, SegmentTime time,
                    SegmentKV prefix = {}) const {
    qwen::Args21 a;
    a.batch = B;
    const Tensor& enc = c.in.at("encoder_hidden_states");
    a.segments.push_back({.kind = SegmentKind::kText,
                          .name = "text",
                          .rows = enc.f32(),
                          .tokens = L,
                          .slots = slots.data(),
                          .valid = valid.empty() ? nullptr : valid.data(),
                          .time = time,
                          .kv = prefix});
    int64_t offset = 0;
    for (size_t i = 0; i < cond_grids.size(); ++i) {
      a.segments.push_back({.kind = SegmentKind::kReference,
                            .name = "condition " + std::to_string(i + 1),
                            .rows = cond.data() + offset * channels,
                            .tokens = cond_grids[i].tokens(),
                            .batch_rows = n_cond,
                            .grid = cond_grids[i],
                            .time = time,
                            .kv = {.route = prefix.route}});
      offset += cond_grids[i].tokens();
    }
    a.segments.push_back({.kind = SegmentKind::kTarget,
                          .name = "target",
                          .rows = tgt.data(),
                          .tokens = T,
                          .grid = target});
    a.timestep = c.in.at(timestep).f32();
    a.out = out;
    return a;
  }
};

qwen::Model21 load21(const std::string& dir) {
  qwen::LoadOptions21 o;
  o.auto_dtype = false;
  return qwen::Model21::load(dir + "/transformer", o);
}

void run_case21(const std::string& name) {
  Case c(name);
  const qwen::Model21 m = load21(c.dir);
  const Inputs21 in(c, "hidden_states");
  const Inputs21 in2(c, "hidden_states_cached");
  const int64_t P = c.meta.at("prefix_len").get<int64_t>();
  std::vector<float> out(static_cast<size_t>(in.B * in.T * m.config().out_features()));
  Arena arena;
  test::CaptureTracer tracer;
  ExecContext ctx{&arena, KernelPath::kFast, &tracer};
  // Plain: the uncached forward.
  tracer.prefix = "plain.";
  m.forward(ctx, in.args(c, "timestep", out.data(), m.prefix_time()));
  test::expect_matches_dump(tracer.got, c.dump, c.order, "plain.", kF32Tol);
  // Extract: the same, storing the prefix K/V.
  KVMemory mem(m.kv_layers(), in.B, P, m.kv_width(), m.kv_dtype());
  const qwen::Args21 a = in.args(c, "timestep", out.data(), m.prefix_time(),
                                 {.route = KVRoute::kComputeAndStore, .store = &mem});
  tracer.prefix = "extract.";
  m.forward(ctx, a);
  test::expect_matches_dump(tracer.got, c.dump, c.order, "extract.transformer", kF32Tol);
  test::expect_matches_dump(tracer.got, c.dump, c.order, "extract.output", kF32Tol);
  for (int64_t l = 0; l < m.kv_layers(); ++l) {
    for (const char* kv : {"k", "v"}) {
      const Tensor got = kv[0] == 'k' ? mem.keys(l) : mem.values(l);
      const Tensor& want = c.dump.at("extract.kv." + std::to_string(l) + "." + kv);
      ASSERT_EQ(got.numel(), want.numel());
      EXPECT_LE(test::compare(got.f32(), want.f32(), want.numel()).rel(), kF32Tol) << l << kv;
    }
  }
  // Cached: only the target is computed; the prefix comes from the memory. The prefix's
  // projections (img_in of the condition images, txt_in) are not computed at all in decode, so
  // their dumps have nothing to compare with.
  const qwen::Args21 d = in2.args(c, "timestep_cached", out.data(), m.prefix_time(),
                                  {.route = KVRoute::kSplice, .memory = &mem});
  tracer.got.clear();
  tracer.prefix = "cached.";
  m.forward(ctx, d);
  for (const char* skipped : {"cached.img_in", "cached.txt_in"}) {
    EXPECT_EQ(tracer.got.count(skipped), 0u);
  }
  std::vector<std::string> order;
  for (const auto& n : c.order) {
    if (n != "cached.img_in" && n != "cached.txt_in") order.push_back(n);
  }
  test::expect_matches_dump(tracer.got, c.dump, order, "cached.", kF32Tol);
  // The recompute reference: the target rows of the uncached call at the cached inputs.
  const Tensor& rec = c.dump.at("recompute.output");
  const int64_t S = rec.dim(1), C = rec.dim(2);
  for (int64_t b = 0; b < in.B; ++b) {
    const auto e =
        test::compare(out.data() + b * in.T * C, rec.f32() + (b * S + S - in.T) * C, in.T * C);
    EXPECT_LE(e.max_abs, kF32Tol * test::compare(rec.f32(), rec.f32(), rec.numel()).max_ref);
  }
}

TEST(Qwen21Golden, TextToImagePlainExtractCached) {
  run_case21("qwen_image21/t2i");
}
TEST(Qwen21Golden, TwoConditionImagesMaskedTextBatch2) {
  run_case21("qwen_image21/refs");
}

TEST(Qwen21Golden, NoCausalConditionPlainMatchesAndCacheIsRefused) {
  Case c("qwen_image21/no_causal");
  const qwen::Model21 m = load21(c.dir);
  const Inputs21 in(c, "hidden_states");
  std::vector<float> out(static_cast<size_t>(in.B * in.T * m.config().out_features()));
  Arena arena;
  test::CaptureTracer tracer;
  tracer.prefix = "plain.";
  m.forward({&arena, KernelPath::kFast, &tracer},
            in.args(c, "timestep", out.data(), m.prefix_time()));
  test::expect_matches_dump(tracer.got, c.dump, c.order, "plain.", kF32Tol);
  const int64_t P =
      in.L + 3 * static_cast<int64_t>(std::count(in.slots.begin(), in.slots.end(), 1));
  KVMemory mem(m.kv_layers(), in.B, P, m.kv_width(), m.kv_dtype());
  const qwen::Args21 a = in.args(c, "timestep", out.data(), m.prefix_time(),
                                 {.route = KVRoute::kComputeAndStore, .store = &mem});
  try {
    m.forward({&arena}, a);
    ADD_FAILURE() << "a cache was accepted without causal_condition";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("causal_condition = false"), std::string::npos)
        << e.what();
  }
}

void run_qwen_image(const std::string& name) {
  Case c(name);
  const qwen::ModelQwenImage m = qwen::ModelQwenImage::load(c.dir + "/transformer");
  const Tensor& hs = c.in.at("hidden_states");
  const Tensor& enc = c.in.at("encoder_hidden_states");
  const Tensor& shapes = c.in.at("img_shapes");
  qwen::ArgsQwenImage a;
  a.batch = hs.dim(0);
  a.text = enc.f32();
  a.text_len = enc.dim(1);
  std::vector<uint8_t> valid;
  if (c.in.count("encoder_hidden_states_mask")) {
    const Tensor& mk = c.in.at("encoder_hidden_states_mask");
    for (int64_t i = 0; i < mk.numel(); ++i) valid.push_back(mk.f32()[i] != 0);
    a.text_valid = valid.data();
  }
  a.img = hs.f32();
  for (int64_t i = 0; i < shapes.dim(0); ++i) {
    a.img_grids.push_back({static_cast<int64_t>(shapes.f32()[i * 3 + 1]),
                           static_cast<int64_t>(shapes.f32()[i * 3 + 2])});
  }
  a.timestep = c.in.at("timestep").f32();
  std::vector<float> out(static_cast<size_t>(hs.dim(0) * hs.dim(1) * m.config().out_features()));
  a.out = out.data();
  Arena arena;
  test::CaptureTracer tracer;
  m.forward({&arena, KernelPath::kFast, &tracer}, a);
  test::expect_matches_dump(tracer.got, c.dump, c.order, "", kF32Tol);
}

TEST(QwenImageGolden, TextToImageMaskedPrompt) {
  run_qwen_image("qwen_image/t2i");
}
TEST(QwenImageGolden, EditPlusLayout) {
  run_qwen_image("qwen_image/edit_plus");
}

}  // namespace
}  // namespace flowkv
