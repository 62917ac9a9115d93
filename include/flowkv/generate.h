// From a prompt and pictures to a picture: a whole diffusers pipeline folder (model_index.json,
// transformer/, text_encoder/, tokenizer/, vae/) run stage by stage. Each stage loads its
// component, runs and releases it, so peak memory is the largest stage plus the request's caches,
// not the sum of the components.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "flowkv/error.h"
#include "flowkv/image.h"
#include "flowkv/step_cache.h"
#include "flowkv/store.h"

namespace flowkv {

// A conditioning image given in memory (a server's upload, a caller's decoded picture).
struct InputImage {
  std::string name;              // what messages call it ("image 1", a file name)
  std::vector<uint8_t> encoded;  // PNG or JPEG bytes, decoded as load_image decodes a file
  Image decoded;                 // used when `encoded` is empty
};

struct GenerateRequest {
  std::string prompt;
  // Classifier-free guidance, where the family runs it (Qwen-Image, Qwen-Image-2.1): a second
  // branch on the negative prompt, mixed as negative + cfg_scale * (positive - negative)
  // (Qwen-Image then rescales it to the positive branch's norm per token). On when cfg_scale > 1
  // and a negative prompt is given (diffusers' true_cfg_scale). 0: the pipeline class's default
  // (Qwen-Image 4, Qwen-Image-2.1 1: off). A family without it refuses cfg_scale > 1.
  std::string negative_prompt;
  bool has_negative_prompt = false;  // "" is a valid negative prompt
  float cfg_scale = 0.0f;
  // Conditioning images (PNG, JPEG), in order: FLUX.2 Klein's references, Qwen-Image-2.1's
  // condition images (which the prompt encoder sees too; their alpha is kept).
  std::vector<std::string> references;
  // Conditioning images in memory, after those of `references`.
  std::vector<InputImage> images;
  // Output size in pixels; 0: derived from the last image (Klein: its size; Qwen-Image-2.1:
  // its aspect ratio at `resolution`), else the pipeline's default.
  int64_t width = 0, height = 0;
  // Qwen-Image-2.1's output_resolution: condition images are resized to about resolution^2
  // pixels (multiples of 32) keeping their aspect ratio; 0: 1024, the pipeline's default.
  int64_t resolution = 0;
  int steps = 0;  // 0: the pipeline class's default (diffusers' __call__); < 0 is refused
  // FLUX.2 Klein's prompt rows (diffusers' max_sequence_length): the prompt is padded or cut to
  // this many tokens, all of which the transformer reads. 0: 512, or the tokenizer's
  // model_max_length (tokenizer_config.json) where that is smaller, as for a model trained on
  // shorter prompts (diffusers pads to 512 unless told; the released Klein models agree).
  int64_t max_sequence_length = 0;
  uint64_t seed = 0;     // torch.Generator("cpu").manual_seed(seed) noise, as diffusers draws it
  bool kv_cache = true;  // the exact conditioning cache where the model has one
  std::vector<std::string> step_caches;  // approximate step caches, e.g. "taylorseer:interval=2"
  // The transformer's compute type: auto, f32, bf16, int8. FLUX.2 Klein's text encoder follows
  // an explicit f32 or bf16 too; auto computes each component as its weights are stored (bf16
  // weights in bf16, as diffusers and transformers run a bf16 checkpoint).
  std::string dtype = "auto";
  // Decode in 512-pixel tiles blended over a quarter of a tile (diffusers' tiled_decode): peak
  // memory of a 1024x1024 decode 0.6 GiB instead of 2.1, seams where tiles meet. Off: untiled,
  // as diffusers decodes by default.
  bool vae_tiling = false;
};

// One stage's account: its time, the process's peak resident memory while it ran, and a line
// of what it did ("512 tokens, truncated from 700", "step 2: KV cache served the references").
struct StageReport {
  std::string name;
  double seconds = 0;
  int64_t peak_rss_bytes = -1;
  std::string detail;
};

// Progress as the stages run: a stage starts with its unit count (steps, tiles, layers), each
// unit ends with a note, the stage ends with its report.
struct GenerateProgress {
  std::function<void(const std::string& stage, int64_t units)> begin;
  std::function<void(int64_t done, int64_t units, const std::string& note)> advance;
  std::function<void(const StageReport& report)> end;
};

// One denoising step as it ends, for a caller that shows or serves progress.
struct StepEvent {
  int step = 0, steps = 0;  // step counts from 1
  double seconds = 0;       // this step's wall time (all CFG branches)
  // Whether the conditioning's K/V came from a cache at this step: the request's own exact
  // cache (steps after the first), or the reference store (any step, the first included).
  bool conditioning_cached = false;
  bool from_store = false;  // the reference store served them
};

struct GenerateResult;

// How a caller steers a request beyond its parameters (a server; the CLI over many prompts).
struct GenerateControl {
  // Polled before each stage and each denoising step: returning true stops the request with
  // flowkv::Cancelled within one step, and everything it allocated is released.
  std::function<bool()> cancelled;
  // Called after each denoising step.
  std::function<void(const StepEvent& event)> on_step;
  // Previews of the current x0 estimate (latents - sigma * velocity), decoded by the VAE:
  // `previews` of them (0-3, as OpenAI's partial_images), at evenly spaced steps before the
  // last; each arrives as a whole picture (pixels, size; stages and parameters empty).
  int previews = 0;
  std::function<void(int index, const StepEvent& at, const GenerateResult& preview)> on_preview;
  // Shared across requests: conditioning images' latents, prompt embeddings and the
  // conditioning K/V (store.h). nullptr: every request computes its own.
  std::shared_ptr<ReferenceStore> store;
};

// A request stopped by GenerateControl::cancelled.
class Cancelled : public Error {
 public:
  using Error::Error;
};

struct GenerateResult {
  int64_t width = 0, height = 0;
  int64_t channels = 3;         // 3: RGB; 4: RGBA (Qwen-Image-2.1's VAE decodes alpha)
  std::vector<uint8_t> pixels;  // [height, width, channels]
  // The generation parameters, one text as other tools write them in a PNG ("parameters").
  std::string parameters;
  std::vector<StageReport> stages;
  bool prompt_truncated = false;
  // The reference store's keys this request used (hex SHA-256), e.g. for a response header
  // that lets a router send requests with the same references to the same server; and what it
  // found there.
  std::vector<std::string> store_keys;
  int64_t store_hits = 0, store_misses = 0;
  // What each approximate step cache (GenerateRequest::step_caches) did over the denoising
  // loop (decisions per model call, calls / blocks / sublayers skipped), and what it measured
  // when asked to calibrate (flowkv calibrate reads TeaCache's pairs and MagCache's ratios).
  std::vector<StepCacheStats> step_caches;
};

GenerateResult generate(const std::string& pipeline_dir, const GenerateRequest& request,
                        const GenerateProgress& progress = {}, const GenerateControl& control = {});

// A request's token layout, from the pipeline folder's tokenizer (and processor) and the
// images' sizes, reading no weights: what the transformer will see, for predict and bench.
struct GenerateLayout {
  int64_t width = 0, height = 0;  // output pixels
  int64_t text_tokens = 0;  // the prompt's text rows (Klein: max_sequence_length, 512 by default)
  std::vector<int64_t> image_tokens;  // latent tokens of each conditioning image, in order
  std::vector<std::pair<int64_t, int64_t>> image_sizes;  // their pixels (width, height) as encoded
  int64_t target_tokens = 0;
  bool cfg = false;                  // a second (unconditional) branch runs
  int64_t negative_text_tokens = 0;  // its text rows, under CFG
  std::string transformer;           // the transformer folder, for predict
};
GenerateLayout generate_layout(const std::string& pipeline_dir, const GenerateRequest& request);

// Writes the picture as a PNG with its parameters in a "parameters" text chunk, atomically:
// the old file or the whole new one, never half of it.
void save_png(const std::string& path, const GenerateResult& result);
// The picture of a result as an Image (its pixels copied), e.g. for flowkv/metrics.h.
Image to_image(const GenerateResult& result);

}  // namespace flowkv
