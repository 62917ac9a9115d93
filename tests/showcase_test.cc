// The showcase's public pieces: PSNR and SSIM against scikit-image 0.25.2's values
// (tests/golden/metrics, python/ref/dump_metrics.py), and the case manifest and sweep parsers'
// refusals, each naming the file and the field.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <string>

#include "flowkv/error.h"
#include "flowkv/image.h"
#include "flowkv/metrics.h"
#include "flowkv/showcase.h"
#include "flowkv/step_cache.h"
#include "temp_files.h"

namespace flowkv {
namespace {

using test::expect_error;

const std::string kGolden = std::string(FLOWKV_GOLDEN_DIR) + "/metrics/";

TEST(Metrics, MatchScikitImage) {
  const nlohmann::json meta = nlohmann::json::parse(test::read_file(kGolden + "metrics.json"));
  ASSERT_EQ(meta["scikit-image"], "0.25.2");
  int n = 0;
  for (const auto& [name, want] : meta["cases"].items()) {
    const PixelFormat f = want["channels"] == 4 ? PixelFormat::kRGBA : PixelFormat::kRGB;
    const Image a = load_image(kGolden + name + "_a.png", f);
    const Image b = load_image(kGolden + name + "_b.png", f);
    ASSERT_EQ(a.channels, want["channels"].get<int64_t>()) << name;
    const double p = psnr(a, b), s = ssim(a, b);
    if (want["psnr"].is_null()) {
      EXPECT_TRUE(std::isinf(p) && p > 0) << name << ": " << p;
    } else {
      EXPECT_NEAR(p, want["psnr"].get<double>(), 1e-9) << name;
    }
    EXPECT_NEAR(s, want["ssim"].get<double>(), 1e-9) << name;
    // Symmetric in its arguments (both are).
    EXPECT_NEAR(ssim(b, a), s, 1e-12) << name;
    ++n;
  }
  EXPECT_GE(n, 7);
}

Image solid(int64_t w, int64_t h, int64_t c, uint8_t v) {
  Image im;
  im.width = w, im.height = h, im.channels = c;
  im.pixels.assign(static_cast<size_t>(w * h * c), v);
  return im;
}

TEST(Metrics, RefuseMismatchedOrDegeneratePictures) {
  expect_error([] { psnr(solid(16, 16, 3, 0), solid(16, 15, 3, 0)); },
               {"psnr", "differ in size", "16x16x3", "16x15x3"});
  expect_error([] { ssim(solid(16, 16, 3, 0), solid(16, 16, 4, 0)); }, {"ssim", "differ in size"});
  expect_error([] { ssim(solid(10, 16, 3, 0), solid(10, 16, 3, 0)); },
               {"ssim", "smaller than the 11x11"});
  expect_error([] { psnr(solid(0, 0, 3, 0), solid(0, 0, 3, 0)); }, {"empty picture"});
  expect_error([] { psnr(solid(4, 4, 2, 0), solid(4, 4, 2, 0)); }, {"3 (RGB) or 4 (RGBA)"});
  Image short_one = solid(16, 16, 3, 0);
  short_one.pixels.pop_back();
  expect_error([&] { psnr(short_one, short_one); }, {"holds 767 values"});
  EXPECT_DOUBLE_EQ(psnr(solid(4, 4, 3, 0), solid(4, 4, 3, 255)), 0.0);
  EXPECT_DOUBLE_EQ(ssim(solid(11, 11, 3, 9), solid(11, 11, 3, 9)), 1.0);
}

// A manifest's text with one case replaced.
std::string manifest(const std::string& case_json, const std::string& top = "") {
  return "{" + top + "\"cases\": [" + case_json + "]}";
}

TEST(ShowcaseManifest, ParsesAndResolvesPaths) {
  const ShowcaseManifest m = parse_showcase_manifest(
      R"({"size": [64, 48], "steps": 8, "seed": 3, "cases": [
          {"name": "red-3", "task": "text", "prompt": "a red 3 on white", "references": [],
           "truth": null},
          {"name": "compose-7", "task": "compose", "prompt": "put the first left of the second",
           "size": [128, 64], "references": ["refs/compose-7.png", "/abs/x.png"],
           "truth": "truth/../truth/r.png"}]})",
      "/data/set", "cases.json");
  EXPECT_EQ(m.width, 64);
  EXPECT_EQ(m.height, 48);
  EXPECT_EQ(m.steps, 8);
  EXPECT_EQ(m.seed, 3u);
  ASSERT_EQ(m.cases.size(), 2u);
  EXPECT_EQ(m.cases[0].name, "red-3");
  EXPECT_TRUE(m.cases[0].references.empty());
  EXPECT_EQ(m.cases[0].truth, "");
  // A case's size is its own, else the manifest's.
  EXPECT_EQ(m.cases[0].width, 64);
  EXPECT_EQ(m.cases[0].height, 48);
  EXPECT_EQ(m.cases[1].width, 128);
  EXPECT_EQ(m.cases[1].height, 64);
  EXPECT_EQ(m.cases[1].task, "compose");
  EXPECT_EQ(m.cases[1].references[0], "/data/set/refs/compose-7.png");
  EXPECT_EQ(m.cases[1].references[1], "/abs/x.png");
  EXPECT_EQ(m.cases[1].truth, "/data/set/truth/r.png");
  // Size, steps and seed may be left out.
  const ShowcaseManifest d =
      parse_showcase_manifest(manifest(R"({"name": "a", "task": "t", "prompt": ""})"), ".", "m");
  EXPECT_EQ(d.width, 0);
  EXPECT_EQ(d.cases[0].width, 0);
  EXPECT_EQ(d.steps, 0);
}

TEST(ShowcaseManifest, RefusesEachMalformedField) {
  const std::string ok_case = R"({"name": "a", "task": "t", "prompt": "p"})";
  auto parse = [](const std::string& text) { parse_showcase_manifest(text, ".", "cases.json"); };
  expect_error([&] { parse("[1, 2]"); }, {"cases.json", "must be an object"});
  expect_error([&] { parse("{\"cases\": "); }, {"cases.json", "not valid JSON"});
  expect_error([&] { parse("{}"); }, {"cases.json", "\"cases\" is missing"});
  expect_error([&] { parse(R"({"cases": []})"); }, {"\"cases\" is empty"});
  expect_error([&] { parse(R"({"cases": {}})"); }, {"\"cases\" must be a list"});
  expect_error([&] { parse(manifest(ok_case, R"("sizes": [64, 64], )")); },
               {"cases.json", "unknown field \"sizes\""});
  expect_error([&] { parse(manifest(ok_case, R"("size": [64], )")); },
               {"\"size\" must be [width, height]"});
  expect_error([&] { parse(manifest(ok_case, R"("size": [64, "64"], )")); }, {"size[1] (height)"});
  expect_error([&] { parse(manifest(ok_case, R"("size": [0, 64], )")); }, {"size[0] (width)"});
  expect_error([&] { parse(manifest(ok_case, R"("steps": 2.5, )")); }, {"field \"steps\""});
  expect_error([&] { parse(manifest(ok_case, R"("seed": -1, )")); },
               {"field \"seed\"", "non-negative"});
  // Cases: missing fields, wrong types, bad names, bad paths.
  expect_error([&] { parse(manifest("3")); }, {"cases.json: cases[0] must be an object"});
  expect_error([&] { parse(manifest(R"({"task": "t", "prompt": "p"})")); },
               {"cases[0]", "field \"name\" is missing"});
  expect_error([&] { parse(manifest(R"({"name": "a", "prompt": "p"})")); },
               {"cases[0] \"a\"", "field \"task\" is missing"});
  expect_error([&] { parse(manifest(R"({"name": "a", "task": "t"})")); },
               {"cases[0] \"a\"", "field \"prompt\" is missing"});
  expect_error([&] { parse(manifest(R"({"name": "a", "task": "t", "prompt": "", "size": [9]})")); },
               {"cases[0] \"a\"", "\"size\" must be [width, height]"});
  expect_error(
      [&] { parse(manifest(R"({"name": "a", "task": "t", "prompt": "", "size": [9, 1e9]})")); },
      {"cases[0] \"a\": size[1] (height)"});
  expect_error([&] { parse(manifest(R"({"name": "a", "task": "t", "prompt": 3})")); },
               {"field \"prompt\" must be a string"});
  expect_error([&] { parse(manifest(R"({"name": "../x", "task": "t", "prompt": "p"})")); },
               {"cases[0]: field \"name\"", "A-Z a-z 0-9"});
  expect_error([&] { parse(manifest(R"({"name": ".a", "task": "t", "prompt": "p"})")); },
               {"not starting with '.'"});
  expect_error([&] { parse(manifest(R"({"name": "a", "task": "", "prompt": "p"})")); },
               {"field \"task\" must be 1-64 bytes"});
  expect_error(
      [&] { parse(manifest(R"({"name": "a", "task": "t", "prompt": "p", "refs": ["x.png"]})")); },
      {"cases[0] \"a\"", "unknown field \"refs\""});
  expect_error(
      [&] { parse(manifest(R"({"name": "a", "task": "t", "prompt": "p", "references": "x"})")); },
      {"\"references\" must be a list"});
  expect_error(
      [&] { parse(manifest(R"({"name": "a", "task": "t", "prompt": "p", "references": [1]})")); },
      {"cases[0] \"a\": references[0] must be a string"});
  expect_error(
      [&] { parse(manifest(R"({"name": "a", "task": "t", "prompt": "p", "references": [""]})")); },
      {"references[0]: an empty path"});
  expect_error([&] { parse(manifest(R"({"name": "a", "task": "t", "prompt": "p", "truth": 1})")); },
               {"field \"truth\" must be a string"});
  expect_error([&] { parse(manifest(ok_case + "," + ok_case)); },
               {"cases[1]", "\"a\" is used twice"});
  std::string many;
  for (int64_t i = 0; i <= kMaxShowcaseCases; ++i) {
    many += (i ? "," : "") + std::string(R"({"name": "c)") + std::to_string(i) +
            R"(", "task": "t", "prompt": "p"})";
  }
  expect_error([&] { parse(manifest(many)); }, {"1025 cases; at most 1024"});
  std::string refs;
  for (int i = 0; i <= 64; ++i) refs += (i ? "," : "") + std::string("\"r.png\"");
  expect_error(
      [&] {
        parse(
            manifest(R"({"name": "a", "task": "t", "prompt": "p", "references": [)" + refs + "]}"));
      },
      {"more than 64 references"});
}

TEST(ShowcaseManifest, ReadChecksTheFilesItNames) {
  test::TempDir dir;
  std::filesystem::create_directories(dir.path() / "refs");
  test::write_file(dir.file("refs/a.png"), "not read here");
  const std::string path = dir.file("cases.json");
  test::write_file(path, manifest(R"({"name": "a", "task": "t", "prompt": "p",
                                       "references": ["refs/a.png"], "truth": "truth/a.png"})"));
  expect_error([&] { read_showcase_manifest(path); },
               {path, "cases[0] \"a\": truth", "truth/a.png", "no such file"});
  test::write_file(path, manifest(R"({"name": "a", "task": "t", "prompt": "p",
                                       "references": ["refs"]})"));
  expect_error([&] { read_showcase_manifest(path); }, {"references[0]", "not a file"});
  test::write_file(path, manifest(R"({"name": "a", "task": "t", "prompt": "p",
                                       "references": ["refs/a.png"]})"));
  const ShowcaseManifest m = read_showcase_manifest(path);
  EXPECT_EQ(m.cases[0].references[0], dir.file("refs/a.png"));
  expect_error([&] { read_showcase_manifest(dir.file("none.json")); },
               {"none.json", "no such file"});
}

TEST(ShowcaseSweep, ParsesAndRefuses) {
  const std::vector<ShowcaseConfig> s = parse_showcase_sweep(
      R"([{"label": "uncached", "caches": []},
          {"label": "kv+ts:2", "caches": ["kv", "taylorseer:interval=2"], "steps": 28}])",
      "sweep.json");
  ASSERT_EQ(s.size(), 2u);
  EXPECT_FALSE(s[0].kv);
  EXPECT_EQ(s[0].steps, 0);
  EXPECT_TRUE(s[1].kv);
  EXPECT_EQ(s[1].step_caches, std::vector<std::string>{"taylorseer:interval=2"});
  EXPECT_EQ(s[1].steps, 28);
  auto parse = [](const std::string& t) { parse_showcase_sweep(t, "sweep.json"); };
  expect_error([&] { parse("{}"); }, {"sweep.json", "a list of"});
  expect_error([&] { parse("[]"); }, {"sweep is empty"});
  expect_error([&] { parse(R"([{"caches": []}])"); }, {"sweep.json: [0]", "\"label\" is missing"});
  expect_error([&] { parse(R"([{"label": "a"}])"); }, {"[0] \"a\"", "\"caches\" is missing"});
  expect_error([&] { parse(R"([{"label": "a", "caches": "kv"}])"); }, {"must be a list"});
  expect_error([&] { parse(R"([{"label": "a", "caches": [1]}])"); },
               {"[0] \"a\": caches[0] must be a string"});
  expect_error([&] { parse(R"([{"label": "a", "caches": ["nosuch"]}])"); },
               {"[0] \"a\": caches[0]", "nosuch"});
  expect_error([&] { parse(R"([{"label": "a", "caches": ["teacache:threshold=x"]}])"); },
               {"caches[0]", "threshold"});
  expect_error([&] { parse(R"([{"label": "a", "caches": ["kv", "kv"]}])"); },
               {"\"kv\" given twice"});
  expect_error([&] { parse(R"([{"label": "a", "caches": [], "steps": 0}])"); },
               {"field \"steps\""});
  expect_error([&] { parse(R"([{"label": "a", "caches": [], "step": 4}])"); },
               {"unknown field \"step\""});
  expect_error([&] { parse(R"([{"label": "a", "caches": []}, {"label": "a", "caches": []}])"); },
               {"\"a\" is used twice"});
  expect_error(
      [&] { parse(R"([{"label": "a b", "caches": []}, {"label": "a/b", "caches": []}])"); },
      {"names the same files", "a_b"});
  expect_error([&] { parse(R"([{"label": "", "caches": []}])"); }, {"\"label\" is empty"});
}

TEST(ShowcaseSweep, BuiltInSweepsCoverEveryPolicy) {
  const std::vector<ShowcaseConfig> quick = showcase_sweep("quick");
  const std::vector<StepCachePolicy> policies = step_cache_policies();
  ASSERT_EQ(quick.size(), 2 + policies.size());
  EXPECT_EQ(quick[0].label, "uncached");
  EXPECT_EQ(quick[1].label, "kv");
  for (size_t i = 0; i < policies.size(); ++i) {
    EXPECT_TRUE(quick[2 + i].kv);
    ASSERT_EQ(quick[2 + i].step_caches.size(), 1u);
    EXPECT_EQ(quick[2 + i].step_caches[0].rfind(policies[i].name, 0), 0u);
  }
  const std::vector<ShowcaseConfig> full = showcase_sweep("full");
  // Three settings per policy, and TaylorSeer's fourth: its DMD forecaster.
  EXPECT_EQ(full.size(), 2 + policies.size() * 3 * 2 + 2 + 12);
  EXPECT_EQ(std::count_if(full.begin(), full.end(),
                          [](const ShowcaseConfig& c) {
                            return c.label == "kv+taylorseer:forecaster=dmd,interval=2";
                          }),
            1);
  // Each written as a sweep file reads back the same, and passes the registry's checks.
  for (const auto& sweep : {quick, full}) {
    const std::vector<ShowcaseConfig> back =
        parse_showcase_sweep(showcase_sweep_json(sweep), "round trip");
    ASSERT_EQ(back.size(), sweep.size());
    for (size_t i = 0; i < sweep.size(); ++i) {
      EXPECT_EQ(back[i].label, sweep[i].label);
      EXPECT_EQ(back[i].kv, sweep[i].kv);
      EXPECT_EQ(back[i].step_caches, sweep[i].step_caches);
      EXPECT_EQ(back[i].steps, sweep[i].steps);
    }
  }
  expect_error([] { showcase_sweep("fast"); }, {"--sweep", "\"fast\""});
  EXPECT_EQ(showcase_slug("kv+taylorseer:interval=2"), "kv_taylorseer_interval_2");
  EXPECT_EQ(showcase_slug("a@8"), "a_8");
}

// What the fuzz target checks, in miniature for every test run: byte-level mutations of a
// valid manifest and sweep fail, if at all, with a flowkv::Error (never another exception).
TEST(ShowcaseManifest, MutatedFilesFailOnlyWithErrors) {
  const std::string manifest_text =
      test::read_file(std::string(FLOWKV_GOLDEN_DIR) + "/../showcase/cases.json");
  const std::string sweep_text =
      test::read_file(std::string(FLOWKV_GOLDEN_DIR) + "/../showcase/sweep.json");
  ASSERT_FALSE(manifest_text.empty());
  ASSERT_FALSE(sweep_text.empty());
  const char kBytes[] = "{}[]\",:0123456789-.eE \\nulltruefalse\x00\xff";
  uint64_t state = 12345;
  auto next = [&] {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return state >> 33;
  };
  int accepted = 0;
  for (int i = 0; i < 3000; ++i) {
    std::string t = (i % 2 ? manifest_text : sweep_text);
    for (int k = 0, n = 1 + static_cast<int>(next() % 3); k < n; ++k) {
      const size_t at = next() % t.size();
      const char b = kBytes[next() % (sizeof kBytes - 1)];
      switch (next() % 3) {
        case 0:
          t[at] = b;
          break;
        case 1:
          t.insert(at, 1, b);
          break;
        default:
          t.erase(at, 1 + next() % 8);
      }
      if (t.empty()) t = "{";
    }
    try {
      if (i % 2) {
        parse_showcase_manifest(t, "/base", "m");
      } else {
        parse_showcase_sweep(t, "s");
      }
      ++accepted;
    } catch (const Error&) {
    } catch (const std::exception& e) {
      ADD_FAILURE() << "a foreign exception: " << e.what() << "\non: " << t;
      return;
    }
  }
  EXPECT_GT(accepted, 0);
}

}  // namespace
}  // namespace flowkv
