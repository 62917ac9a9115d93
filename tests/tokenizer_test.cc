// The Qwen3 tokenizer (src/text/) against the pinned `tokenizers` and transformers packages on
// the golden corpus of python/ref/make_tokenizer_corpus.py (plain ids, the FLUX.2 Klein prompt's
// ids and mask, decode), and every refusal of a malformed tokenizer.json or text.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <fstream>
#include <thread>

#include "flowkv/error.h"
#include "flowkv/limits.h"
#include "io/json.h"
#include "text/tokenizer.h"
#include "text/utf8.h"

namespace flowkv::text {
namespace {

const std::string kDir = FLOWKV_TOKENIZER_DIR;

const Tokenizer& qwen3() {
  static const Tokenizer t = Tokenizer::from_json_file(kDir + "/tokenizer.json");
  return t;
}

struct Record {
  std::string text, nfc;
  std::vector<int32_t> ids, klein;
  int64_t klein_untruncated = 0;
  bool truncated = false;
};
struct Corpus {
  uint32_t max_length = 0, pad_id = 0;
  std::vector<Record> records;
};

const Corpus& corpus() {
  static const Corpus c = [] {
    std::ifstream f(kDir + "/corpus.bin", std::ios::binary);
    EXPECT_TRUE(f.good()) << "cannot read " << kDir << "/corpus.bin";
    std::string data((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    size_t pos = 8;
    EXPECT_EQ(data.substr(0, 8), "FKVTOKC1");
    auto u32 = [&] {
      uint32_t v = 0;
      if (pos + 4 > data.size()) throw std::runtime_error("corpus.bin is truncated");
      std::memcpy(&v, data.data() + pos, 4);
      pos += 4;
      return v;
    };
    auto str = [&] {
      const uint32_t n = u32();
      if (pos + n > data.size()) throw std::runtime_error("corpus.bin is truncated");
      std::string s = data.substr(pos, n);
      pos += n;
      return s;
    };
    auto ids = [&] {
      std::vector<int32_t> v(u32());
      for (auto& x : v) x = static_cast<int32_t>(u32());
      return v;
    };
    Corpus c;
    const uint32_t n = u32();
    c.max_length = u32();
    c.pad_id = u32();
    for (uint32_t i = 0; i < n; ++i) {
      Record r;
      r.text = str();
      r.nfc = str();
      r.ids = ids();
      r.klein = ids();
      r.klein_untruncated = u32();
      r.truncated = u32() != 0;
      c.records.push_back(std::move(r));
    }
    EXPECT_EQ(pos, data.size());
    return c;
  }();
  return c;
}

// A prompt for a failure message: escaped, at most 120 characters.
std::string shown(const std::string& s) {
  std::string out;
  for (const char c : s.substr(0, 120)) {
    const auto b = static_cast<uint8_t>(c);
    if (b < 0x20 || b == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", b);
      out += buf;
    } else {
      out += c;
    }
  }
  return "\"" + out + (s.size() > 120 ? "\"..." : "\"");
}

TEST(Tokenizer, CorpusHasWhatTheGoldenTestNeeds) {
  const Corpus& c = corpus();
  EXPECT_GE(c.records.size(), 2000u);
  EXPECT_EQ(c.max_length, 512u);
  int truncated = 0;
  for (const Record& r : c.records) truncated += r.truncated;
  EXPECT_GE(truncated, 10);
}

TEST(Tokenizer, PlainIdsEqualTokenizers) {
  int bad = 0;
  for (const Record& r : corpus().records) {
    const std::vector<int32_t> got = qwen3().encode(r.text);
    if (got == r.ids) continue;
    if (++bad <= 10) {
      size_t k = 0;
      while (k < got.size() && k < r.ids.size() && got[k] == r.ids[k]) ++k;
      ADD_FAILURE() << "prompt " << shown(r.text) << ": " << got.size() << " ids, expected "
                    << r.ids.size() << "; first difference at " << k << ": "
                    << (k < got.size() ? got[k] : -1) << " vs "
                    << (k < r.ids.size() ? r.ids[k] : -1);
    }
  }
  EXPECT_EQ(bad, 0) << "of " << corpus().records.size() << " prompts";
}

TEST(Tokenizer, KleinIdsAndMaskEqualTransformers) {
  const Corpus& c = corpus();
  int bad = 0;
  for (const Record& r : c.records) {
    const PromptTokens got = klein_prompt_tokens(qwen3(), r.text, c.max_length);
    std::vector<int32_t> ids = r.klein, mask(r.klein.size(), 1);
    ids.resize(c.max_length, static_cast<int32_t>(c.pad_id));
    mask.resize(c.max_length, 0);
    const bool ok = got.ids == ids && got.mask == mask && got.truncated == r.truncated &&
                    got.untruncated_length == r.klein_untruncated;
    if (!ok && ++bad <= 10) {
      ADD_FAILURE() << "prompt " << shown(r.text) << ": truncated " << got.truncated << " vs "
                    << r.truncated << ", length " << got.untruncated_length << " vs "
                    << r.klein_untruncated;
    }
  }
  EXPECT_EQ(bad, 0) << "of " << c.records.size() << " prompts";
}

TEST(Tokenizer, DecodeGivesTheNormalisedText) {
  int bad = 0;
  for (const Record& r : corpus().records) {
    const bool ok = nfc(r.text) == r.nfc && qwen3().decode(r.ids) == r.nfc &&
                    qwen3().decode(qwen3().encode(r.text)) == r.nfc;
    if (!ok && ++bad <= 10) ADD_FAILURE() << "prompt " << shown(r.text);
  }
  EXPECT_EQ(bad, 0);
}

TEST(Tokenizer, VocabularyAndSpecialTokens) {
  const Tokenizer& t = qwen3();
  EXPECT_EQ(t.vocab_size(), 151669);
  EXPECT_EQ(t.token_id("<|endoftext|>"), 151643);
  EXPECT_EQ(t.token_id("<|im_start|>"), 151644);
  EXPECT_EQ(t.token_id("</think>"), 151668);
  EXPECT_EQ(t.token_id("\xC4\xA0"), 220);  // "Ġ", a space
  EXPECT_EQ(t.token_id("no such token"), std::nullopt);
  EXPECT_EQ(t.id_token(151645), "<|im_end|>");
  EXPECT_TRUE(t.is_special(151645));
  EXPECT_FALSE(t.is_special(151667));  // <think> is added but not special
  EXPECT_FALSE(t.is_special(220));
  EXPECT_EQ(t.decode(std::vector<int32_t>{64, 151645, 65}, true), "ab");
  EXPECT_EQ(t.decode(std::vector<int32_t>{64, 151645, 65}), "a<|im_end|>b");
  // Bytes that are no UTF-8 decode as U+FFFD, one per maximal invalid subpart, as `tokenizers`
  // does (128 is the byte 0xC4, 188 the byte 0x00).
  EXPECT_EQ(t.decode(std::vector<int32_t>{128, 188}), std::string("\xEF\xBF\xBD\0", 4));
  EXPECT_EQ(t.decode(std::vector<int32_t>{128, 128, 65}),
            "\xEF\xBF\xBD\xEF\xBF\xBD"
            "b");
  // Special tokens are cut out before NFC, so '>' + U+0338 does not compose into U+226F across
  // one (`tokenizers` 0.23.3 gives these ids).
  EXPECT_EQ(t.encode("<|im_end|>\u0338"), (std::vector<int32_t>{151645, 136, 116}));
  EXPECT_EQ(t.encode("a>\u0338"), (std::vector<int32_t>{64, 58994, 107}));
  EXPECT_THROW(t.decode(std::vector<int32_t>{-1}), Error);
  EXPECT_THROW(t.decode(std::vector<int32_t>{151669}), Error);
}

TEST(Tokenizer, KleinPromptTruncationIsReported) {
  const PromptTokens short_prompt = klein_prompt_tokens(qwen3(), "a cat");
  EXPECT_FALSE(short_prompt.truncated);
  EXPECT_EQ(short_prompt.untruncated_length, 14);
  EXPECT_EQ(short_prompt.ids.size(), 512u);
  std::string long_prompt;
  for (int i = 0; i < 600; ++i) long_prompt += " cat";
  const PromptTokens cut = klein_prompt_tokens(qwen3(), long_prompt);
  EXPECT_TRUE(cut.truncated);
  EXPECT_EQ(cut.untruncated_length, 612);
  EXPECT_EQ(cut.ids.size(), 512u);
  EXPECT_EQ(cut.mask, std::vector<int32_t>(512, 1));
  EXPECT_THROW(klein_prompt_tokens(qwen3(), "x", 0), Error);
}

TEST(Tokenizer, LongInputsStayFast) {
  // One 200,000-byte word (BPE with a priority queue: O(n log n)), runs of spaces and newlines
  // (the regex's back-tracking is linear) and a mixed megabyte.
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_FALSE(qwen3().encode(std::string(200000, 'a')).empty());
  EXPECT_FALSE(qwen3().encode("x" + std::string(200000, ' ') + "y").empty());
  EXPECT_FALSE(qwen3().encode(std::string(100000, '\n') + std::string(100000, '\t')).empty());
  std::string mixed;
  while (mixed.size() < (1u << 20)) mixed += "Ein Kätzchen 猫 🐱 12345 \r\n  'LL ";
  EXPECT_FALSE(qwen3().encode(mixed).empty());
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(s, 20.0);
  std::printf("long inputs (1.6 MB in all): %.2f s\n", s);
}

TEST(Tokenizer, ThreadsShareOneTokenizer) {
  const auto& records = corpus().records;
  const Tokenizer t = Tokenizer::from_json_file(kDir + "/tokenizer.json");
  std::vector<int> bad(2, 0);
  std::vector<std::thread> threads;
  for (int k = 0; k < 2; ++k) {
    threads.emplace_back([&, k] {
      for (size_t i = k; i < records.size(); i += 2)
        bad[k] += t.encode(records[i].text) != records[i].ids;
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(bad[0] + bad[1], 0);
}

// Invalid UTF-8: an Error naming the offset of the first bad byte.
TEST(Tokenizer, InvalidUtf8IsAnErrorNamingTheByte) {
  const std::pair<std::string, int> cases[] = {
      {"ab\x80", 2},          {"\xC0\x80", 0},
      {"ok \xED\xA0\x80", 3}, {"\xF5\x80\x80\x80", 0},
      {"caf\xC3", 3},         {"\xF4\x90\x80\x80", 0},
      {"x\xE2\x82", 1},       {std::string("a\0\xFF", 3), 2}};
  for (const auto& [text, offset] : cases) {
    try {
      qwen3().encode(text);
      ADD_FAILURE() << shown(text) << " was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("not valid UTF-8: byte " + std::to_string(offset) + " "),
                std::string::npos)
          << e.what();
    }
  }
  EXPECT_EQ(qwen3().encode(std::string("a\0b", 3)).size(), 3u);  // NUL is valid UTF-8
  try {
    qwen3().encode(std::string(limits::kMaxTextBytes + 1, 'a'));
    ADD_FAILURE() << "an oversized text was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("longer than the limit of 16777216"), std::string::npos)
        << e.what();
  }
}

// A minimal valid byte-level tokenizer.json: the 256 byte tokens, one merge, one added token.
Json minimal() {
  Json vocab = Json::object();
  const ByteLevelAlphabet& abc = byte_level_alphabet();
  for (int b = 0; b < 256; ++b) vocab[abc.utf8[b]] = b;
  vocab["ab"] = 256;
  Json j = {
      {"version", "1.0"},
      {"truncation", nullptr},
      {"padding", nullptr},
      {"added_tokens",
       Json::array({{{"id", 257}, {"content", "<s>"}, {"special", true}, {"normalized", false}}})},
      {"normalizer", {{"type", "NFC"}}},
      {"pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers",
         Json::array(
             {{{"type", "Split"},
               {"pattern", {{"Regex", "\\p{L}+|\\s+"}}},
               {"behavior", "Isolated"},
               {"invert", false}},
              {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}})}}},
      {"post_processor", {{"type", "ByteLevel"}}},
      {"decoder", {{"type", "ByteLevel"}}},
      {"model",
       {{"type", "BPE"}, {"vocab", vocab}, {"merges", Json::array({Json::array({"a", "b"})})}}}};
  return j;
}

void expect_error(const Json& j, const std::string& needle) {
  try {
    Tokenizer::from_json(j.dump(), "tok.json");
    ADD_FAILURE() << "accepted; expected an error with \"" << needle << "\"";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(Tokenizer, MinimalTokenizerWorks) {
  const Tokenizer t = Tokenizer::from_json(minimal().dump(), "tok.json");
  EXPECT_EQ(t.encode("ab<s>ba"), (std::vector<int32_t>{256, 257, 'b', 'a'}));
  EXPECT_EQ(t.vocab_size(), 258);
  EXPECT_EQ(t.decode(t.encode("ab<s>ba")), "ab<s>ba");
}

// Added tokens' single_word / lstrip / rstrip / normalized flags on a tiny tokenizer, against
// `tokenizers` 0.23.3 (the Qwen3 file sets none of them).
TEST(Tokenizer, AddedTokenFlagsMatchTokenizers) {
  const Tokenizer t = Tokenizer::from_json_file(FLOWKV_GOLDEN_DIR "/tokenizer/tiny_tokenizer.json");
  const std::pair<std::string, std::vector<int32_t>> cases[] = {
      {"abc ab", {257, 32, 256}},
      {"x <L>y", {120, 263, 121}},
      {"x  \t<L>  y", {120, 263, 32, 32, 121}},
      {"<s><L>", {262, 263}},
      {"a<R>  b", {97, 264, 98}},
      {"a<R>\n\nb", {97, 264, 98}},
      {"word words aword word_ word!", {265, 32, 119, 111, 114, 100, 115, 258, 119, 111, 114,
                                        100, 32, 119, 111, 114, 100, 95,  32,  265, 33}},
      {"e\u0301! \u00e9!", {266, 32, 266}},
      {"ccccc abcab", {261, 99, 32, 257, 256}},
      {" ab <s>  <L><R> word", {32, 256, 32, 262, 263, 264, 265}},
      {"wordword", {119, 111, 114, 100, 119, 111, 114, 100}},
      {"\u00e9 word", {195, 169, 32, 265}},
      {"<R> <L>", {264, 263}},
      {"  <L>", {263}},
  };
  for (const auto& [text, ids] : cases) EXPECT_EQ(t.encode(text), ids) << shown(text);
  EXPECT_EQ(t.decode(std::vector<int32_t>{262, 97, 264}, true), "a<R>");
}

// Issue 27: a hostile pre-tokenizer regex backtracks catastrophically ((a+)+$ takes 2^n steps on
// n letters: ~6 s for 29, centuries for 40). Each match has a budget; past it encode fails fast
// with an Error naming the tokenizer file, where it used to run for ever with no way to cancel.
TEST(Tokenizer, CatastrophicBacktrackingIsAnErrorWithinTheBudget) {
  for (const char* pattern : {"(a+)+$", "(\\p{L}+)+$", "(a|aa)+$", "(?:a|\\p{Ll})+$"}) {
    Json j = minimal();
    j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = pattern;
    const Tokenizer t = Tokenizer::from_json(j.dump(), "hostile/tokenizer.json");
    for (const std::string text : {std::string(29, 'a') + "!", std::string(40, 'a') + "!",
                                   "a photo of " + std::string(64, 'a') + "!"}) {
      const auto t0 = std::chrono::steady_clock::now();
      try {
        t.encode(text);
        ADD_FAILURE() << pattern << " on " << text << ": no error";
      } catch (const Error& e) {
        const std::string m = e.what();
        EXPECT_NE(m.find("hostile/tokenizer.json: pre_tokenizer"), std::string::npos) << m;
        EXPECT_NE(m.find("exceeded its backtracking budget"), std::string::npos) << m;
      }
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      EXPECT_LT(s, 0.5) << pattern << " on " << text.size() << " bytes";
    }
    EXPECT_FALSE(t.encode("a photo of a cat").empty());  // short runs stay within the budget
  }
  // The fuzz target's regression input (tests/fuzz/regressions/fuzz_tokenizer_json): the same
  // texts the target encodes.
  const std::string path = std::string(FLOWKV_GOLDEN_DIR) +
                           "/../fuzz/regressions/fuzz_tokenizer_json/"
                           "catastrophic_backtracking_split_regex";
  const Tokenizer t = Tokenizer::from_json_file(path);
  std::ifstream f(path, std::ios::binary);
  const std::string json((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_THROW(t.encode(json.substr(0, 64)), Error);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 0.5);
}

// The budget is proportional to the text: released patterns on long texts of the shapes that
// backtrack most (runs of spaces before a letter, of tabs and spaces, of newlines) pass.
TEST(Tokenizer, ReleasedPatternsStayWithinTheBudgetOnLongTexts) {
  for (const std::string& text : {std::string(1 << 18, ' ') + "x", std::string(1 << 18, ' ') + "!",
                                  std::string(1 << 17, '\t') + std::string(1 << 17, ' ') + "\nx",
                                  std::string(1 << 18, '\n') + " x"}) {
    EXPECT_FALSE(qwen3().encode(text).empty());
  }
  // GPT-2's pattern (ByteLevel with use_regex) too.
  Json j = minimal();
  j["pre_tokenizer"] = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}};
  const Tokenizer gpt2 = Tokenizer::from_json(j.dump(), "gpt2.json");
  EXPECT_FALSE(gpt2.encode(std::string(1 << 20, ' ') + "x").empty());
}

TEST(Tokenizer, MalformedJsonIsAnErrorNamingTheField) {
  EXPECT_THROW(Tokenizer::from_json("{", "tok.json"), Error);
  EXPECT_THROW(Tokenizer::from_json_file("/nonexistent/tokenizer.json"), Error);
  Json j = minimal();
  j.erase("model");
  expect_error(j, "field \"model\" is missing");
  j = minimal();
  j["model"]["type"] = "WordPiece";
  expect_error(j, "model.type: only BPE");
  j = minimal();
  j["model"].erase("vocab");
  expect_error(j, "model.vocab: missing");
  j = minimal();
  j["model"]["vocab"]["ab"] = 1e12;
  expect_error(j, "model.vocab[\"ab\"] must be an integer in [0, 4194303]");
  j = minimal();
  j["model"]["vocab"]["ab"] = -5;
  expect_error(j, "model.vocab[\"ab\"] must be a non-negative integer");
  j = minimal();
  j["model"]["vocab"]["ab"] = 3;
  expect_error(j, "id 3 is given to both");
  j = minimal();
  j["model"]["vocab"][std::string(5000, 'x')] = 300;
  expect_error(j, "a token must have 1 to 4096 bytes, got 5000");
  j = minimal();
  j["model"]["merges"] = Json::array({Json::array({"a", "zz"})});
  expect_error(j, "model.merges[0]: \"zz\" is not in model.vocab");
  j = minimal();
  j["model"]["merges"] = Json::array({"b a"});
  expect_error(j, "model.merges[0]: the merged token \"ba\" is not in model.vocab");
  j = minimal();
  j["model"]["merges"] = Json::array({"a b c"});
  expect_error(j, "model.merges[0]: a merge must be two tokens");
  j = minimal();
  j["model"]["merges"] = 7;
  expect_error(j, "model.merges: missing or not a list");
  j = minimal();
  j["model"]["vocab"].erase("\xC4\xA0");
  expect_error(j, "model.vocab has no token for byte 32");
  j = minimal();
  j["model"]["dropout"] = 0.1;
  expect_error(j, "BPE dropout is not supported");
  j = minimal();
  j["normalizer"] = {{"type", "NFKC"}};
  expect_error(j, "normalizer.type: only NFC");
  j = minimal();
  j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "(\\p{L";
  expect_error(j, "pre_tokenizer.pretokenizers[0].pattern: the pattern does not compile");
  j = minimal();
  j["pre_tokenizer"]["pretokenizers"][0]["behavior"] = "Removed";
  expect_error(j, "pretokenizers[0].behavior: only \"Isolated\"");
  j = minimal();
  j["pre_tokenizer"] = {{"type", "Whitespace"}};
  expect_error(j, "pre_tokenizer.type: only Split, ByteLevel and Sequence");
  j = minimal();
  j["decoder"] = {{"type", "WordPiece"}};
  expect_error(j, "decoder.type: only ByteLevel");
  j = minimal();
  j["truncation"] = {{"max_length", 5}};
  expect_error(j, "field \"truncation\" must be null");
  j = minimal();
  j["added_tokens"][0]["id"] = 1u << 30;
  expect_error(j, "added_tokens[0].id must be an integer in");
  j = minimal();
  j["added_tokens"][0]["content"] = "";
  expect_error(j, "added_tokens[0].content must have 1 to");
  j = minimal();
  j["added_tokens"].push_back({{"id", 258}, {"content", "<s>"}});
  expect_error(j, "added_tokens[1]: \"<s>\" is added twice");
  j = minimal();
  j["added_tokens"][0]["content"] = "ab";
  j["added_tokens"][0]["id"] = 3;
  expect_error(j, "added_tokens[0]: \"ab\" has id 256 in model.vocab but 3 here");
  j = minimal();
  j["added_tokens"][0]["id"] = 300;
  expect_error(j, "added_tokens[0]: id 300 for \"<s>\", but `tokenizers` would give it 257");
  j = minimal();
  j["added_tokens"][0]["special"] = "yes";
  expect_error(j, "added_tokens[0]: field \"special\" must be true or false");
}

}  // namespace
}  // namespace flowkv::text
