// libFuzzer target: Qwen2Tokenizer's files (Tokenizer::from_qwen2_files), the input being
// vocab.json, merges.txt and tokenizer_config.json separated by NUL bytes (a part left out is
// empty; make_seeds.sh writes the tiny golden folders so). Loading either succeeds or is a
// flowkv::Error naming the file; a tokenizer that loads encodes and decodes a few texts without
// crashing, every id it gives being inside its vocabulary.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "fuzz_common.h"
#include "text/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace flowkv::text;
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  std::string part[3];
  size_t pos = 0;
  for (int i = 0; i < 3 && pos <= input.size(); ++i) {
    const size_t end = i == 2 ? input.size() : std::min(input.find('\0', pos), input.size());
    part[i] = std::string(input.substr(pos, end - pos));
    pos = end + 1;
  }
  flowkv::fuzz::expect_only_flowkv_errors([&] {
    const Tokenizer t = Tokenizer::from_qwen2_files(part[0], part[1], part[2], "dir");
    const std::string texts[] = {"", "a photo of a cat", "  x\r\n\t<L><|im_start|>é 12345 'LL",
                                 part[1].substr(0, 64), part[2].substr(0, 64)};
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
