// quantize: a checkpoint written as a GGUF file of a narrower weight type.
#include <cstdio>

#include "commands.h"
#include "flowkv/io.h"
#include "measure.h"

namespace flowkv::cli {

void add_quantize(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "quantize",
      "Write a checkpoint (diffusers folder, pipeline folder, .safetensors or .gguf) as a GGUF\n"
      "file whose weight matrices are --type (ggml's formats and reference quantizers; the\n"
      "`gguf` Python package and ggml read it). Tensor names stay those of the source, so\n"
      "flowkv loads it like the source (config.json travels in the file). A matrix whose rows\n"
      "are not whole blocks of the type falls back to q8_0, then f16; other tensors stay f32.");
  struct Opts {
    std::string in, out, type = "q8_0";
  };
  auto* o = new Opts;
  cmd->add_option("in", o->in, "checkpoint to read")->required();
  cmd->add_option("out", o->out, "GGUF file to write")->required();
  cmd->add_option("--type", o->type,
                  "weight type: q8_0, q6_k, q5_k, q5_1, q5_0, q4_k, q4_1, q4_0, bf16, f16")
      ->capture_default_str();
  cmd->callback([o] {
    std::exit(guarded([&] {
      const DType t = parse_weight_type(o->type, "--type");
      const QuantizeReport r = quantize_checkpoint(o->in, o->out, t, [](int64_t done, int64_t all) {
        progress("quantize: tensor " + std::to_string(done) + " of " + std::to_string(all));
      });
      progress_done();
      std::printf("wrote %s: %ld tensors (%ld %s, %ld matrices fell back), %.1f MB -> %.1f MB\n",
                  o->out.c_str(), r.tensors, r.quantized, o->type.c_str(), r.fallback,
                  static_cast<double>(r.bytes_in) / 1e6, static_cast<double>(r.bytes_out) / 1e6);
      return 0;
    }));
  });
}

}  // namespace flowkv::cli
