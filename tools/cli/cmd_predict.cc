// predict: the cost model's FLOPs, speedup and KV memory for a released shape or a config.
#include <cstdio>
#include <iostream>

#include "commands.h"
#include "flowkv/error.h"
#include "flowkv/limits.h"
#include "flowkv/model.h"
#include "flowkv/predict.h"
#include "measure.h"

namespace flowkv::cli {

namespace {
std::pair<int64_t, int64_t> parse_size(const std::string& s, const char* what) {
  return parse_dims(s, what, "1024x704 (width x height in pixels)", limits::kMaxImageSide,
                    limits::kMaxImageSide * limits::kMaxImageSide);
}
}  // namespace

void add_predict(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "predict",
      "Predict the FLOPs per step (by segment, uncached and cached), the speedup over n steps\n"
      "and the KV payload of the exact conditioning cache, from the cost model, and say which\n"
      "segments may be cached at all. Examples (the published figures):\n"
      "  flowkv predict --size 1024x1024 --ref 1024x704                (Klein 9B KV)\n"
      "  flowkv predict --model qwen-image-2.1 --ref 1248x864 --text-tokens 34 [--cfg]");
  struct Opts {
    std::string model = "klein-9b-kv", size = "1024x1024";
    std::vector<std::string> refs = {"1024x704"};
    int64_t text = 512;
    int steps = 4;
    bool cfg = false, no_refs = false;
    std::string kv_dtype = "bf16";
  };
  auto* o = new Opts;
  cmd->add_option(
         "--model", o->model,
         "released shape (" +
             [] {
               std::string s;
               for (const std::string& n : released_model_names()) s += (s.empty() ? "" : ", ") + n;
               return s;
             }() +
             "), a built-in model, or a config.json / checkpoint folder")
      ->capture_default_str();
  cmd->add_option("--size", o->size, "output image WxH in pixels")->capture_default_str();
  cmd->add_option("--ref", o->refs, "reference image WxH in pixels (repeat for several)")
      ->capture_default_str();
  cmd->add_flag("--no-refs", o->no_refs, "no reference images");
  cmd->add_option("--text-tokens", o->text, "text tokens (Klein pads prompts to 512)")
      ->check(CLI::Range(int64_t{1}, limits::kMaxTokens))
      ->capture_default_str();
  cmd->add_option("--steps", o->steps, "denoising steps")
      ->check(CLI::Range(1, static_cast<int>(limits::kMaxSteps)))
      ->capture_default_str();
  cmd->add_flag("--cfg", o->cfg, "classifier-free guidance: two branches, two caches");
  cmd->add_option("--kv-dtype", o->kv_dtype, "element type of the cached K/V: bf16 or f32")
      ->capture_default_str();
  cmd->callback([o] {
    std::exit(guarded([&] {
      PredictRequest r;
      r.model = o->model;
      const auto [w, h] = parse_size(o->size, "--size");
      r.target_tokens = latent_tokens_for_pixels(w, h);
      r.ref_tokens.clear();
      if (!o->no_refs) {
        for (const std::string& s : o->refs) {
          const auto [rw, rh] = parse_size(s, "--ref");
          r.ref_tokens.push_back(latent_tokens_for_pixels(rw, rh));
        }
      }
      r.text_tokens = o->text;
      r.steps = o->steps;
      r.cfg = o->cfg;
      FLOWKV_CHECK(o->kv_dtype == "bf16" || o->kv_dtype == "f32", "--kv-dtype is bf16 or f32");
      r.kv_bytes_per_element = o->kv_dtype == "bf16" ? 2 : 4;
      const FamilyInfo& family = detect_family(o->model);
      const KVPrediction p = predict(r);
      // Empty where the shape alone does not tell the rules (a FLUX.2 config).
      const std::string rules =
          cacheability_report(o->model, r.text_tokens, r.ref_tokens, r.target_tokens);
      if (family.exact_cache.empty()) {  // nothing to predict: say why
        std::cout << "model:      " << p.model << "\n"
                  << rules << "No exact conditioning cache exists for this model.\n";
        return 0;
      }
      std::cout << format_prediction(p) << rules;
      return 0;
    }));
  });
}

}  // namespace flowkv::cli
