// predict: the cost model's FLOPs, speedup and KV memory for a released shape or a config.
#include <cstdio>
#include <iostream>

#include "commands.h"
#include "flowkv/error.h"
#include "flowkv/predict.h"

namespace flowkv::cli {

namespace {
std::pair<int64_t, int64_t> parse_size(const std::string& s, const char* what) {
  int64_t w = 0, h = 0;
  FLOWKV_CHECK(std::sscanf(s.c_str(), "%ldx%ld", &w, &h) == 2 && w > 0 && h > 0, what,
               " must look like 1024x704 (width x height in pixels), got '", s, "'");
  return {w, h};
}
}  // namespace

void add_predict(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "predict",
      "Predict the FLOPs per step (by segment, uncached and cached), the speedup over n steps\n"
      "and the KV payload of the exact reference cache, from the cost model. Example (the\n"
      "published Klein 9B KV figures): flowkv predict --size 1024x1024 --ref 1024x704");
  struct Opts {
    std::string model = "klein-9b-kv", size = "1024x1024";
    std::vector<std::string> refs = {"1024x704"};
    int64_t text = 512;
    int steps = 4;
    bool cfg = false, no_refs = false;
    std::string kv_dtype = "bf16";
  };
  auto* o = new Opts;
  cmd->add_option("--model", o->model,
                  "released shape (klein-4b, klein-9b, klein-9b-kv, dev), config.json or "
                  "checkpoint folder")
      ->capture_default_str();
  cmd->add_option("--size", o->size, "output image WxH in pixels")->capture_default_str();
  cmd->add_option("--ref", o->refs, "reference image WxH in pixels (repeat for several)")
      ->capture_default_str();
  cmd->add_flag("--no-refs", o->no_refs, "no reference images");
  cmd->add_option("--text-tokens", o->text, "text tokens (Klein pads prompts to 512)")
      ->capture_default_str();
  cmd->add_option("--steps", o->steps, "denoising steps")->capture_default_str();
  cmd->add_flag("--cfg", o->cfg, "classifier-free guidance: two branches, two caches");
  cmd->add_option("--kv-dtype", o->kv_dtype, "element type of the cached K/V: bf16 or f32")
      ->capture_default_str();
  cmd->callback([o] {
    std::exit(guarded([&] {
      PredictRequest r;
      r.model = o->model;
      const auto [w, h] = parse_size(o->size, "--size");
      r.target_tokens = flux2_tokens_for_pixels(w, h);
      r.ref_tokens.clear();
      if (!o->no_refs) {
        for (const std::string& s : o->refs) {
          const auto [rw, rh] = parse_size(s, "--ref");
          r.ref_tokens.push_back(flux2_tokens_for_pixels(rw, rh));
        }
      }
      r.text_tokens = o->text;
      r.steps = o->steps;
      r.cfg = o->cfg;
      FLOWKV_CHECK(o->kv_dtype == "bf16" || o->kv_dtype == "f32", "--kv-dtype is bf16 or f32");
      r.kv_bytes_per_element = o->kv_dtype == "bf16" ? 2 : 4;
      std::cout << format_prediction(predict_klein_kv(r));
      return 0;
    }));
  });
}

}  // namespace flowkv::cli
