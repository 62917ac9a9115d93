// libFuzzer target: the Qwen3-VL language side's hostile inputs (Qwen-Image 2.1's prompt
// encoder). Byte 0 even: the rest is a text_encoder config.json for qwen3_vl::Config::from_json.
// Byte 0 odd: byte 1 gives the image count (0-3), then 3 bytes per image its grid (t, h, w),
// the rest is the prompt; prompt_tokens (the golden tiny tokenizer and config) gives ids whose
// pads match the grids, the mask is L - drop long, and rope_positions accepts the ids and grids.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "fuzz_common.h"
#include "io/json.h"
#include "models/qwen3_vl/config.h"
#include "models/qwen3_vl/prompt.h"
#include "models/qwen3_vl/text_model.h"
#include "text/tokenizer.h"

namespace {
const flowkv::text::Tokenizer* tokenizer = nullptr;
const flowkv::qwen3_vl::Config* config = nullptr;
}  // namespace

extern "C" int LLVMFuzzerInitialize(int* /*argc*/, char*** /*argv*/) {
  const std::string dir = FLOWKV_GOLDEN_DIR "/qwen3_vl_text";
  tokenizer = new flowkv::text::Tokenizer(
      flowkv::text::Tokenizer::from_json_file(dir + "/processor/tokenizer.json"));
  config = new flowkv::qwen3_vl::Config(flowkv::qwen3_vl::Config::from_json(
      flowkv::read_json_file(dir + "/text_encoder/config.json"), "config.json"));
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace flowkv::qwen3_vl;
  if (size == 0) return 0;
  if (data[0] % 2 == 0) {
    const std::string text(reinterpret_cast<const char*>(data) + 1, size - 1);
    flowkv::fuzz::expect_only_flowkv_errors([&] {
      const Config c = Config::from_json(flowkv::parse_json(text, "config.json"), "config.json");
      FUZZ_ASSERT(c.text.head_dim % 2 == 0, "odd head_dim accepted");
    });
    return 0;
  }
  size_t at = 1;
  const int n = at < size ? data[at++] % 4 : 0;
  std::vector<Grid> grids;
  for (int i = 0; i < n && at + 3 <= size; ++i, at += 3) {
    grids.push_back({1 + data[at] % 2, 2 * (data[at + 1] % 9), 2 * (data[at + 2] % 9)});
  }
  const std::string prompt(reinterpret_cast<const char*>(data) + at, size - at);
  flowkv::fuzz::expect_only_flowkv_errors([&] {
    const PromptTokens p = prompt_tokens(*tokenizer, *config, prompt, grids);
    int64_t pads = 0, want = 0;
    for (const int32_t id : p.ids) pads += id == config->image_token_id;
    for (const Grid& g : grids) want += g[0] * g[1] * g[2] / 4;
    FUZZ_ASSERT(pads == want, "%lld pads for %lld grid tokens", static_cast<long long>(pads),
                static_cast<long long>(want));
    FUZZ_ASSERT(p.image_pad_mask.size() + static_cast<size_t>(p.drop_idx) == p.ids.size(),
                "mask of %zu after a drop of %lld from %zu ids", p.image_pad_mask.size(),
                static_cast<long long>(p.drop_idx), p.ids.size());
    const std::vector<int64_t> pos = rope_positions(*config, p.ids, grids);
    FUZZ_ASSERT(pos.size() == 3 * p.ids.size(), "positions of %zu for %zu ids", pos.size(),
                p.ids.size());
  });
  return 0;
}
