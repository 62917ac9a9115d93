// libFuzzer target: tokenizer.json text. Loading either succeeds or is a flowkv::Error naming
// the field; a tokenizer that loads encodes and decodes a few texts (its added tokens, pieces of
// the input) without crashing, every id it gives being inside its vocabulary.
#include <cstddef>
#include <cstdint>
#include <string>

#include "fuzz_common.h"
#include "text/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace flowkv::text;
  const std::string json(reinterpret_cast<const char*>(data), size);
  flowkv::fuzz::expect_only_flowkv_errors([&] {
    const Tokenizer t = Tokenizer::from_json(json, "tokenizer.json");
    const std::string texts[] = {"", "a photo of a cat", "  x\r\n\t<s><|im_start|>é 12345 'LL",
                                 json.substr(0, 64), json.substr(size / 2, 64)};
    for (const std::string& text : texts) {
      flowkv::fuzz::expect_only_flowkv_errors([&] {
        const std::vector<int32_t> ids = t.encode(text);
        for (const int32_t id : ids) {
          FUZZ_ASSERT(id >= 0 && id < t.vocab_size(), "id %d outside the vocabulary", id);
        }
        t.decode(ids);
      });
    }
  });
  return 0;
}
