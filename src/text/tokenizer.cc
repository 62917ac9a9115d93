// Loading a tokenizer.json (every field checked, sizes before allocation) and the encode /
// decode pipeline of tokenizer.h.
#include "text/tokenizer.h"

#include <utf8proc.h>

#include <algorithm>
#include <mutex>
#include <queue>
#include <unordered_map>

#include "flowkv/error.h"
#include "flowkv/io.h"
#include "flowkv/limits.h"
#include "io/json.h"
#include "io/mapped_file.h"
#include "text/regex.h"
#include "text/utf8.h"

namespace flowkv::text {

namespace {

struct AddedToken {
  std::string content;
  int32_t id = 0;
  bool single_word = false, lstrip = false, rstrip = false, normalized = true, special = false;
};

// Added tokens found leftmost-longest by walking a byte trie from each position (as the
// aho-corasick LeftmostLongest automaton of `tokenizers` finds them).
class AddedTrie {
 public:
  AddedTrie() : nodes_(1) {}
  void insert(const std::string& s, int32_t index) {
    int32_t node = 0;
    for (const char c : s) {
      const auto b = static_cast<uint8_t>(c);
      int32_t child = -1;
      for (const auto& [k, n] : nodes_[node].next) {
        if (k == b) child = n;
      }
      if (child < 0) {
        child = static_cast<int32_t>(nodes_.size());
        nodes_[node].next.emplace_back(b, child);
        nodes_.emplace_back();
      }
      node = child;
    }
    nodes_[node].token = index;
    first_[static_cast<uint8_t>(s[0])] = true;
  }
  bool empty() const { return nodes_.size() == 1; }
  // The longest token starting at s[pos]: {token index, length}, or {-1, 0}.
  std::pair<int32_t, size_t> longest_at(std::string_view s, size_t pos) const {
    std::pair<int32_t, size_t> best{-1, 0};
    if (!first_[static_cast<uint8_t>(s[pos])]) return best;
    int32_t node = 0;
    for (size_t i = pos; i < s.size(); ++i) {
      const auto b = static_cast<uint8_t>(s[i]);
      int32_t child = -1;
      for (const auto& [k, n] : nodes_[node].next) {
        if (k == b) child = n;
      }
      if (child < 0) break;
      node = child;
      if (nodes_[node].token >= 0) best = {nodes_[node].token, i + 1 - pos};
    }
    return best;
  }

 private:
  struct Node {
    int32_t token = -1;
    std::vector<std::pair<uint8_t, int32_t>> next;
  };
  std::vector<Node> nodes_;
  bool first_[256] = {};
};

// Unicode classes the added-token flags use (Rust regex's \w and \s, as `tokenizers` uses).
bool is_word_cp(uint32_t cp) {
  if (cp == '_') return true;
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(cp))) {
    case UTF8PROC_CATEGORY_LU:
    case UTF8PROC_CATEGORY_LL:
    case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO:
    case UTF8PROC_CATEGORY_MN:
    case UTF8PROC_CATEGORY_MC:
    case UTF8PROC_CATEGORY_ME:
    case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_NL:
    case UTF8PROC_CATEGORY_PC:
      return true;
    default:
      return cp == 0x200C || cp == 0x200D;
  }
}
bool is_space_cp(uint32_t cp) {
  return (cp >= 9 && cp <= 13) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F ||
         cp == 0x205F || cp == 0x3000;
}
// The code point that ends at s[end - 1] (s valid UTF-8, end > 0).
uint32_t code_point_before(std::string_view s, size_t end) {
  size_t i = end - 1;
  while (i > 0 && (static_cast<uint8_t>(s[i]) & 0xC0) == 0x80) --i;
  return next_code_point(s, i);
}

// transformers 5.24's Qwen2Tokenizer (models/qwen2/tokenization_qwen2.py, PRETOKENIZE_REGEX):
// the Split step of the pre-tokenizer it builds from vocab.json and merges.txt.
constexpr const char* kQwen2Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

struct Piece {
  std::string_view text;
  int32_t added_id = -1;  // an added token's id, or -1 for text still to tokenize
};

std::string str_field(const Json& j, const char* key, const std::string& where) {
  FLOWKV_CHECK(j.is_object() && j.contains(key) && j[key].is_string(), where, ": field \"", key,
               "\" must be a string");
  return j[key].get<std::string>();
}

std::string type_of(const Json& j, const std::string& where) {
  FLOWKV_CHECK(j.is_object(), where, " must be an object or null");
  return str_field(j, "type", where);
}

}  // namespace

struct Tokenizer::Impl {
  std::string what;
  // model
  // The vocabulary in errors: "<what>: model.vocab" or "<dir>/vocab.json", and its short name
  // ("model.vocab", "vocab.json").
  std::string vocab_where, vocab_name;
  std::unordered_map<std::string, int32_t> vocab;
  std::vector<std::string> vocab_r;  // id -> token ("" where no token)
  struct Merge {
    int32_t rank, id;
  };
  std::unordered_map<uint64_t, Merge> merges;  // (left id << 32 | right id) -> merge
  bool ignore_merges = false;
  std::array<int32_t, 256> byte_id{};  // byte -> id of its byte-level token
  // added tokens
  std::vector<AddedToken> added;
  std::unordered_map<std::string, int32_t> added_ids;
  std::unordered_map<int32_t, size_t> added_by_id;  // id -> index in `added`
  int64_t next_added_id = 0;  // the id `tokenizers` gives the next token outside the vocabulary
  AddedTrie raw_trie, normalized_trie;
  // pipeline
  bool nfc = false;
  struct Step {
    std::unique_ptr<SplitRegex> split;
  };
  std::vector<Step> steps;
  bool byte_level = false, add_prefix_space = false;
  int64_t size = 0;
  // Words already merged (HF keeps 10,000 too); words of more than kCachedWordBytes are not
  // kept.
  static constexpr size_t kCacheEntries = 10000, kCachedWordBytes = 256;
  mutable std::mutex cache_mutex;
  mutable std::unordered_map<std::string, std::vector<int32_t>> cache;

  void load(const Json& j);
  void load_qwen2(const std::string& vocab_json, const std::string& merges_txt,
                  const std::string& config_json);
  void load_model(const Json& m);
  void load_vocab(const Json& v, const std::string& where);
  // One merge of rank `rank`; `where` names it in errors. A pair merged twice keeps its last
  // rank (as `tokenizers` builds its merge map, both from tokenizer.json and merges.txt).
  // (Errors name it as `at`, `n`, `close`: "tok.json: model.merges[" 5 "]"; the name is built
  // only for an error, 151,387 merges.)
  void add_merge(const std::string& left, const std::string& right, int32_t rank,
                 const std::string& at, size_t n, const char* close);
  void load_added(const Json& a);
  // Adds one token (t.id < 0: numbered on, as `tokenizers` numbers a token it adds), checking
  // it against the vocabulary and the tokens before it; `where` names it in errors.
  void add_token(AddedToken t, const std::string& where);
  void build_added_tries();
  // The byte -> id table a ByteLevel pre-tokenizer needs (an Error without one), once the
  // model and pre-tokenizer are read.
  void find_byte_ids();
  // The size, once everything is read.
  void finish();
  void load_pre_tokenizer(const Json& p, const std::string& where);
  void find_added(std::string_view s, const AddedTrie& trie, std::vector<Piece>& out) const;
  void bpe(std::string_view word, std::vector<int32_t>& out) const;
};

void Tokenizer::Impl::load(const Json& j) {
  FLOWKV_CHECK(j.is_object(), what, ": a tokenizer.json must be an object");
  FLOWKV_CHECK(j.contains("model"), what, ": field \"model\" is missing");
  for (const char* key : {"truncation", "padding"}) {
    FLOWKV_CHECK(!j.contains(key) || j[key].is_null(), what, ": field \"", key,
                 "\" must be null (flowkv pads and truncates where the pipeline asks)");
  }
  load_model(j["model"]);

  if (j.contains("normalizer") && !j["normalizer"].is_null()) {
    const Json& n = j["normalizer"];
    const std::string where = what + ": normalizer";
    const std::string type = type_of(n, where);
    if (type == "Sequence") {
      FLOWKV_CHECK(n.contains("normalizers") && n["normalizers"].is_array(), where,
                   ": field \"normalizers\" must be a list");
      for (size_t i = 0; i < n["normalizers"].size(); ++i) {
        const std::string w = where + ".normalizers[" + std::to_string(i) + "]";
        FLOWKV_CHECK(type_of(n["normalizers"][i], w) == "NFC", w, ": only NFC is supported, got \"",
                     n["normalizers"][i]["type"].get<std::string>(), "\"");
        nfc = true;
      }
    } else {
      FLOWKV_CHECK(type == "NFC", where,
                   ".type: only NFC (or a Sequence of NFC) is supported, got \"", type, "\"");
      nfc = true;
    }
  }
  if (j.contains("pre_tokenizer") && !j["pre_tokenizer"].is_null()) {
    load_pre_tokenizer(j["pre_tokenizer"], what + ": pre_tokenizer");
  }
  for (const char* key : {"decoder", "post_processor"}) {
    if (!j.contains(key) || j[key].is_null()) continue;
    const std::string type = type_of(j[key], what + ": " + key);
    FLOWKV_CHECK(type == "ByteLevel", what, ": ", key, ".type: only ByteLevel is supported, got \"",
                 type, "\"");
  }

  find_byte_ids();
  if (j.contains("added_tokens") && !j["added_tokens"].is_null()) load_added(j["added_tokens"]);
  finish();
}

void Tokenizer::Impl::find_byte_ids() {
  if (byte_level) {
    const ByteLevelAlphabet& abc = byte_level_alphabet();
    for (int b = 0; b < 256; ++b) {
      const auto it = vocab.find(abc.utf8[b]);
      FLOWKV_CHECK(it != vocab.end(), vocab_where, " has no token for byte ", b, " (\"",
                   abc.utf8[b], "\"), which a ByteLevel pre_tokenizer needs");
      byte_id[b] = it->second;
    }
  } else {
    FLOWKV_CHECK(false, what,
                 ": pre_tokenizer: flowkv reads byte-level BPE tokenizers only (a "
                 "ByteLevel step is needed)");
  }
}

void Tokenizer::Impl::finish() {
  size = static_cast<int64_t>(vocab_r.size());
  for (const AddedToken& t : added) size = std::max<int64_t>(size, int64_t{t.id} + 1);
}

void Tokenizer::Impl::load_model(const Json& m) {
  const std::string where = what + ": model";
  FLOWKV_CHECK(type_of(m, where) == "BPE", where, ".type: only BPE is supported, got \"",
               m["type"].get<std::string>(), "\"");
  if (m.contains("dropout") && !m["dropout"].is_null()) {
    const double d = json_number(m, "dropout", 0, 0, 1, where);
    FLOWKV_CHECK(d == 0, where, ".dropout: BPE dropout is not supported (got ", d, ")");
  }
  ignore_merges = json_bool(m, "ignore_merges", false, where);
  FLOWKV_CHECK(!json_bool(m, "byte_fallback", false, where), where,
               ".byte_fallback: not supported (byte-level BPE never needs it)");
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    FLOWKV_CHECK(!m.contains(key) || m[key].is_null() || m[key] == "", where, ".", key,
                 ": only an empty string is supported");
  }
  // unk_token is never used: every byte has a token (checked in load).

  FLOWKV_CHECK(m.contains("vocab") && m["vocab"].is_object(), where,
               ".vocab: missing or not an object");
  vocab_name = "model.vocab";
  load_vocab(m["vocab"], where + ".vocab");

  FLOWKV_CHECK(m.contains("merges") && m["merges"].is_array(), where,
               ".merges: missing or not a list");
  const Json& ms = m["merges"];
  FLOWKV_CHECK(static_cast<int64_t>(ms.size()) <= limits::kMaxMerges, where, ".merges: ", ms.size(),
               " entries, more than the limit of ", limits::kMaxMerges);
  merges.reserve(ms.size());
  const std::string merges_at = where + ".merges[";
  std::string left, right;
  for (size_t i = 0; i < ms.size(); ++i) {
    // (The field name is built only for an error: 151,387 merges.)
    const Json& e = ms[i];
    if (e.is_string()) {  // "a b"
      const std::string& s = e.get_ref<const std::string&>();
      const size_t sp = s.find(' ');
      FLOWKV_CHECK(sp != std::string::npos && sp > 0 && sp + 1 < s.size() &&
                       s.find(' ', sp + 1) == std::string::npos,
                   where, ".merges[", i, "]: a merge must be two tokens separated by one space");
      left = s.substr(0, sp);
      right = s.substr(sp + 1);
    } else {
      FLOWKV_CHECK(e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string(), where,
                   ".merges[", i, "]: a merge must be a string \"a b\" or a list of two strings");
      left = e[0].get<std::string>();
      right = e[1].get<std::string>();
    }
    add_merge(left, right, static_cast<int32_t>(i), merges_at, i, "]");
  }
}

void Tokenizer::Impl::load_vocab(const Json& v, const std::string& where) {
  vocab_where = where;
  FLOWKV_CHECK(static_cast<int64_t>(v.size()) <= limits::kMaxVocab, where, ": ", v.size(),
               " entries, more than the limit of ", limits::kMaxVocab);
  int64_t max_id = -1;
  for (const auto& [token, id] : v.items()) {
    FLOWKV_CHECK(!token.empty() && static_cast<int64_t>(token.size()) <= limits::kMaxTokenBytes,
                 where, "[\"", token.substr(0, 64), "\"]: a token must have 1 to ",
                 limits::kMaxTokenBytes, " bytes, got ", token.size());
    const bool plain = id.is_number_unsigned() && id.get<uint64_t>() < limits::kMaxVocab;
    max_id = std::max(max_id, plain ? static_cast<int64_t>(id.get<uint64_t>())
                                    : json_int_value(id, 0, limits::kMaxVocab - 1,
                                                     where + "[\"" + token.substr(0, 64) + "\"]"));
  }
  vocab.reserve(v.size());
  vocab_r.assign(static_cast<size_t>(max_id + 1), std::string());
  for (const auto& [token, id_json] : v.items()) {
    const auto id = static_cast<int32_t>(id_json.get<int64_t>());
    FLOWKV_CHECK(vocab_r[id].empty(), where, ": id ", id, " is given to both \"", vocab_r[id],
                 "\" and \"", token, "\"");
    vocab_r[id] = token;
    vocab.emplace(token, id);
  }
  next_added_id = static_cast<int64_t>(vocab.size());
}

void Tokenizer::Impl::add_merge(const std::string& left, const std::string& right, int32_t rank,
                                const std::string& at, size_t n, const char* close) {
  const auto a = vocab.find(left), b = vocab.find(right);
  FLOWKV_CHECK(a != vocab.end() && b != vocab.end(), at, n, close, ": \"",
               (a == vocab.end() ? left : right).substr(0, 64), "\" is not in ", vocab_name);
  const auto ab = vocab.find(left + right);
  FLOWKV_CHECK(ab != vocab.end(), at, n, close, ": the merged token \"",
               (left + right).substr(0, 64), "\" is not in ", vocab_name);
  const uint64_t key = (static_cast<uint64_t>(a->second) << 32) | static_cast<uint32_t>(b->second);
  merges.insert_or_assign(key, Merge{rank, ab->second});
}

void Tokenizer::Impl::load_added(const Json& a) {
  const std::string where = what + ": added_tokens";
  FLOWKV_CHECK(a.is_array(), where, " must be a list");
  FLOWKV_CHECK(static_cast<int64_t>(a.size()) <= limits::kMaxAddedTokens, where, ": ", a.size(),
               " entries, more than the limit of ", limits::kMaxAddedTokens);
  added.reserve(a.size());
  for (size_t i = 0; i < a.size(); ++i) {
    const std::string w = where + "[" + std::to_string(i) + "]";
    const Json& e = a[i];
    FLOWKV_CHECK(e.is_object(), w, " must be an object");
    AddedToken t;
    t.content = str_field(e, "content", w);
    FLOWKV_CHECK(e.contains("id"), w, ": field \"id\" is missing");
    t.id = static_cast<int32_t>(json_int_value(e["id"], 0, limits::kMaxVocab - 1, w + ".id"));
    t.single_word = json_bool(e, "single_word", false, w);
    t.lstrip = json_bool(e, "lstrip", false, w);
    t.rstrip = json_bool(e, "rstrip", false, w);
    t.normalized = json_bool(e, "normalized", true, w);
    t.special = json_bool(e, "special", false, w);
    add_token(std::move(t), w);
  }
  build_added_tries();
}

void Tokenizer::Impl::add_token(AddedToken t, const std::string& w) {
  FLOWKV_CHECK(
      !t.content.empty() && static_cast<int64_t>(t.content.size()) <= limits::kMaxTokenBytes, w,
      ".content must have 1 to ", limits::kMaxTokenBytes, " bytes, got ", t.content.size());
  FLOWKV_CHECK(static_cast<int64_t>(added.size()) < limits::kMaxAddedTokens, w, ": more than ",
               limits::kMaxAddedTokens, " added tokens");
  FLOWKV_CHECK(!added_ids.count(t.content), w, ": \"", t.content, "\" is added twice");
  const auto in_vocab = vocab.find(t.content);
  if (t.id < 0) t.id = in_vocab != vocab.end() ? in_vocab->second : next_added_id;
  FLOWKV_CHECK(t.id < limits::kMaxVocab, w, ": id ", t.id, " is not below the limit of ",
               limits::kMaxVocab);
  FLOWKV_CHECK(!added_by_id.count(t.id), w, ": id ", t.id, " is given to two added tokens");
  FLOWKV_CHECK(in_vocab == vocab.end() || in_vocab->second == t.id, w, ": \"", t.content,
               "\" has id ", in_vocab == vocab.end() ? 0 : in_vocab->second, " in ", vocab_name,
               " but ", t.id, " here");
  FLOWKV_CHECK(t.id >= static_cast<int64_t>(vocab_r.size()) || vocab_r[t.id].empty() ||
                   vocab_r[t.id] == t.content,
               w, ": id ", t.id, " is \"", vocab_r[t.id], "\" in ", vocab_name);
  // `tokenizers` numbers an added token that is not in the vocabulary itself: the next id
  // after the vocabulary's entries and the added tokens before it, whatever the file says.
  if (in_vocab == vocab.end()) {
    FLOWKV_CHECK(t.id == next_added_id, w, ": id ", t.id, " for \"", t.content,
                 "\", but `tokenizers` would give it ", next_added_id, " (added tokens outside ",
                 vocab_name, " are numbered on from the vocabulary)");
    ++next_added_id;
  }
  added_by_id.emplace(t.id, added.size());
  added_ids.emplace(t.content, t.id);
  added.push_back(std::move(t));
}

void Tokenizer::Impl::build_added_tries() {
  for (size_t i = 0; i < added.size(); ++i) {
    const AddedToken& t = added[i];
    if (t.normalized)
      normalized_trie.insert(nfc ? text::nfc(t.content) : t.content, static_cast<int32_t>(i));
    else
      raw_trie.insert(t.content, static_cast<int32_t>(i));
  }
}

void Tokenizer::Impl::load_qwen2(const std::string& vocab_json, const std::string& merges_txt,
                                 const std::string& config_json) {
  const std::string vocab_path = what + "/vocab.json", merges_path = what + "/merges.txt",
                    config_path = what + "/tokenizer_config.json";
  // tokenizer_config.json first: it says whether these are a Qwen2 tokenizer's files at all.
  const Json config = parse_json(config_json, config_path);
  FLOWKV_CHECK(config.is_object(), config_path, " must be a JSON object");
  if (config.contains("tokenizer_class") && !config["tokenizer_class"].is_null()) {
    const std::string cls = str_field(config, "tokenizer_class", config_path);
    FLOWKV_CHECK(cls == "Qwen2Tokenizer" || cls == "Qwen2TokenizerFast", config_path,
                 ": tokenizer_class is \"", cls,
                 "\"; without a tokenizer.json flowkv reads Qwen2Tokenizer's files only");
  }
  FLOWKV_CHECK(!json_bool(config, "add_prefix_space", false, config_path), config_path,
               ": add_prefix_space: true is not supported (released Qwen tokenizers say false)");
  FLOWKV_CHECK(!json_bool(config, "split_special_tokens", false, config_path), config_path,
               ": split_special_tokens: true is not supported (special tokens are always found)");

  // model: vocab.json ({token: id}) and merges.txt (one "a b" a line, by rank; lines starting
  // with "#version" are skipped wherever they are, as `tokenizers` reads them).
  vocab_name = "vocab.json";
  const Json v = parse_json(vocab_json, vocab_path);
  FLOWKV_CHECK(v.is_object(), vocab_path, " must be a JSON object of token: id");
  load_vocab(v, vocab_path);

  const int64_t lines = std::count(merges_txt.begin(), merges_txt.end(), '\n') + 1;
  FLOWKV_CHECK(lines <= limits::kMaxMerges + 1, merges_path, ": ", lines,
               " lines, more merges than the limit of ", limits::kMaxMerges);
  merges.reserve(static_cast<size_t>(lines));
  const std::string at = merges_path + ": line ";
  int32_t rank = 0;
  size_t line_no = 0;
  std::string left, right;
  for (size_t pos = 0; pos < merges_txt.size();) {
    size_t end = merges_txt.find('\n', pos);
    const size_t next = end == std::string::npos ? merges_txt.size() : end + 1;
    if (end == std::string::npos) end = merges_txt.size();
    // A line ends at "\n" or "\r\n" (Rust's lines()); a last line without "\n" keeps its "\r".
    if (end < merges_txt.size() && end > pos && merges_txt[end - 1] == '\r') --end;
    const std::string_view line(merges_txt.data() + pos, end - pos);
    pos = next;
    ++line_no;
    if (line.starts_with("#version")) continue;
    const size_t sp = line.find(' ');
    FLOWKV_CHECK(sp != std::string_view::npos && sp > 0 && sp + 1 < line.size() &&
                     line.find(' ', sp + 1) == std::string_view::npos,
                 at, line_no, ": a merge must be two tokens separated by one space");
    FLOWKV_CHECK(rank < limits::kMaxMerges, merges_path, ": more merges than the limit of ",
                 limits::kMaxMerges);
    left.assign(line.substr(0, sp));
    right.assign(line.substr(sp + 1));
    add_merge(left, right, rank++, at, line_no, "");
  }

  // The pipeline Qwen2Tokenizer builds: NFC, the Qwen2 Split and ByteLevel without its own
  // regex or prefix space, and a ByteLevel decoder. (Its post-processor, a TemplateProcessing
  // of the add_bos_token / add_eos_token flags, adds nothing when both are off: checked below.)
  nfc = true;
  load_pre_tokenizer(
      Json{{"type", "Sequence"},
           {"pretokenizers",
            Json::array(
                {Json{{"type", "Split"},
                      {"pattern", {{"Regex", kQwen2Pattern}}},
                      {"behavior", "Isolated"},
                      {"invert", false}},
                 Json{{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}})}},
      what + ": Qwen2Tokenizer's pre_tokenizer");

  find_byte_ids();

  // Added tokens: added_tokens_decoder ({"<id>": {content, flags}}) in the order of the ids,
  // then the named special tokens (the *_token fields, with Qwen2Tokenizer's defaults, then
  // extra_special_tokens or additional_special_tokens), as transformers adds them.
  const std::string atd_where = config_path + ": added_tokens_decoder";
  FLOWKV_CHECK(
      config.contains("added_tokens_decoder") && config["added_tokens_decoder"].is_object(),
      atd_where,
      " is missing or not an object (flowkv reads the added tokens, with their ids and "
      "flags, from it)");
  const Json& atd = config["added_tokens_decoder"];
  FLOWKV_CHECK(static_cast<int64_t>(atd.size()) <= limits::kMaxAddedTokens, atd_where, ": ",
               atd.size(), " entries, more than the limit of ", limits::kMaxAddedTokens);
  std::vector<std::pair<int32_t, const Json*>> by_id;
  by_id.reserve(atd.size());
  for (const auto& [key, value] : atd.items()) {
    const std::string w = atd_where + "[\"" + key.substr(0, 32) + "\"]";
    FLOWKV_CHECK(
        !key.empty() && key.size() <= 9 && key.find_first_not_of("0123456789") == std::string::npos,
        w, ": the key must be a token id (decimal digits)");
    const int64_t id = std::stoll(key);
    FLOWKV_CHECK(id < limits::kMaxVocab, w, ": id ", id, " is not below the limit of ",
                 limits::kMaxVocab);
    by_id.emplace_back(static_cast<int32_t>(id), &value);
  }
  std::sort(by_id.begin(), by_id.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  // An AddedToken as transformers reads it: {"content": ..., flags}; "normalized" defaults to
  // the opposite of "special", as in `tokenizers`' AddedToken.
  auto added_token = [](const Json& e, int32_t id, bool named, const std::string& w) {
    FLOWKV_CHECK(e.is_object(), w, " must be an object");
    for (const auto& [k, unused] : e.items()) {
      FLOWKV_CHECK(k == "content" || k == "single_word" || k == "lstrip" || k == "rstrip" ||
                       k == "normalized" || k == "special" ||
                       (k == "__type" && e[k] == "AddedToken"),
                   w, ": unknown field \"", k.substr(0, 64), "\" of an added token");
    }
    AddedToken t;
    t.id = id;
    t.content = str_field(e, "content", w);
    t.single_word = json_bool(e, "single_word", false, w);
    t.lstrip = json_bool(e, "lstrip", false, w);
    t.rstrip = json_bool(e, "rstrip", false, w);
    t.special = json_bool(e, "special", false, w) || named;
    t.normalized = json_bool(e, "normalized", !t.special, w);
    return t;
  };
  for (size_t i = 0; i < by_id.size(); ++i) {
    const auto [id, e] = by_id[i];
    const std::string w = atd_where + "[\"" + std::to_string(id) + "\"]";
    FLOWKV_CHECK(i == 0 || by_id[i - 1].first != id, w, ": the id is given twice");
    add_token(added_token(*e, id, false, w), w);
  }
  // (field, value, group): group 1 and 2 are read from JSON objects, whose order flowkv's JSON
  // does not keep (transformers adds them in the file's order), so each may add one new token.
  struct Named {
    std::string key;
    const Json* value;
    int group;
  };
  std::vector<Named> named;
  const Json endoftext = "<|endoftext|>";
  for (const char* key : {"bos_token", "eos_token", "unk_token", "sep_token", "pad_token",
                          "cls_token", "mask_token"}) {
    const bool qwen2_default = std::string_view(key) == "eos_token" ||
                               std::string_view(key) == "unk_token" ||
                               std::string_view(key) == "pad_token";
    if (config.contains(key))
      named.push_back({key, &config[key], 0});
    else if (qwen2_default)
      named.push_back({key, &endoftext, 0});
  }
  for (const auto& [key, value] : config.items()) {
    if (key.ends_with("_token") && key != "bos_token" && key != "eos_token" && key != "unk_token" &&
        key != "sep_token" && key != "pad_token" && key != "cls_token" && key != "mask_token" &&
        value.is_string()) {
      named.push_back({key, &value, 1});  // a model-specific token ("image_token")
    }
  }
  for (const char* key : {"extra_special_tokens", "additional_special_tokens"}) {
    if (!config.contains(key) || config[key].is_null() ||
        (config[key].is_array() && config[key].empty()))
      continue;
    const Json& list = config[key];
    FLOWKV_CHECK(list.is_array() || list.is_object(), config_path, ": ", key,
                 " must be a list (or an object of named tokens)");
    FLOWKV_CHECK(static_cast<int64_t>(list.size()) <= limits::kMaxAddedTokens, config_path, ": ",
                 key, ": more than ", limits::kMaxAddedTokens, " tokens");
    for (const auto& [unused, value] : list.items())
      named.push_back({key, &value, list.is_object() ? 2 : 0});
    break;  // transformers reads additional_special_tokens only without extra_special_tokens
  }
  // Each named token is (re-)added as AddedToken(content, special=True): one already added
  // keeps its id but takes these flags (`tokenizers` replaces a token added again with other
  // flags), so a lstrip in added_tokens_decoder or in an AddedToken object is dropped.
  int new_in_group[3] = {};
  for (const auto& [key, value, group] : named) {
    if (value->is_null()) continue;
    const std::string w = config_path + ": " + key;
    FLOWKV_CHECK(value->is_string() || value->is_object(), w,
                 " must be a string, an AddedToken object or null");
    AddedToken t = value->is_string() ? AddedToken{value->get<std::string>()}
                                      : added_token(*value, -1, true, w);
    if (t.content.empty()) continue;  // (`tokenizers` skips an empty token)
    t.id = -1;
    t.single_word = t.lstrip = t.rstrip = t.normalized = false;
    t.special = true;
    if (const auto it = added_ids.find(t.content); it != added_ids.end()) {
      AddedToken& old = added[added_by_id.at(it->second)];
      t.id = old.id;
      old = std::move(t);
    } else {
      FLOWKV_CHECK(group == 0 || ++new_in_group[group] == 1, w, ": \"", t.content,
                   "\" is a second ",
                   group == 1 ? "model-specific *_token" : "extra_special_tokens entry",
                   " outside added_tokens_decoder; their ids depend on the order in the file, "
                   "which flowkv does not keep (add them to added_tokens_decoder)");
      add_token(std::move(t), w);
    }
  }
  build_added_tries();
  finish();

  for (const auto& [flag, key] :
       {std::pair{"add_bos_token", "bos_token"}, std::pair{"add_eos_token", "eos_token"}}) {
    const bool has_token =
        config.contains(key) ? !config[key].is_null() : std::string_view(key) == "eos_token";
    FLOWKV_CHECK(!(json_bool(config, flag, false, config_path) && has_token), config_path, ": ",
                 flag, ": true is not supported (flowkv's encode adds no ", key, ")");
  }
}

void Tokenizer::Impl::load_pre_tokenizer(const Json& p, const std::string& where) {
  const std::string type = type_of(p, where);
  if (type == "Sequence") {
    FLOWKV_CHECK(p.contains("pretokenizers") && p["pretokenizers"].is_array(), where,
                 ": field \"pretokenizers\" must be a list");
    FLOWKV_CHECK(p["pretokenizers"].size() <= 16, where, ": more than 16 steps");
    for (size_t i = 0; i < p["pretokenizers"].size(); ++i) {
      load_pre_tokenizer(p["pretokenizers"][i],
                         where + ".pretokenizers[" + std::to_string(i) + "]");
    }
  } else if (type == "Split") {
    FLOWKV_CHECK(!byte_level, where, ": a Split after ByteLevel is not supported");
    FLOWKV_CHECK(p.contains("pattern") && p["pattern"].is_object(), where,
                 ": field \"pattern\" must be an object");
    const Json& pat = p["pattern"];
    const bool literal = pat.contains("String");
    FLOWKV_CHECK(literal || pat.contains("Regex"), where,
                 ".pattern: needs \"Regex\" or \"String\"");
    const std::string pattern = str_field(pat, literal ? "String" : "Regex", where + ".pattern");
    FLOWKV_CHECK(str_field(p, "behavior", where) == "Isolated", where,
                 ".behavior: only \"Isolated\" is supported, got \"",
                 p["behavior"].get<std::string>(), "\"");
    FLOWKV_CHECK(!json_bool(p, "invert", false, where), where, ".invert: only false is supported");
    steps.push_back({std::make_unique<SplitRegex>(pattern, literal, where + ".pattern")});
  } else if (type == "ByteLevel") {
    FLOWKV_CHECK(!byte_level, where, ": two ByteLevel steps");
    if (json_bool(p, "use_regex", true, where)) {
      // GPT-2's own split, which ByteLevel applies when use_regex is true.
      steps.push_back({std::make_unique<SplitRegex>(
          R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)", false,
          where + " (GPT-2 regex)")});
    }
    add_prefix_space = json_bool(p, "add_prefix_space", true, where);
    FLOWKV_CHECK(!add_prefix_space || steps.size() == 1, where,
                 ".add_prefix_space: only supported when ByteLevel is the only split");
    byte_level = true;
  } else {
    fail(where, ".type: only Split, ByteLevel and Sequence are supported, got \"", type, "\"");
  }
}

void Tokenizer::Impl::find_added(std::string_view s, const AddedTrie& trie,
                                 std::vector<Piece>& out) const {
  if (trie.empty()) {
    out.push_back({s, -1});
    return;
  }
  size_t start_offset = 0, pos = 0;
  while (pos < s.size()) {
    const auto [index, len] = trie.longest_at(s, pos);
    if (index < 0) {
      ++pos;
      continue;
    }
    const AddedToken& t = added[index];
    size_t start = pos, stop = pos + len;
    pos = stop;  // the automaton goes on after the match, even when it is discarded
    if (t.single_word) {
      const bool start_space = start == 0 || !is_word_cp(code_point_before(s, start));
      size_t k = stop;
      const bool stop_space = stop == s.size() || !is_word_cp(next_code_point(s, k));
      if (!start_space || !stop_space) continue;
    }
    if (t.lstrip) {
      size_t b = start;
      while (b > start_offset && is_space_cp(code_point_before(s, b))) {
        do --b;
        while ((static_cast<uint8_t>(s[b]) & 0xC0) == 0x80);
      }
      start = b;
    }
    if (t.rstrip) {
      size_t k = stop;
      while (k < s.size()) {
        size_t next = k;
        if (!is_space_cp(next_code_point(s, next))) break;
        k = next;
      }
      stop = pos = k;
    }
    if (start_offset < start) out.push_back({s.substr(start_offset, start - start_offset), -1});
    out.push_back({s.substr(start, stop - start), t.id});
    start_offset = stop;
  }
  if (start_offset < s.size()) out.push_back({s.substr(start_offset), -1});
}

void Tokenizer::Impl::bpe(std::string_view word, std::vector<int32_t>& out) const {
  if (word.empty()) return;
  const bool cacheable = word.size() <= kCachedWordBytes;
  std::string key;
  if (cacheable) {
    key.assign(word);
    std::lock_guard<std::mutex> lock(cache_mutex);
    const auto it = cache.find(key);
    if (it != cache.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  const size_t n = word.size();
  std::vector<int32_t> ids;
  if (ignore_merges) {
    std::string mapped;
    for (const char c : word) mapped += byte_level_alphabet().utf8[static_cast<uint8_t>(c)];
    const auto it = vocab.find(mapped);
    if (it != vocab.end()) ids.push_back(it->second);
  }
  if (ids.empty()) {
    // Symbols in a linked list; merges in a min-queue by (rank, position). An entry is stale
    // when its left symbol was merged away, or when the pair now there merges into another
    // token (the check `tokenizers` makes).
    std::vector<int32_t> id(n), prev(n), next(n);
    std::vector<uint8_t> alive(n, 1);
    for (size_t i = 0; i < n; ++i) {
      id[i] = byte_id[static_cast<uint8_t>(word[i])];
      prev[i] = static_cast<int32_t>(i) - 1;
      next[i] = i + 1 < n ? static_cast<int32_t>(i + 1) : -1;
    }
    struct Entry {
      int32_t rank, pos, new_id;
      bool operator>(const Entry& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
    };
    std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> queue;
    auto lookup = [&](int32_t l, int32_t r) -> const Merge* {
      const auto it =
          merges.find((static_cast<uint64_t>(id[l]) << 32) | static_cast<uint32_t>(id[r]));
      return it == merges.end() ? nullptr : &it->second;
    };
    auto push = [&](int32_t l) {
      if (l < 0 || next[l] < 0) return;
      if (const Merge* m = lookup(l, next[l])) queue.push({m->rank, l, m->id});
    };
    for (size_t i = 0; i + 1 < n; ++i) push(static_cast<int32_t>(i));
    while (!queue.empty()) {
      const Entry e = queue.top();
      queue.pop();
      if (!alive[e.pos] || next[e.pos] < 0) continue;
      const int32_t r = next[e.pos];
      const Merge* m = lookup(e.pos, r);
      if (m == nullptr || m->id != e.new_id) continue;
      id[e.pos] = e.new_id;
      alive[r] = 0;
      next[e.pos] = next[r];
      if (next[r] >= 0) prev[next[r]] = e.pos;
      push(prev[e.pos]);
      push(e.pos);
    }
    for (int32_t i = 0; i >= 0; i = next[i]) ids.push_back(id[i]);
  }
  out.insert(out.end(), ids.begin(), ids.end());
  if (cacheable) {
    std::lock_guard<std::mutex> lock(cache_mutex);
    if (cache.size() >= kCacheEntries) cache.clear();
    cache.emplace(std::move(key), std::move(ids));
  }
}

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

Tokenizer Tokenizer::from_json(const std::string& json_text, const std::string& what) {
  auto impl = std::make_unique<Impl>();
  impl->what = what;
  impl->load(parse_json(json_text, what));
  return Tokenizer(std::move(impl));
}

Tokenizer Tokenizer::from_json_file(const std::string& path) {
  auto impl = std::make_unique<Impl>();
  impl->what = path;
  impl->load(read_json_file(path));
  return Tokenizer(std::move(impl));
}

Tokenizer Tokenizer::from_qwen2_files(const std::string& vocab_json, const std::string& merges_txt,
                                      const std::string& tokenizer_config_json,
                                      const std::string& dir) {
  auto impl = std::make_unique<Impl>();
  impl->what = dir;
  impl->load_qwen2(vocab_json, merges_txt, tokenizer_config_json);
  return Tokenizer(std::move(impl));
}

Tokenizer Tokenizer::from_folder(const std::string& dir) {
  const std::string json = dir + "/tokenizer.json";
  if (path_exists(json)) return from_json_file(json);
  const char* names[] = {"vocab.json", "merges.txt", "tokenizer_config.json"};
  std::string missing;
  for (const char* name : names) {
    if (!path_exists(dir + "/" + name)) missing += std::string(missing.empty() ? "" : ", ") + name;
  }
  FLOWKV_CHECK(missing.empty(), dir,
               ": no tokenizer.json, and no Qwen2Tokenizer files to build one from (vocab.json, "
               "merges.txt and tokenizer_config.json; missing: ",
               missing, ")");
  std::string text[3];
  for (int i = 0; i < 3; ++i) {
    text[i] = read_file(dir + "/" + names[i], limits::kMaxJsonFileBytes, "tokenizer file");
  }
  return from_qwen2_files(text[0], text[1], text[2], dir);
}

std::vector<int32_t> Tokenizer::encode(std::string_view utf8, bool /*add_special_tokens*/) const {
  const Impl& m = *impl_;
  FLOWKV_CHECK(static_cast<int64_t>(utf8.size()) <= limits::kMaxTextBytes, "a text of ",
               utf8.size(), " bytes is longer than the limit of ", limits::kMaxTextBytes);
  const size_t bad = invalid_utf8_offset(utf8);
  FLOWKV_CHECK(bad == std::string_view::npos, "the text is not valid UTF-8: byte ", bad, " (0x",
               "0123456789abcdef"[static_cast<uint8_t>(utf8[bad]) >> 4],
               "0123456789abcdef"[static_cast<uint8_t>(utf8[bad]) & 15],
               ") does not start a well-formed character");

  // 1. Added tokens in the raw text; 2. the rest normalised, then normalised added tokens.
  std::vector<Piece> raw_pieces;
  m.find_added(utf8, m.raw_trie, raw_pieces);
  std::vector<std::string> normalized;  // owns the normalised text the pieces point into
  normalized.reserve(raw_pieces.size());
  std::vector<Piece> pieces;
  for (const Piece& p : raw_pieces) {
    if (p.added_id >= 0) {
      pieces.push_back(p);
      continue;
    }
    normalized.push_back(m.nfc ? nfc(p.text) : std::string(p.text));
    m.find_added(normalized.back(), m.normalized_trie, pieces);
  }

  // 3. Pre-tokenize and 4. merge.
  std::vector<int32_t> ids;
  std::vector<SplitRegex::ScratchPtr> scratch;
  for (const Impl::Step& s : m.steps) scratch.push_back(s.split->make_scratch());
  std::vector<std::pair<size_t, size_t>> ranges;
  std::vector<std::string_view> words, next_words;
  std::string prefixed;
  for (const Piece& p : pieces) {
    if (p.added_id >= 0) {
      ids.push_back(p.added_id);
      continue;
    }
    if (p.text.empty()) continue;
    words.assign(1, p.text);
    if (m.add_prefix_space && p.text[0] != ' ') {
      prefixed.assign(1, ' ');
      prefixed.append(p.text);
      words[0] = prefixed;
    }
    for (size_t k = 0; k < m.steps.size(); ++k) {
      next_words.clear();
      for (const std::string_view w : words) {
        ranges.clear();
        m.steps[k].split->split(w, *scratch[k], ranges);
        for (const auto& [b, e] : ranges) next_words.push_back(w.substr(b, e - b));
      }
      words.swap(next_words);
    }
    for (const std::string_view w : words) m.bpe(w, ids);
  }
  return ids;
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
  const Impl& m = *impl_;
  const ByteLevelAlphabet& abc = byte_level_alphabet();
  std::string bytes;
  for (size_t i = 0; i < ids.size(); ++i) {
    const int32_t id = ids[i];
    std::string_view token;
    const auto added = m.added_by_id.find(id);
    if (added != m.added_by_id.end()) {
      if (skip_special_tokens && m.added[added->second].special) continue;
      token = m.added[added->second].content;
    } else {
      FLOWKV_CHECK(id >= 0 && id < static_cast<int64_t>(m.vocab_r.size()) && !m.vocab_r[id].empty(),
                   "decode: id ", id, " (position ", i, ") is not a token of ", m.what);
      token = m.vocab_r[id];
    }
    // ByteLevel: each character back to its byte; a token with a character outside the
    // alphabet (an added token such as "<|im_start|>" is inside it) is kept as its UTF-8.
    const size_t mark = bytes.size();
    bool in_alphabet = true;
    for (size_t k = 0; k < token.size() && in_alphabet;) {
      const int b = abc.byte_of(next_code_point(token, k));
      if (b < 0)
        in_alphabet = false;
      else
        bytes += static_cast<char>(b);
    }
    if (!in_alphabet) {
      bytes.resize(mark);
      bytes.append(token);
    }
  }
  return utf8_lossy(bytes);
}

int64_t Tokenizer::vocab_size() const {
  return impl_->size;
}

std::optional<int32_t> Tokenizer::token_id(std::string_view token) const {
  const std::string key(token);
  if (const auto it = impl_->added_ids.find(key); it != impl_->added_ids.end()) return it->second;
  if (const auto it = impl_->vocab.find(key); it != impl_->vocab.end()) return it->second;
  return std::nullopt;
}

std::optional<std::string> Tokenizer::id_token(int32_t id) const {
  if (const auto it = impl_->added_by_id.find(id); it != impl_->added_by_id.end()) {
    return impl_->added[it->second].content;
  }
  if (id >= 0 && id < static_cast<int64_t>(impl_->vocab_r.size()) && !impl_->vocab_r[id].empty()) {
    return impl_->vocab_r[id];
  }
  return std::nullopt;
}

bool Tokenizer::is_special(int32_t id) const {
  const auto it = impl_->added_by_id.find(id);
  return it != impl_->added_by_id.end() && impl_->added[it->second].special;
}

}  // namespace flowkv::text
