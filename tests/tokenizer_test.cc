// The Qwen3 tokenizer (src/text/) against the pinned `tokenizers` and transformers packages on
// the golden corpus of python/ref/make_tokenizer_corpus.py (plain ids, the FLUX.2 Klein prompt's
// ids and mask, decode), and every refusal of a malformed tokenizer.json or text. Then
// Qwen2Tokenizer's files (vocab.json + merges.txt + tokenizer_config.json, from_folder): the
// Qwen3 tokenizer written as those files gives the tokenizer.json's ids on the corpus, the tiny
// cases of python/ref/dump_qwen2_slow_tokenizer.py give transformers' tokens and ids, and every
// malformed file is refused.
#include <gtest/gtest.h>

#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include "flowkv/error.h"
#include "flowkv/io.h"
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

// A pair merged twice keeps its last rank, as `tokenizers` 0.23.3 builds its merge map (from a
// tokenizer.json and from merges.txt alike): with "b c", "a b", "b c", "abc" is "ab" + "c".
TEST(Tokenizer, APairMergedTwiceKeepsItsLastRank) {
  Json j = minimal();
  j["model"]["vocab"]["bc"] = 258;
  j["model"]["vocab"]["<s>"] = 257;
  j["model"]["merges"] = Json::array({"b c", "a b", "b c"});
  EXPECT_EQ(Tokenizer::from_json(j.dump(), "tok.json").encode("abc"),
            (std::vector<int32_t>{256, 'c'}));
  j["model"]["merges"] = Json::array({"a b", "b c", "a b"});
  EXPECT_EQ(Tokenizer::from_json(j.dump(), "tok.json").encode("abc"),
            (std::vector<int32_t>{'a', 258}));
}

// ---- Qwen2Tokenizer's files ----

namespace fs = std::filesystem;

void write_text(const fs::path& p, const std::string& s) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f << s;
  ASSERT_TRUE(f.good()) << "cannot write " << p;
}
std::string read_text(const fs::path& p) {
  return read_file(p.string(), limits::kMaxJsonFileBytes);
}

// A folder of this process under the test's temporary folder, removed at exit.
struct TempFolder {
  fs::path path;
  explicit TempFolder(const std::string& name)
      : path(fs::path(testing::TempDir()) /
             ("flowkv-" + name + "-" + std::to_string(static_cast<long>(getpid())))) {
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempFolder() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

// The Qwen3 tokenizer as the Qwen2Tokenizer files of a released pipeline folder, derived from the
// unpacked tokenizer.json as transformers' slow Qwen2Tokenizer saves them: vocab.json its
// model.vocab, merges.txt "#version: 0.2" and one "a b" line a merge in rank order, and the
// package's own tokenizer_config.json (added_tokens_decoder, tokenizer_class Qwen2Tokenizer).
// (transformers 5.24 builds from these files the very tokenizer of the tokenizer.json, post-
// processor aside: python/ref/dump_qwen2_slow_tokenizer.py --check-qwen3.)
const TempFolder& qwen3_slow_folder() {
  static const TempFolder dir = [] {
    TempFolder d("qwen3-slow");
    const Json j = read_json_file(kDir + "/tokenizer.json");
    write_text(d.path / "vocab.json", j["model"]["vocab"].dump());
    std::string merges = "#version: 0.2\n";
    for (const Json& m : j["model"]["merges"])
      merges += m[0].get<std::string>() + " " + m[1].get<std::string>() + "\n";
    write_text(d.path / "merges.txt", merges);
    write_text(d.path / "tokenizer_config.json", read_text(kDir + "/tokenizer_config.json"));
    return d;
  }();
  return dir;
}
const Tokenizer& qwen3_slow() {
  static const Tokenizer t = Tokenizer::from_folder(qwen3_slow_folder().path.string());
  return t;
}

TEST(Qwen2Files, CorpusIdsEqualTheTokenizerJson) {
  int same_as_json = 0, same_as_golden = 0, klein_same = 0, shown_failures = 0;
  const Corpus& c = corpus();
  for (const Record& r : c.records) {
    const std::vector<int32_t> got = qwen3_slow().encode(r.text);
    same_as_json += got == qwen3().encode(r.text);
    same_as_golden += got == r.ids;
    klein_same += klein_prompt_tokens(qwen3_slow(), r.text, c.max_length).ids ==
                  klein_prompt_tokens(qwen3(), r.text, c.max_length).ids;
    if (got != r.ids && ++shown_failures <= 10) ADD_FAILURE() << "prompt " << shown(r.text);
  }
  const int n = static_cast<int>(c.records.size());
  EXPECT_EQ(same_as_json, n);
  EXPECT_EQ(same_as_golden, n);
  EXPECT_EQ(klein_same, n);
  std::printf(
      "Qwen2Tokenizer files: %d/%d prompts give the tokenizer.json's ids, %d/%d the golden "
      "ids, %d/%d the same Klein prompt\n",
      same_as_json, n, same_as_golden, n, klein_same, n);
}

TEST(Qwen2Files, VocabularyAddedTokensAndDecodeEqualTheTokenizerJson) {
  const Tokenizer& a = qwen3_slow();
  const Tokenizer& b = qwen3();
  ASSERT_EQ(a.vocab_size(), b.vocab_size());
  for (int32_t id = 0; id < b.vocab_size(); ++id) {
    ASSERT_EQ(a.id_token(id), b.id_token(id)) << id;
    ASSERT_EQ(a.is_special(id), b.is_special(id)) << id;
  }
  for (const Record& r : corpus().records) {
    ASSERT_EQ(a.decode(r.ids), b.decode(r.ids));
    ASSERT_EQ(a.decode(r.ids, true), b.decode(r.ids, true));
  }
}

TEST(Qwen2Files, FromFolderPrefersTheTokenizerJson) {
  // The unpacked Qwen3 folder holds tokenizer.json and tokenizer_config.json only.
  const Tokenizer t = Tokenizer::from_folder(kDir);
  EXPECT_EQ(t.vocab_size(), qwen3().vocab_size());
  EXPECT_EQ(t.encode("a photo of a cat<|im_end|>"), qwen3().encode("a photo of a cat<|im_end|>"));
  // A broken tokenizer.json is its error, not a fall-back to the other files.
  const TempFolder d("qwen2-prefer");
  for (const char* f : {"vocab.json", "merges.txt", "tokenizer_config.json"})
    fs::copy_file(qwen3_slow_folder().path / f, d.path / f);
  write_text(d.path / "tokenizer.json", "{");
  try {
    Tokenizer::from_folder(d.path.string());
    ADD_FAILURE() << "a broken tokenizer.json was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tokenizer.json"), std::string::npos) << e.what();
  }
}

TEST(Qwen2Files, AFolderWithoutTheFilesIsAnErrorNamingThem) {
  const TempFolder d("qwen2-missing");
  auto expect_missing = [&](const std::string& needle) {
    try {
      Tokenizer::from_folder(d.path.string());
      ADD_FAILURE() << "accepted; expected an error with \"" << needle << "\"";
    } catch (const Error& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find(d.path.string() + ": no tokenizer.json, and no Qwen2Tokenizer files"),
                std::string::npos)
          << m;
      EXPECT_NE(m.find(needle), std::string::npos) << m;
    }
  };
  expect_missing("missing: vocab.json, merges.txt, tokenizer_config.json)");
  write_text(d.path / "vocab.json", "{}");
  expect_missing("missing: merges.txt, tokenizer_config.json)");
  write_text(d.path / "merges.txt", "");
  expect_missing("missing: tokenizer_config.json)");
  EXPECT_THROW(Tokenizer::from_folder((d.path / "nonexistent").string()), Error);
  // A folder where a file should be: read_file's error.
  fs::create_directories(d.path / "tokenizer_config.json");
  try {
    Tokenizer::from_folder(d.path.string());
    ADD_FAILURE() << "a folder was read as tokenizer_config.json";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tokenizer_config.json"), std::string::npos) << e.what();
  }
}

// The cases of python/ref/dump_qwen2_slow_tokenizer.py: transformers 5.24's Qwen2Tokenizer
// from tiny folders (added_tokens_decoder order and flags, named special tokens outside it and
// their flags and order, a vocabulary token added, merges.txt with "#version" lines, CRLF, no
// final newline and a pair merged twice).
TEST(Qwen2Files, TinyCasesEqualTransformers) {
  const std::string root = FLOWKV_GOLDEN_DIR "/tokenizer/qwen2_slow";
  const Json expected = read_json_file(root + "/expected.json");
  ASSERT_EQ(expected["cases"].size(), 4u);
  for (const auto& [name, c] : expected["cases"].items()) {
    SCOPED_TRACE(name);
    const Tokenizer t = Tokenizer::from_folder(root + "/" + name);
    EXPECT_EQ(t.vocab_size(), c["len"].get<int64_t>());
    for (const Json& a : c["added"]) {
      const auto id = a["id"].get<int32_t>();
      const auto content = a["content"].get<std::string>();
      EXPECT_EQ(t.token_id(content), id) << content;
      EXPECT_EQ(t.id_token(id), content);
      EXPECT_EQ(t.is_special(id), a["special"].get<bool>()) << content;
    }
    const Json& texts = expected["texts"];
    for (size_t i = 0; i < texts.size(); ++i) {
      const auto text = texts[i].get<std::string>();
      const std::vector<int32_t> got = t.encode(text);
      EXPECT_EQ(got, c["plain_ids"][i].get<std::vector<int32_t>>()) << shown(text);
      EXPECT_EQ(got, c["ids"][i].get<std::vector<int32_t>>()) << shown(text);
    }
  }
}

// The tiny qwen_layout case's files, to break one at a time.
struct SlowFiles {
  std::string vocab, merges;
  Json config;
};
SlowFiles tiny_slow() {
  const std::string d = FLOWKV_GOLDEN_DIR "/tokenizer/qwen2_slow/qwen_layout/";
  return {read_text(d + "vocab.json"), read_text(d + "merges.txt"),
          parse_json(read_text(d + "tokenizer_config.json"), "tokenizer_config.json")};
}
void expect_slow_error(const SlowFiles& f, const std::string& needle) {
  try {
    Tokenizer::from_qwen2_files(f.vocab, f.merges, f.config.dump(), "dir");
    ADD_FAILURE() << "accepted; expected an error with \"" << needle << "\"";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(Qwen2Files, MalformedFilesAreErrorsNamingTheFileAndField) {
  {
    const SlowFiles f = tiny_slow();
    EXPECT_EQ(Tokenizer::from_qwen2_files(f.vocab, f.merges, f.config.dump(), "dir").vocab_size(),
              269);
  }
  const Json vocab0 = parse_json(tiny_slow().vocab, "vocab.json");
  auto with_vocab = [&](const Json& v) {
    SlowFiles f = tiny_slow();
    f.vocab = v.dump();
    return f;
  };
  auto with_merges = [&](const std::string& m) {
    SlowFiles f = tiny_slow();
    f.merges = m;
    return f;
  };
  auto with_config = [&](const char* key, const Json& value) {
    SlowFiles f = tiny_slow();
    if (value.is_discarded())
      f.config.erase(key);
    else
      f.config[key] = value;
    return f;
  };
  const Json erase = Json(Json::value_t::discarded);

  // vocab.json
  SlowFiles f = tiny_slow();
  f.vocab = "{\"a\": 1,";
  expect_slow_error(f, "dir/vocab.json");
  expect_slow_error(with_vocab(Json::array({1, 2})), "dir/vocab.json must be a JSON object");
  Json v = vocab0;
  v["ab"] = "256";
  expect_slow_error(with_vocab(v), "dir/vocab.json[\"ab\"] must be");
  v = vocab0;
  v["ab"] = -1;
  expect_slow_error(with_vocab(v), "dir/vocab.json[\"ab\"] must be a non-negative integer");
  v = vocab0;
  v["ab"] = 1.5;
  expect_slow_error(with_vocab(v), "dir/vocab.json[\"ab\"] must be an integer");
  v = vocab0;
  v["ab"] = limits::kMaxVocab;
  expect_slow_error(with_vocab(v), "dir/vocab.json[\"ab\"] must be an integer in [0, 4194303]");
  v = vocab0;
  v["zz"] = 3;
  expect_slow_error(with_vocab(v), "dir/vocab.json: id 3 is given to both");
  v = vocab0;
  v[""] = 300;
  expect_slow_error(with_vocab(v), "a token must have 1 to 4096 bytes, got 0");
  v = vocab0;
  v[std::string(5000, 'x')] = 300;
  expect_slow_error(with_vocab(v), "a token must have 1 to 4096 bytes, got 5000");
  v = vocab0;
  v.erase("\xC4\xA0");  // (its id given to another token: the added tokens' ids stay right)
  v["zz"] = 32;
  SlowFiles no_space = with_vocab(v);
  no_space.merges = "a b\n";
  expect_slow_error(no_space, "dir/vocab.json has no token for byte 32");

  // merges.txt
  expect_slow_error(with_merges("a b\n\nab c\n"),
                    "dir/merges.txt: line 2: a merge must be two tokens separated by one space");
  expect_slow_error(with_merges("#version: 0.2\na b c\n"), "dir/merges.txt: line 2: a merge");
  expect_slow_error(with_merges("a  b\n"), "dir/merges.txt: line 1: a merge");
  expect_slow_error(with_merges("a b \n"), "dir/merges.txt: line 1: a merge");
  expect_slow_error(with_merges("ab\n"), "dir/merges.txt: line 1: a merge");
  expect_slow_error(with_merges("a\tb\n"), "dir/merges.txt: line 1: a merge");
  expect_slow_error(with_merges("# a comment\n"), "dir/merges.txt: line 1: a merge");
  expect_slow_error(with_merges("a zz\n"), "dir/merges.txt: line 1: \"zz\" is not in vocab.json");
  expect_slow_error(with_merges("a b\nc b\n"),
                    "dir/merges.txt: line 2: the merged token \"cb\" is not in vocab.json");
  // A last line without "\n" keeps its "\r" (so "b\r" is no token), as Rust's lines() reads it.
  expect_slow_error(with_merges("a b\r"), "dir/merges.txt: line 1: \"b\r\" is not in vocab.json");
  expect_slow_error(with_merges("\xEF\xBB\xBF#version: 0.2\na b\n"),
                    "dir/merges.txt: line 1: \"\xEF\xBB\xBF#version:\" is not in vocab.json");
  for (const char* ok :
       {"", "#version: 0.2", "#version: 0.2\n", "a b", "a b\r\n#versionX\r\nb c"}) {
    SlowFiles g = with_merges(ok);
    EXPECT_NO_THROW(Tokenizer::from_qwen2_files(g.vocab, g.merges, g.config.dump(), "dir")) << ok;
  }

  // tokenizer_config.json
  f = tiny_slow();
  expect_slow_error(with_config("tokenizer_class", "LlamaTokenizer"),
                    "dir/tokenizer_config.json: tokenizer_class is \"LlamaTokenizer\"");
  expect_slow_error(with_config("add_prefix_space", true), "add_prefix_space: true is not");
  expect_slow_error(with_config("split_special_tokens", true), "split_special_tokens: true");
  expect_slow_error(with_config("add_eos_token", true), "add_eos_token: true is not supported");
  EXPECT_NO_THROW({
    const SlowFiles g = with_config("add_bos_token", true);  // bos_token is null: no effect
    Tokenizer::from_qwen2_files(g.vocab, g.merges, g.config.dump(), "dir");
  });
  expect_slow_error(with_config("added_tokens_decoder", erase),
                    "dir/tokenizer_config.json: added_tokens_decoder is missing or not an object");
  f = tiny_slow();
  f.config = Json::array();
  expect_slow_error(f, "dir/tokenizer_config.json must be a JSON object");
  auto with_added = [&](const std::string& key, const Json& value) {
    SlowFiles g = tiny_slow();
    g.config["added_tokens_decoder"][key] = value;
    return g;
  };
  expect_slow_error(with_added("-1", {{"content", "x"}}),
                    "added_tokens_decoder[\"-1\"]: the key must be a token id");
  expect_slow_error(with_added("12a", {{"content", "x"}}), "the key must be a token id");
  expect_slow_error(with_added("99999999", {{"content", "x"}}),
                    "added_tokens_decoder[\"99999999\"]: id 99999999 is not below the limit");
  expect_slow_error(with_added("0262", {{"content", "<x>"}}),
                    "added_tokens_decoder[\"262\"]: the id is given twice");
  expect_slow_error(with_added("269", {{"content", "<|im_end|>"}}),
                    "added_tokens_decoder[\"269\"]: \"<|im_end|>\" is added twice");
  expect_slow_error(with_added("300", {{"content", "<x>"}}),
                    "added_tokens_decoder[\"300\"]: id 300 for \"<x>\", but `tokenizers` would "
                    "give it 269");
  expect_slow_error(with_added("5", {{"content", "<x>"}}),
                    "added_tokens_decoder[\"5\"]: id 5 is \"\xC4\x85\" in vocab.json");
  expect_slow_error(with_added("256", {{"content", "bc"}}),
                    "added_tokens_decoder[\"256\"]: \"bc\" has id 257 in vocab.json but 256 here");
  expect_slow_error(with_added("269", {{"content", "<x>"}, {"lstrip", "yes"}}),
                    "added_tokens_decoder[\"269\"]: field \"lstrip\" must be true or false");
  expect_slow_error(with_added("269", {{"content", "<x>"}, {"strip", true}}),
                    "added_tokens_decoder[\"269\"]: unknown field \"strip\"");
  expect_slow_error(with_added("269", {{"content", ""}}), "content must have 1 to 4096 bytes");
  expect_slow_error(with_added("269", Json::array()), "added_tokens_decoder[\"269\"] must be an");
  expect_slow_error(with_added("269", {{"lstrip", true}}), "field \"content\" must be a string");
  expect_slow_error(with_config("eos_token", 7),
                    "dir/tokenizer_config.json: eos_token must be a string, an AddedToken");
  // Two new model-specific tokens: transformers numbers them in the file's order, which the
  // parsed JSON does not keep.
  f = tiny_slow();
  f.config["z_token"] = "<Z>";
  f.config["a_token"] = "<A>";
  expect_slow_error(f, "is a second model-specific *_token outside added_tokens_decoder");
  f.config["a_token"] = "<|im_end|>";  // one new token, one already added: fine
  EXPECT_EQ(Tokenizer::from_qwen2_files(f.vocab, f.merges, f.config.dump(), "dir").token_id("<Z>"),
            269);
  expect_slow_error(with_config("additional_special_tokens", "x"),
                    "additional_special_tokens must be a list");
  // Sizes past the limits, before anything is allocated for them.
  f = tiny_slow();
  Json many = Json::object();
  for (int64_t i = 0; i <= limits::kMaxAddedTokens; ++i) many[std::to_string(262 + i)] = 0;
  f.config["added_tokens_decoder"] = many;
  expect_slow_error(f, "added_tokens_decoder: 65537 entries, more than the limit of 65536");
  expect_slow_error(with_merges(std::string(limits::kMaxMerges + 1, '\n')),
                    "lines, more merges than the limit of 4194304");
}

}  // namespace
}  // namespace flowkv::text
