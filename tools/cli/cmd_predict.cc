// predict: the cost model's FLOPs, speedup and KV memory for a released shape or a config.
#include <cstdio>
#include <iostream>

#include "commands.h"
#include "flowkv/error.h"
#include "flowkv/generate.h"
#include "flowkv/limits.h"
#include "flowkv/model.h"
#include "flowkv/predict.h"
#include "flowkv/step_cache.h"
#include "measure.h"

namespace flowkv::cli {

namespace {
std::pair<int64_t, int64_t> parse_size(const std::string& s, const char* what) {
  return parse_dims(s, what, "1024x704 (width x height in pixels)", limits::kMaxImageSide,
                    limits::kMaxImageSide * limits::kMaxImageSide);
}
// The step caches' expected work over the run (flowkv/step_cache.h), after the exact cache's.
void print_step_caches(const std::vector<std::string>& specs, int steps, int branches) {
  if (specs.empty()) return;
  std::cout << "\nstep caches over " << steps << " steps"
            << (branches > 1 ? " (2 model calls a step)" : "") << ":\n";
  for (const StepCacheExpectation& e : expected_step_cache_work(specs, steps, branches)) {
    std::cout << "  " << e.spec << ": " << e.text;
    if (e.known) {
      char pct[32];
      std::snprintf(pct, sizeof pct, "%.0f%%", 100 * e.skipped_fraction);
      std::cout << " -> " << (e.upper_bound ? "at most " : "") << pct << " of the " << e.unit
                << " skipped";
    }
    std::cout << "\n";
  }
}
}  // namespace

void add_predict(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "predict",
      "Predict the FLOPs per step (by segment, uncached and cached), the speedup over n steps\n"
      "and the KV payload of the exact conditioning cache, from the cost model, and say which\n"
      "segments may be cached at all. Examples (the published figures):\n"
      "  flowkv predict --size 1024x1024 --ref 1024x704                (Klein 9B KV)\n"
      "  flowkv predict --model qwen-image-2.1 --ref 1216x864 --text-tokens 34 [--cfg]\n"
      "With a pipeline folder and -p, the token counts are the real ones: the prompt through\n"
      "the pipeline's tokenizer (and processor), the images (-r FILE) at the sizes the pipeline\n"
      "encodes them:\n"
      "  flowkv predict --model QWEN21_PIPELINE -p \"a cat\" -r photo.png [-n \"blurry\" "
      "--cfg-scale 4]");
  struct Opts {
    std::string model = "klein-9b-kv", size = "1024x1024";
    std::vector<std::string> refs = {"1024x704"};
    int64_t text = 512;
    int steps = 4;
    bool cfg = false, no_refs = false;
    std::string kv_dtype = "bf16";
    // A real request (pipeline folders): prompt, image files, negative prompt.
    std::string prompt, negative;
    bool has_prompt = false, has_negative = false;
    std::vector<std::string> images;
    float cfg_scale = 0.0f;  // the pipeline's default
    int64_t resolution = 0;
    std::vector<std::string> caches;  // step caches whose expected work is printed
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
  CLI::Option* size_opt =
      cmd->add_option("--size", o->size, "output image WxH in pixels")->capture_default_str();
  CLI::Option* ref_opt =
      cmd->add_option("--ref", o->refs,
                      "reference image WxH in pixels (repeat for several; a family that takes "
                      "none, NucleusMoE-Image, drops the default)")
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
  cmd->add_option("-p,--prompt", o->prompt,
                  "a real prompt (--model a pipeline folder): its token count from the tokenizer")
      ->each([o](const std::string&) { o->has_prompt = true; });
  cmd->add_option("-r,--image", o->images,
                  "with -p: an image file, encoded at the pipeline's size (repeat for several)");
  cmd->add_option("-n,--negative", o->negative, "with -p: a negative prompt (CFG)")
      ->each([o](const std::string&) { o->has_negative = true; });
  cmd->add_option("--cfg-scale", o->cfg_scale,
                  "with -p: the guidance scale (CFG above 1; default: the pipeline's)");
  cmd->add_option("--resolution", o->resolution,
                  "with -p: Qwen-Image-2.1's condition-image resolution (default 1024)");
  cmd->add_option("--cache", o->caches,
                  "a step cache (name[:k=v,...], repeatable): what its knobs alone say it skips "
                  "over --steps (a schedule, or a bound for one that decides from the data)");
  cmd->callback([o, size_opt, ref_opt] {
    std::exit(guarded([&] {
      PredictRequest r;
      r.model = o->model;
      const auto [w, h] = parse_size(o->size, "--size");
      r.target_tokens = latent_tokens_for_pixels(w, h);
      r.ref_tokens.clear();
      // The default reference is Klein's; a family without pictures takes only the ones asked.
      const bool default_refs = ref_opt->count() == 0;
      if (!o->no_refs && !o->has_prompt &&
          !(default_refs && !detect_family(o->model).takes_images)) {
        for (const std::string& s : o->refs) {
          const auto [rw, rh] = parse_size(s, "--ref");
          r.ref_tokens.push_back(latent_tokens_for_pixels(rw, rh));
        }
      }
      r.text_tokens = o->text;
      r.steps = o->steps;
      r.cfg = o->cfg;
      if (o->has_prompt) {  // the real layout of this request
        GenerateRequest g;
        g.prompt = o->prompt;
        g.negative_prompt = o->negative;
        g.has_negative_prompt = o->has_negative;
        g.cfg_scale = o->cfg_scale;
        g.resolution = o->resolution;
        g.references = o->images;
        if (size_opt->count() > 0) std::tie(g.width, g.height) = parse_size(o->size, "--size");
        const GenerateLayout l = generate_layout(o->model, g);
        r.model = l.transformer;
        r.text_tokens = l.text_tokens;
        r.ref_tokens = l.image_tokens;
        r.target_tokens = l.target_tokens;
        r.cfg = l.cfg;
        int64_t prefix = l.text_tokens;
        std::cout << "tokens:     text " << l.text_tokens;
        for (size_t i = 0; i < l.image_tokens.size(); ++i) {
          std::cout << ", image " << i + 1 << " " << l.image_tokens[i] << " ("
                    << l.image_sizes[i].first << "x" << l.image_sizes[i].second << ")";
          prefix += l.image_tokens[i];
        }
        std::cout << ", target " << l.target_tokens << " (" << l.width << "x" << l.height
                  << "); conditioning " << prefix << " per branch";
        if (l.cfg) std::cout << "; negative prompt text " << l.negative_text_tokens;
        std::cout << "\n";
      }
      FLOWKV_CHECK(o->kv_dtype == "bf16" || o->kv_dtype == "f32", "--kv-dtype is bf16 or f32");
      r.kv_bytes_per_element = o->kv_dtype == "bf16" ? 2 : 4;
      const FamilyInfo& family = detect_family(r.model);  // the transformer, with -p
      const KVPrediction p = predict(r);
      // Empty where the shape alone does not tell the rules (a FLUX.2 config).
      const std::string rules =
          cacheability_report(r.model, r.text_tokens, r.ref_tokens, r.target_tokens);
      if (family.exact_cache.empty()) {  // nothing to predict: say why
        std::cout << "model:      " << p.model << "\n"
                  << rules << "No exact conditioning cache exists for this model.\n";
        if (!family.no_exact_cache.empty()) std::cout << family.no_exact_cache << "\n";
        char line[160];
        std::snprintf(line, sizeof line,
                      "compute:    %.1f TFLOP per step (%d branch%s), %.1f TFLOP over %d steps\n",
                      p.uncached_step_flops / 1e12, p.branches, p.branches > 1 ? "es" : "",
                      p.uncached_step_flops * p.steps / 1e12, p.steps);
        std::cout << line;
        print_step_caches(o->caches, r.steps, p.branches);
        return 0;
      }
      std::cout << format_prediction(p) << rules;
      print_step_caches(o->caches, r.steps, p.branches);
      return 0;
    }));
  });
}

}  // namespace flowkv::cli
