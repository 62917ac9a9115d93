// Byte-level BPE tokenizers loaded from a Hugging Face tokenizer.json (Qwen2TokenizerFast, the
// Qwen3 tokenizer of FLUX.2 Klein) or from Qwen2Tokenizer's vocab.json + merges.txt +
// tokenizer_config.json (the Qwen-Image pipeline folders: from_folder), giving the ids that the
// `tokenizers` package gives:
//
//   1. added tokens (special or not) are found in the raw text first, leftmost-longest, honouring
//      their single_word / lstrip / rstrip flags; tokens with "normalized": true are looked for
//      again in the normalised remainder;
//   2. the text between them is normalised (NFC, utf8proc);
//   3. the pre-tokenizer splits it (Split with a regex, "Isolated"; PCRE2), each piece is mapped
//      to GPT-2's byte-level alphabet (ByteLevel) and
//   4. merged by BPE (lowest rank first, leftmost on ties; a priority queue, O(n log n) per
//      piece; pieces seen before come from a cache).
//
// Supported tokenizer.json: model BPE (vocab, merges as "a b" strings or [a, b] pairs,
// ignore_merges, no dropout); normalizer null, NFC or a Sequence of NFC; pre_tokenizer Split
// (Regex or String pattern, Isolated, not inverted), ByteLevel (use_regex, add_prefix_space) or
// a Sequence of them; decoder null or ByteLevel; post_processor null or ByteLevel; truncation
// and padding null. Anything else is a flowkv::Error naming the field, as is any malformed or
// oversized field (limits::kMaxVocab, kMaxMerges, kMaxTokenBytes, kMaxAddedTokens), checked
// before anything is allocated for it.
//
// Text must be valid UTF-8 (Python strings, and so the `tokenizers` package, cannot hold
// anything else): a flowkv::Error names the offset of the first invalid byte.
//
// A Tokenizer is immutable after loading; encode and decode may be called from any number of
// threads at once (the word cache is locked).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace flowkv::text {

class Tokenizer {
 public:
  // Reads and checks a tokenizer.json; errors name the path and the field.
  static Tokenizer from_json_file(const std::string& path);
  // The same from JSON text; `what` names its source in errors.
  static Tokenizer from_json(const std::string& json_text, const std::string& what);

  // A tokenizer folder (a pipeline's tokenizer/): its tokenizer.json when it has one (as
  // from_json_file); else the files of Qwen2Tokenizer that the released Qwen-Image folders carry
  // (vocab.json, merges.txt, tokenizer_config.json), assembled into what transformers 5.24 builds
  // from them (from_qwen2_files). A folder with neither is an Error naming the files missing.
  // Each file is read with limits::kMaxJsonFileBytes as its cap.
  static Tokenizer from_folder(const std::string& dir);
  // Qwen2Tokenizer's files as text, `dir` naming them in errors ("<dir>/merges.txt: line 7:
  // ..."). What transformers 5.24 builds (Qwen2Tokenizer.__init__, TokenizersBackend), and so
  // the same ids as the tokenizer.json it would save:
  //   - model: BPE of vocab.json ({token: id}) and merges.txt ("a b" a line, rank by line; lines
  //     starting with "#version" skipped; "\n" or "\r\n" ends a line; a pair given twice keeps
  //     its last rank);
  //   - normalizer NFC; pre-tokenizer Split(Qwen2's regex, Isolated) then ByteLevel
  //     (add_prefix_space false, use_regex false); ByteLevel decoder;
  //   - added tokens: tokenizer_config.json's added_tokens_decoder in the order of their ids,
  //     with their content and flags ("normalized" defaulting to not "special"), then the named
  //     special tokens (bos/eos/unk/sep/pad/cls/mask_token, Qwen2Tokenizer's default
  //     "<|endoftext|>" for an absent eos/unk/pad_token, other *_token strings, then
  //     extra_special_tokens or else additional_special_tokens), each as AddedToken(content,
  //     special=True): one not added yet is added, one already added keeps its id and takes these
  //     flags (not normalized, no lstrip/rstrip/single_word), as `tokenizers` replaces a token
  //     added again. Ids are what `tokenizers` numbers them: a token outside vocab.json gets the
  //     next id after the vocabulary and the added tokens before it; an added_tokens_decoder id
  //     that differs is an Error, as is one that vocab.json gives another token.
  // Refused with an Error naming the file and field: a tokenizer_class other than
  // Qwen2Tokenizer(Fast), add_prefix_space, split_special_tokens, add_bos_token or
  // add_eos_token true (with that token set), no added_tokens_decoder, a malformed line or JSON
  // value, a token not in vocab.json, an id given twice, and any size past limits::kMaxVocab,
  // kMaxMerges, kMaxTokenBytes or kMaxAddedTokens (checked before anything is allocated for it).
  // Decoding follows `tokenizers` (clean_up_tokenization_spaces, a transformers-only step of
  // decode, is not applied; released Qwen files say false).
  static Tokenizer from_qwen2_files(const std::string& vocab_json, const std::string& merges_txt,
                                    const std::string& tokenizer_config_json,
                                    const std::string& dir);

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  // The ids of utf8 (at most limits::kMaxTextBytes bytes). add_special_tokens asks for the
  // post-processor's tokens: the supported post-processors (ByteLevel, none) add none, as for
  // Qwen, so both values give the same ids; it is kept for the familiar signature.
  std::vector<int32_t> encode(std::string_view utf8, bool add_special_tokens = false) const;

  // The text of ids: byte-level tokens back to bytes, added tokens as their content (special
  // ones left out with skip_special_tokens), ill-formed UTF-8 replaced by U+FFFD as `tokenizers`
  // does. An id that is no token is an Error naming it.
  std::string decode(std::span<const int32_t> ids, bool skip_special_tokens = false) const;

  // One more than the largest id of the model's vocabulary and the added tokens (151,669 for
  // Qwen3: 151,643 BPE tokens and 26 added tokens), `len(tokenizer)` in transformers.
  int64_t vocab_size() const;
  // The id of a token (an added token's content, or a vocabulary entry in byte-level form).
  std::optional<int32_t> token_id(std::string_view token) const;
  // The token of an id, as token_id takes it.
  std::optional<std::string> id_token(int32_t id) const;
  // Whether id is an added token marked "special".
  bool is_special(int32_t id) const;

 private:
  struct Impl;
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// What diffusers 0.42.1's Flux2KleinPipeline and Flux2KleinKVPipeline give the text encoder
// for one prompt (_get_qwen3_prompt_embeds): the Qwen3 chat template for one user message with
// add_generation_prompt=True and enable_thinking=False,
//   "<|im_start|>user\n" + prompt + "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n",
// tokenized with padding="max_length", truncation=True, max_length (right side both: the
// tokenizer's defaults). Padding uses "<|endoftext|>" (the tokenizer's pad_token).
struct PromptTokens {
  std::vector<int32_t> ids;   // [max_length]
  std::vector<int32_t> mask;  // [max_length]: 1 for the prompt's tokens, 0 for padding
  // The template's tokens were more than max_length and were cut to max_length, as diffusers
  // does (the end of the prompt and the assistant turn are lost): a caller should say so.
  bool truncated = false;
  int64_t untruncated_length = 0;  // tokens before truncation
};
PromptTokens klein_prompt_tokens(const Tokenizer& tokenizer, std::string_view prompt,
                                 int64_t max_length = 512);

// The chat-templated text klein_prompt_tokens tokenizes.
std::string klein_prompt_text(std::string_view prompt);

}  // namespace flowkv::text
