// generate: a prompt and reference pictures to a PNG, through a whole diffusers pipeline folder.
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <memory>
#include <tuple>

#include "commands.h"
#include "flowkv/error.h"
#include "flowkv/generate.h"
#include "flowkv/io.h"
#include "flowkv/limits.h"
#include "flowkv/pipeline.h"
#include "flowkv/step_cache.h"
#include "flowkv/store.h"
#include "inputs.h"
#include "measure.h"

namespace flowkv::cli {

namespace {

struct Opts {
  std::string model, negative, size, out = "out.png", dtype = "auto", memory;
  std::string transformer, text_encoder;
  std::vector<std::string> prompts;
  std::string prompts_file, store_ram = "2G", store_disk;
  std::vector<std::string> refs, caches;
  bool has_negative = false;
  float cfg_scale = 0.0f;
  int64_t resolution = 0, max_sequence_length = 0;
  int steps = 0;
  uint64_t seed = 0;
  bool vae_tiling = false;
};

std::string bar(int64_t done, int64_t units) {
  constexpr int kWidth = 24;
  if (units <= 0) return "";
  const int64_t fill = std::min<int64_t>(kWidth, done * kWidth / units);
  return "[" + std::string(static_cast<size_t>(fill), '#') +
         std::string(static_cast<size_t>(kWidth - fill), '.') + "] ";
}

std::string gib(int64_t bytes) {
  char s[32];
  std::snprintf(s, sizeof s, "%.2f GiB", static_cast<double>(bytes) / (1 << 30));
  return bytes < 0 ? "n/a" : s;
}

// The output's folder must take a new file: checked before minutes of work, not after.
void check_writable(const std::string& out) {
  std::filesystem::path dir = std::filesystem::path(out).parent_path();
  if (dir.empty()) dir = ".";
  FLOWKV_CHECK(std::filesystem::is_directory(dir), "-o ", out, ": the folder ", dir.string(),
               " does not exist");
  FLOWKV_CHECK(::access(dir.c_str(), W_OK) == 0, "-o ", out, ": the folder ", dir.string(),
               " is not writable");
  FLOWKV_CHECK(!std::filesystem::is_directory(out), "-o ", out, ": is a folder; give a file name");
}

// out.png -> out-3.png for the third of several pictures.
std::string numbered(const std::string& out, size_t i, size_t n) {
  if (n == 1) return out;
  const std::filesystem::path p(out);
  return (p.parent_path() /
          (p.stem().string() + "-" + std::to_string(i + 1) + p.extension().string()))
      .string();
}

GenerateRequest request_of(const Opts& o) {
  GenerateRequest r;
  r.negative_prompt = o.negative;
  r.has_negative_prompt = o.has_negative;
  r.cfg_scale = o.cfg_scale;
  r.resolution = o.resolution;
  r.references = o.refs;
  if (!o.size.empty()) {
    std::tie(r.width, r.height) = parse_dims(o.size, "--size", "512x512 (pixels, width x height)",
                                             limits::kMaxImageSide, limits::kMaxImagePixels);
  }
  r.steps = o.steps;
  r.max_sequence_length = o.max_sequence_length;
  r.seed = o.seed;
  r.dtype = o.dtype;
  r.vae_tiling = o.vae_tiling;
  for (const std::string& c : o.caches) {
    if (c == "kv") {
      r.kv_cache = true;
    } else if (c == "none") {
      r.kv_cache = false;
    } else {
      r.step_caches.push_back(c);
    }
  }
  return r;
}

int run(Opts o) {
  check_writable(o.out);
  if (!o.prompts_file.empty()) {
    const std::vector<std::string> more = read_prompts(o.prompts_file);
    o.prompts.insert(o.prompts.end(), more.begin(), more.end());
  }
  FLOWKV_CHECK(!o.prompts.empty(), "give a prompt (-p) or a file of prompts (--prompts)");
  // A link, device or FIFO in an output's place is refused now, not after the pictures.
  for (size_t i = 0; i < o.prompts.size(); ++i)
    check_replaceable(numbered(o.out, i, o.prompts.size()));
  GenerateProgress p;
  std::string stage;
  p.begin = [&](const std::string& name, int64_t units) {
    stage = name;
    progress(stage + ": " + (units > 0 ? bar(0, units) : std::string("...")));
  };
  p.advance = [&](int64_t done, int64_t units, const std::string& note) {
    progress(stage + ": " + bar(done, units) + note);
  };
  p.end = [&](const StageReport& r) {
    progress_done();
    std::fprintf(stderr, "%-10s %7.2f s  peak %s  %s\n", r.name.c_str(), r.seconds,
                 gib(r.peak_rss_bytes).c_str(), r.detail.c_str());
  };
  GenerateRequest req = request_of(o);
  // As diffusers warns: guidance needs both a scale above 1 and a negative prompt.
  if (req.cfg_scale > 1.0f && !req.has_negative_prompt) {
    std::fprintf(stderr,
                 "warning: --cfg-scale %g without a negative prompt (-n): classifier-free "
                 "guidance stays off\n",
                 static_cast<double>(req.cfg_scale));
  } else if (req.has_negative_prompt && req.cfg_scale != 0.0f && req.cfg_scale <= 1.0f) {
    std::fprintf(stderr,
                 "warning: a negative prompt without --cfg-scale above 1: classifier-free "
                 "guidance stays off\n");
  }
  // Several prompts share one reference store: the references' latents and K/V (and repeated
  // prompts' embeddings) are computed once. --store-disk keeps them for later runs too.
  GenerateControl control;
  if (o.prompts.size() > 1 || !o.store_disk.empty()) {
    control.store = std::make_shared<ReferenceStore>(StoreOptions{
        .ram_bytes = parse_bytes(o.store_ram, "--store-ram"), .disk_dir = o.store_disk});
  }
  // One picture: each stage loads its component and releases it (the smallest peak). Several:
  // the components stay loaded between pictures where they fit the machine's memory.
  const MemoryPolicy memory = !o.memory.empty()      ? parse_memory_policy(o.memory)
                              : o.prompts.size() > 1 ? MemoryPolicy::kAuto
                                                     : MemoryPolicy::kStaged;
  const Pipeline pipeline = Pipeline::open(o.model, {.memory = memory,
                                                     .dtype = o.dtype,
                                                     .transformer = o.transformer,
                                                     .text_encoder = o.text_encoder});
  // Every request check that needs no weights (images, sizes, steps) runs before any loads.
  req.prompt = o.prompts.front();
  const PreparedRequest first = pipeline.prepare(req);
  for (size_t i = 0; i < o.prompts.size(); ++i) {
    req.prompt = o.prompts[i];
    if (o.prompts.size() > 1)
      std::fprintf(stderr, "prompt %zu/%zu: %s\n", i + 1, o.prompts.size(), req.prompt.c_str());
    const GenerateResult res =
        pipeline.generate(i == 0 ? first : pipeline.prepare(req), p, control);
    if (res.prompt_truncated) {
      std::fprintf(stderr,
                   "warning: the prompt was longer than the text encoder reads; its end was "
                   "cut (as diffusers does)\n");
    }
    // What each step cache did, call by call (C computed, s skipped, p predicted, r reused,
    // a approximated), and the guidance, so a user sees the saving and the settings.
    for (const StepCacheStats& sc : res.step_caches) {
      std::fprintf(stderr, "step cache %s (%s): %s; %lld of %lld blocks skipped\n", sc.name.c_str(),
                   sc.settings.c_str(), sc.decisions.c_str(),
                   static_cast<long long>(sc.blocks_skipped),
                   static_cast<long long>(sc.blocks_skipped + sc.blocks_run));
    }
    const size_t cfg_at = res.parameters.find("CFG scale: ");
    if (cfg_at != std::string::npos) {
      const size_t end = res.parameters.find(',', cfg_at);
      std::fprintf(
          stderr, "guidance: %s\n",
          res.parameters.substr(cfg_at, end == std::string::npos ? end : end - cfg_at).c_str());
    }
    const std::string out = numbered(o.out, i, o.prompts.size());
    save_png(out, res);
    double total = 0;
    for (const StageReport& r : res.stages) total += r.seconds;
    std::printf("wrote %s (%ldx%ld) in %.2f s", out.c_str(), res.width, res.height, total);
    if (control.store) {
      std::printf(", reference store: %lld found, %lld computed",
                  static_cast<long long>(res.store_hits), static_cast<long long>(res.store_misses));
    }
    std::printf("\n");
  }
  return 0;
}

}  // namespace

std::vector<std::string> read_prompts(const std::string& path) {
  const std::string text = read_file(path, limits::kMaxPromptFileBytes, "--prompts file");
  std::vector<std::string> out;
  for (size_t begin = 0; begin < text.size();) {
    size_t end = text.find('\n', begin);
    if (end == std::string::npos) end = text.size();
    std::string line = text.substr(begin, end - begin);
    begin = end + 1;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") != std::string::npos) out.push_back(std::move(line));
  }
  FLOWKV_CHECK(!out.empty(), "--prompts ", path, ": no prompt in it");
  return out;
}

void add_generate(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "generate",
      "Turn a prompt (and pictures) into a PNG with a diffusers pipeline folder\n"
      "(model_index.json and its components): FLUX.2 Klein 4B / 9B (Flux2KleinPipeline), Klein\n"
      "9B KV (Flux2KleinKVPipeline) and Qwen-Image-2.1 (QwenImage21Pipeline: condition images,\n"
      "RGBA out, classifier-free guidance with -n and --cfg-scale). Stages run one at a time\n"
      "(prompt, references / conditions, denoise, decode); with one prompt each loads its\n"
      "component and releases it, so peak memory is the largest stage plus the KV cache\n"
      "(--memory). Requests are checked (pictures, sizes, steps) before any weight loads,\n"
      "defaults (steps) are the pipeline class's as diffusers has them, and the folder's\n"
      "scheduler/scheduler_config.json is read. Prints a progress\n"
      "bar per stage and each stage's time and peak memory; the PNG carries the parameters in\n"
      "a text chunk. Same inputs and seed give diffusers' picture (f32).");
  auto* o = new Opts;
  cmd->add_option("--model", o->model, "pipeline folder")->required();
  cmd->add_option("-p,--prompt", o->prompts,
                  "the prompt; repeat for several pictures with the same references (written as "
                  "OUT-1.png, OUT-2.png, ...; the references are encoded once)");
  cmd->add_option("--prompts", o->prompts_file, "a file of prompts, one per line (as repeated -p)");
  cmd->add_option("--store-ram", o->store_ram,
                  "with several prompts: memory the reference store keeps entries in (LRU)")
      ->capture_default_str();
  cmd->add_option("--store-disk", o->store_disk,
                  "a folder the reference store also keeps entries in, checked when read back: "
                  "later runs with the same references, prompts and weights reuse them");
  cmd->add_option("-n,--negative", o->negative,
                  "negative prompt for classifier-free guidance (Qwen-Image: on at scale 4 "
                  "unless --cfg-scale says otherwise; Qwen-Image-2.1: with --cfg-scale above 1)")
      ->each([o](const std::string&) { o->has_negative = true; });
  cmd->add_option("--cfg-scale", o->cfg_scale,
                  "guidance scale: negative + S x (positive - negative), 1 or below is off; "
                  "default: the pipeline's (Qwen-Image 4, Qwen-Image-2.1 1: off)")
      ->check(CLI::Range(0.0f, 100.0f));
  cmd->add_option("-r,--ref", o->refs,
                  "a reference / condition picture (PNG or JPEG); repeat for more");
  cmd->add_option("--size", o->size,
                  "WIDTHxHEIGHT in pixels (Klein: multiples of 16, default the last reference's "
                  "size; Qwen-Image-2.1: multiples of 32, default the last condition image's "
                  "aspect ratio at --resolution; else 1024x1024)");
  cmd->add_option("--resolution", o->resolution,
                  "Qwen-Image-2.1: condition images are resized to about RES x RES pixels "
                  "keeping their aspect ratio (default 1024)")
      ->check(CLI::Range(int64_t{32}, int64_t{4096}));
  cmd->add_option("--steps", o->steps,
                  "denoising steps (default: the pipeline class's, as diffusers' __call__: "
                  "Flux2KleinKVPipeline 4, Flux2KleinPipeline 50, QwenImage21Pipeline 40)")
      ->check(CLI::Range(1, static_cast<int>(limits::kMaxSteps)));
  cmd->add_option("--transformer", o->transformer,
                  "a transformer in place of the folder's: a GGUF file (flowkv quantize writes "
                  "one), a .safetensors file or a diffusers folder (stable-diffusion.cpp's "
                  "--diffusion-model); a GGUF file inside transformer/ is read as well");
  cmd->add_option("--text-encoder", o->text_encoder,
                  "a text encoder in place of the folder's (GGUF, safetensors or folder; "
                  "stable-diffusion.cpp's --llm)");
  cmd->add_option("--memory", o->memory,
                  "components between pictures: resident (loaded once, kept), staged (each stage "
                  "loads its component and releases it), auto (resident where the weights fit "
                  "3/4 of memory); default staged for one prompt, auto for several");
  cmd->add_option("--max-sequence-length", o->max_sequence_length,
                  "the prompt's length in tokens (diffusers' max_sequence_length): FLUX.2 "
                  "Klein pads or cuts to it (default 512, or the tokenizer's model_max_length "
                  "where smaller); Qwen-Image cuts to it (512); NucleusMoE-Image cuts to it "
                  "(1024, a multiple of 8)")
      ->check(CLI::Range(int64_t{1}, int64_t{limits::kMaxTokens}));
  cmd->add_option("--seed", o->seed, "seed of the initial noise (torch's CPU generator)")
      ->capture_default_str();
  cmd->add_option("--cache", o->caches,
                  "kv (default: the exact reference cache where the model has one), none, or an "
                  "approximate step cache POLICY[:key=value,...] (see `flowkv caches`); repeat "
                  "to combine");
  cmd->add_option("--dtype", o->dtype,
                  "transformer compute: auto (as the weights are stored), f32, bf16, int8; "
                  "f32 and bf16 apply to FLUX.2 Klein's text encoder too")
      ->capture_default_str();
  cmd->add_flag("--vae-tiling", o->vae_tiling,
                "decode in 512-pixel tiles: a quarter of the memory at 1024x1024, seams possible "
                "(diffusers' enable_tiling)");
  cmd->add_option("-o,--out", o->out, "PNG to write")->capture_default_str();
  cmd->callback([o] { std::exit(guarded([&] { return run(*o); })); });
}

}  // namespace flowkv::cli
