// The limits flowkv checks before it allocates anything. Each is far above what a released
// model or a sensible request needs (noted beside it), and low enough that every size derived
// from values within them fits 64-bit arithmetic. Beyond them a call fails with a flowkv::Error
// naming the value and the limit. docs/reliability.md lists them.
#pragma once

#include <cstdint>

namespace flowkv::limits {

// Blocks of one model (FLUX.2 dev: 56, Qwen-Image: 60).
inline constexpr int64_t kMaxBlocks = 1024;
// Any width, channel count, head count or head dim of a model (FLUX.2 dev: 15,360).
inline constexpr int64_t kMaxWidth = 65536;
// MLP hidden size over model width (released: 3 and 4).
inline constexpr double kMaxMlpRatio = 64;
// Tokens of one sequence: target, text, references and condition images together
// (a 4096x4096 image is 65,536 tokens at /16).
inline constexpr int64_t kMaxTokens = int64_t{1} << 20;
// Reference or condition images of one request.
inline constexpr int64_t kMaxReferences = 64;
// Denoising steps of one request.
inline constexpr int64_t kMaxSteps = 100000;
// Threads of the kernels.
inline constexpr int kMaxThreads = 4096;
// Pixels per side of an image size given to predict or a pipeline.
inline constexpr int64_t kMaxImageSide = 65536;
// Pixels of one decoded image file (an 8000 x 6000 phone photo is 48M; references are resized
// to about 1M pixels before use). Checked from the file's header, before any pixel is allocated.
inline constexpr int64_t kMaxImagePixels = int64_t{1} << 26;
// Bytes of one image file read whole: an 8-bit RGBA PNG of kMaxImagePixels stored without
// compression is 256 MiB (a 48M-pixel photo compresses to well under 100 MiB).
inline constexpr int64_t kMaxImageFileBytes = int64_t{256} << 20;
// Bytes of a prompts file (one prompt per line; kMaxTextBytes bounds each prompt).
inline constexpr int64_t kMaxPromptFileBytes = int64_t{64} << 20;
// Bytes of the text written into a PNG's "parameters" chunk.
inline constexpr int64_t kMaxPngTextBytes = int64_t{1} << 20;
// Bytes of a JSON file read whole (config.json, shard index; real ones are < 1 MiB).
inline constexpr int64_t kMaxJsonFileBytes = int64_t{64} << 20;
// Tensors in one checkpoint (FLUX.2 dev holds ~800).
inline constexpr int64_t kMaxTensors = 1000000;

// GGUF metadata: keys of one file (llama.cpp models carry ~40), bytes of one string (a chat
// template is a few KiB) and elements of one array (a tokenizer vocabulary is <= 256k).
inline constexpr int64_t kMaxGgufKeys = 65536;
inline constexpr int64_t kMaxGgufStringBytes = int64_t{16} << 20;
inline constexpr int64_t kMaxGgufArrayElements = int64_t{1} << 24;

// Tokenizers (tokenizer.json) and text encoders: vocabulary entries (token ids of an encoder's
// embedding table too; Qwen3: 151,643 ranks, 151,936 embeddings) and merges (Qwen3: 151,387),
// bytes of one token (Qwen3: 256), added tokens (Qwen3: 26), and bytes of one text to encode
// (a prompt is a few KiB; a 16 MiB word takes ~400 MiB to merge).
inline constexpr int64_t kMaxVocab = int64_t{1} << 22;
inline constexpr int64_t kMaxMerges = int64_t{1} << 22;
inline constexpr int64_t kMaxTokenBytes = 4096;
inline constexpr int64_t kMaxAddedTokens = 65536;
inline constexpr int64_t kMaxTextBytes = int64_t{16} << 20;

// The reference store's entries (and its disk tier's files): tensors of one entry (a "prompt"
// entry holds a few, a "kv" entry one per KV memory), dimensions of one tensor (a KV memory has
// 4), and bytes of an entry kind's name ("latents").
inline constexpr int64_t kMaxStoreTensors = 4096;
inline constexpr int64_t kMaxStoreNdim = 8;
inline constexpr int64_t kMaxStoreKindBytes = 32;

}  // namespace flowkv::limits
