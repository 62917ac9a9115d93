// libFuzzer target: text for the Qwen3 tokenizer (the real tokenizer.json, loaded once). Any
// bytes: encode and the FLUX.2 Klein prompt either give ids or a flowkv::Error (invalid UTF-8);
// ids are in the vocabulary, the prompt rows have max_length entries, and decoding the ids gives
// the NFC form of the text back (byte-level BPE loses nothing; see the note on '<' / '>').
#include <cstddef>
#include <cstdint>
#include <string>

#include "fuzz_common.h"
#include "text/tokenizer.h"
#include "text/utf8.h"

namespace {
const flowkv::text::Tokenizer* qwen3 = nullptr;
}  // namespace

// Loading the 11 MB tokenizer.json takes seconds under the sanitizers: once, before the inputs'
// timeouts start.
extern "C" int LLVMFuzzerInitialize(int* /*argc*/, char*** /*argv*/) {
  qwen3 = new flowkv::text::Tokenizer(
      flowkv::text::Tokenizer::from_json_file(FLOWKV_TOKENIZER_DIR "/tokenizer.json"));
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace flowkv::text;
  const Tokenizer& tokenizer = *qwen3;
  const std::string text(reinterpret_cast<const char*>(data), size);
  flowkv::fuzz::expect_only_flowkv_errors([&] {
    const std::vector<int32_t> ids = tokenizer.encode(text);
    for (const int32_t id : ids) {
      FUZZ_ASSERT(id >= 0 && id < tokenizer.vocab_size(), "id %d outside the vocabulary", id);
    }
    const std::string back = tokenizer.decode(ids);
    // Added tokens are matched before NFC, as in `tokenizers`, so NFC never composes across one
    // ('>' + U+0338 is U+226F when whole): the round trip is exact for text without '<' / '>'.
    if (text.find_first_of("<>") == std::string::npos) {
      FUZZ_ASSERT(back == nfc(text), "decode(encode(x)) != NFC(x) (%zu ids)", ids.size());
    }
  });
  flowkv::fuzz::expect_only_flowkv_errors([&] {
    const int64_t max_length = 1 + static_cast<int64_t>(size % 64);
    const PromptTokens p = klein_prompt_tokens(tokenizer, text, max_length);
    FUZZ_ASSERT(static_cast<int64_t>(p.ids.size()) == max_length &&
                    static_cast<int64_t>(p.mask.size()) == max_length,
                "prompt rows of %zu and %zu, not %lld", p.ids.size(), p.mask.size(),
                static_cast<long long>(max_length));
    FUZZ_ASSERT(p.truncated == (p.untruncated_length > max_length), "truncated flag wrong");
  });
  return 0;
}
