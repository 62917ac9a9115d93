// Where a Qwen2.5-VL text encoder's weights and config come from. Three forms are read:
//  - a transformers folder (config.json and model.safetensors or its shards), the diffusers
//    pipeline's text_encoder/;
//  - a GGUF that `flowkv quantize` wrote from such a folder: transformers' tensor names, the
//    config.json in metadata flowkv.config, the vision tower included;
//  - a llama.cpp GGUF of the language model (general.architecture "qwen2vl": what
//    convert_hf_to_gguf.py's Qwen2VLModel writes for Qwen2.5-VL, published as
//    Qwen2.5-VL-7B-Instruct-*.gguf and loaded by ComfyUI as Qwen-Image's text encoder). Its
//    tensors are renamed by the one table below; the config comes from its metadata. llama.cpp
//    keeps the vision tower in a separate mmproj file, which flowkv does not read: such a text
//    encoder serves text-to-image prompts, and a request that needs the vision tower (Edit-Plus)
//    is refused by name. llama.cpp does not permute q/k rows for this architecture
//    (Qwen2VLModel.modify_tensors only renames; the q/k permutation is LlamaModel's), so the
//    weights are used as stored.
// Any of them may be given as the path itself, as a folder holding it (a GGUF beside a
// config.json and no safetensors, or alone), or as a pipeline folder with text_encoder/.
#pragma once

#include <map>
#include <optional>
#include <string>

#include "io/checkpoint.h"
#include "io/gguf.h"
#include "io/json.h"
#include "models/qwen25_vl/config.h"

namespace flowkv::qwen25_vl {

inline constexpr const char* kLlamaCppArch = "qwen2vl";

// The llama.cpp name of a language-model weight of the Layout::kModel names
// ("model.layers.3.self_attn.q_proj.bias" -> "blk.3.attn_q.bias", "model.embed_tokens.weight"
// -> "token_embd.weight"); empty when the table has none.
std::string to_llama_cpp_name(const std::string& transformers_name);

// A GGUF in llama.cpp's names: its general.architecture is "qwen2vl", or it holds
// token_embd.weight (then another architecture is refused by config_from_llama_cpp).
bool is_llama_cpp_gguf(const GgufHeader& h);

// The config of a llama.cpp Qwen2.5-VL text GGUF: qwen2vl.embedding_length, block_count,
// feed_forward_length, attention.head_count, attention.head_count_kv,
// attention.layer_norm_rms_epsilon, rope.freq_base and rope.dimension_sections (t, h, w and a
// zero), context_length when present; the vocabulary size from token_embd.weight's rows; the
// image / video / vision start and end token ids from tokenizer.ggml.tokens when it holds
// "<|image_pad|>" etc., else Qwen2_5_VLConfig's; with `beside` (a config.json next to the file),
// its token ids and vision_config instead. An Error naming the key for one missing or
// malformed, and for another architecture.
Config config_from_llama_cpp(const GgufHeader& h, const Json* beside = nullptr);

// The language model's tensors of a llama.cpp GGUF under the transformers names
// (Layout::kModel) the loader reads, after checking every one against the table of `cfg` in
// llama.cpp's names (missing, wrong shape, unexpected: one Error naming them and the file).
// output.weight (the LM head) is left out.
std::map<std::string, TensorInfo> rename_llama_cpp_tensors(
    const std::map<std::string, TensorInfo>& tensors, const Config& cfg, const std::string& path);

struct TextEncoderSource {
  CheckpointScan scan;  // the tensors under the names the loaders read
  Config cfg;
  // config.json (or the GGUF's flowkv.config): where the vision tower's config is read. A
  // llama.cpp GGUF without a config.json beside it has none.
  std::optional<Json> model_config;
  std::string config_path;  // where model_config came from, for messages
  bool llama_cpp = false;   // a llama.cpp GGUF: no vision tower
};

// Headers only: nothing is mapped or allocated beyond them. A llama.cpp GGUF with a config.json
// beside it takes that file's token ids and vision config, after checking that its text fields
// agree with the metadata.
TextEncoderSource open_text_encoder(const std::string& path);

// The config alone: config.json when the folder has one, else the GGUF's.
Config text_encoder_config(const std::string& path);

}  // namespace flowkv::qwen25_vl
