// time_tokenizer: a tokenizer.json loaded and texts encoded, timed (the tokenizer benchmark's
// measurement).
#include <algorithm>
#include <chrono>
#include <vector>

#include "flowkv/error.h"
#include "flowkv/runtime.h"
#include "text/tokenizer.h"

namespace flowkv {

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

TokenizerTiming time_tokenizer(const std::string& tokenizer_json,
                               const std::vector<std::string>& texts, int runs) {
  FLOWKV_CHECK(runs >= 1 && runs <= 1000, "time_tokenizer: runs must be in [1, 1000]");
  FLOWKV_CHECK(!texts.empty(), "time_tokenizer: no texts to encode");
  TokenizerTiming t;
  auto t0 = std::chrono::steady_clock::now();
  // A fresh tokenizer: its word cache starts empty.
  const text::Tokenizer tok = text::Tokenizer::from_json_file(tokenizer_json);
  t.load_seconds = seconds_since(t0);
  std::vector<std::vector<int32_t>> first(texts.size()), ids(texts.size());
  t0 = std::chrono::steady_clock::now();
  for (size_t i = 0; i < texts.size(); ++i) first[i] = tok.encode(texts[i]);
  t.cold_seconds = seconds_since(t0);
  for (size_t i = 0; i < texts.size(); ++i) {
    t.tokens += static_cast<int64_t>(first[i].size());
    t.bytes += static_cast<int64_t>(texts[i].size());
  }
  for (int r = 1; r < runs; ++r) {
    t0 = std::chrono::steady_clock::now();
    for (size_t i = 0; i < texts.size(); ++i) ids[i] = tok.encode(texts[i]);
    const double s = seconds_since(t0);
    t.warm_seconds = r == 1 ? s : std::min(t.warm_seconds, s);
    FLOWKV_CHECK(ids == first, "time_tokenizer: pass ", r + 1,
                 " gave other ids than the first (the word cache changed a result)");
  }
  return t;
}

}  // namespace flowkv
