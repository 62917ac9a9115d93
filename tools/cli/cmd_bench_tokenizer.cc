// bench-tokenizer: how fast a tokenizer.json loads and encodes prompts, with an empty word cache
// (a fresh process's first prompts) and with the words cached (a server's later ones).
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "commands.h"
#include "flowkv/error.h"
#include "flowkv/runtime.h"
#include "inputs.h"

namespace flowkv::cli {

namespace {

// Prompts as users write them, in several scripts (each a different path through the
// pre-tokenizer's regex and the byte-level BPE), when no --prompts file is given.
const std::vector<std::string> kDefaultPrompts = {
    "a photo of a cat sitting on a red chair in the sunlight, highly detailed",
    "A cinematic portrait of an astronaut riding a horse on Mars, 35mm, f/1.8, bokeh",
    "watercolor painting of a mountain lake at sunset, trending on artstation",
    "neon city at night, rain, reflections, ultra realistic, 4k HDR",
    "make it blue",
    "put the first left of the second",
    "Replace the background with a snowy forest; keep the person's face and pose unchanged.",
    "Ein Kätzchen schläft auf einem Sofa in Zürich, weiches Morgenlicht",
    "une crème brûlée sur une table en bois, photographie culinaire",
    "一只猫坐在红色椅子上，阳光，高清，水彩画",
    "東京の夜景、ネオン、雨上がりの街",
    "서울의 밤, 네온사인, 비 오는 거리",
    "кошка сидит на красном стуле, масляная живопись",
    "قطة تجلس على كرسي أحمر",
    "a poster that says \"OPEN 24/7\" in bold letters 😀🐱🚀 — 1920×1080",
    "isn't it the rock'n'roll o'clock? WE'LL SEE... they're 12345 miles away",
};

// A tokenizer.json, a folder holding one, or a pipeline folder (its tokenizer/tokenizer.json).
std::string tokenizer_file(const std::string& path) {
  namespace fs = std::filesystem;
  if (!fs::is_directory(path)) return path;
  for (const char* rel : {"tokenizer.json", "tokenizer/tokenizer.json"}) {
    const fs::path p = fs::path(path) / rel;
    if (fs::is_regular_file(p)) return p.string();
  }
  throw Error(path + ": no tokenizer.json in it, nor in its tokenizer/ folder");
}

void print_pass(const char* what, double s, size_t prompts, const TokenizerTiming& t) {
  s = std::max(s, 1e-9);  // a clock tick, for a pass over a few short prompts
  std::printf("%-32s %8.4f s  %9.0f prompts/s  %10.0f tokens/s  %6.1f MB/s\n", what, s,
              static_cast<double>(prompts) / s, static_cast<double>(t.tokens) / s,
              static_cast<double>(t.bytes) / s / 1e6);
}

}  // namespace

void add_bench_tokenizer(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "bench-tokenizer",
      "Benchmark a tokenizer.json: the time to load it, then passes over the prompts, the first\n"
      "from an empty word cache (a fresh process's first prompts), the later ones with the\n"
      "words cached (the fastest is printed). Every pass must give the first pass's ids.");
  struct Opts {
    std::string tokenizer, prompts;
    int runs = 3;
  };
  auto* o = new Opts;
  cmd->add_option("tokenizer", o->tokenizer,
                  "a tokenizer.json, a folder holding one, or a pipeline folder (its tokenizer/)")
      ->required();
  cmd->add_option("--prompts", o->prompts,
                  "a file of prompts, one per line (default: 16 built-in prompts in several "
                  "scripts)");
  cmd->add_option("--runs", o->runs, "passes over the prompts (the first one cold)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1000));
  cmd->callback([o] {
    std::exit(guarded([&] {
      const std::string file = tokenizer_file(o->tokenizer);
      const std::vector<std::string> prompts =
          o->prompts.empty() ? kDefaultPrompts : read_prompts(o->prompts);
      const TokenizerTiming t = time_tokenizer(file, prompts, o->runs);
      std::printf("%s: loaded in %.3f s\n", file.c_str(), t.load_seconds);
      std::printf("%zu prompts, %lld tokens, %lld bytes per pass\n", prompts.size(),
                  static_cast<long long>(t.tokens), static_cast<long long>(t.bytes));
      print_pass("first pass (empty word cache)", t.cold_seconds, prompts.size(), t);
      if (o->runs > 1) {
        const std::string what = "fastest of " + std::to_string(o->runs - 1) + " later";
        print_pass(what.c_str(), t.warm_seconds, prompts.size(), t);
      }
      return 0;
    }));
  });
}

}  // namespace flowkv::cli
