#include "text/regex.h"

#include <algorithm>
#include <cstdint>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "flowkv/error.h"

namespace flowkv::text {

namespace {

std::string pcre2_message(int code) {
  PCRE2_UCHAR buf[256];
  const int n = pcre2_get_error_message(code, buf, sizeof(buf));
  return n < 0 ? "PCRE2 error " + std::to_string(code) : std::string(reinterpret_cast<char*>(buf));
}

// The backtracking budget of one match: PCRE2's match limit (which the JIT honours too) set to
// kBudgetBase + kBudgetPerByte * (bytes from the start position to the end), with a depth and
// heap limit for the interpreter and the JIT stack's size for the JIT. Released patterns are
// linear: measured over the Qwen3 / Klein, GPT-2, Llama 3 and o200k patterns on 64 KiB texts
// (mixed prose, CJK, digits, punctuation, and one-character runs of spaces, tabs, newlines and
// letters), one match needs at most 40 + 1.0002 steps per byte (a run of spaces, which \s*[\r\n]+
// scans and gives back) and a depth of 6: a margin of 16x per byte and 2,500x on the constant.
// A pattern such as (a+)+$ needs 2^n steps on n letters, so it runs out within ~1 ms (JIT) and
// is an Error instead of seconds to centuries of backtracking that nothing could cancel.
constexpr uint64_t kBudgetBase = 100000;
constexpr uint64_t kBudgetPerByte = 16;
constexpr uint32_t kDepthLimit = 10000;       // backtracking frames (the interpreter)
constexpr uint32_t kHeapLimitKiB = 64 << 10;  // their memory (the interpreter)

uint32_t match_budget(size_t remaining_bytes) {
  const uint64_t steps = kBudgetBase + kBudgetPerByte * static_cast<uint64_t>(remaining_bytes);
  return static_cast<uint32_t>(std::min<uint64_t>(steps, UINT32_MAX));
}

bool out_of_budget(int rc) {
  return rc == PCRE2_ERROR_MATCHLIMIT || rc == PCRE2_ERROR_DEPTHLIMIT ||
         rc == PCRE2_ERROR_HEAPLIMIT || rc == PCRE2_ERROR_JIT_STACKLIMIT;
}

// Oniguruma's \s (what `tokenizers` runs) is Unicode's White_Space property. PCRE2's \s under
// UCP also takes U+180E (MONGOLIAN VOWEL SEPARATOR, a format character since Unicode 6.3, which
// PCRE2 keeps in \h), so \s and \S are written out as this list.
constexpr const char* kWhiteSpace =
    "\\t\\n\\x{0B}\\f\\r\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}"
    "\\x{202F}\\x{205F}\\x{3000}";

// pattern with \s and \S replaced by kWhiteSpace (in a class: its members; outside: a class).
// \S inside a class cannot be written so: refused.
std::string with_unicode_white_space(const std::string& pattern, const std::string& what) {
  std::string out;
  bool in_class = false;
  for (size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size()) {
      const char e = pattern[++i];
      if (e == 's') {
        out += in_class ? std::string(kWhiteSpace) : "[" + std::string(kWhiteSpace) + "]";
      } else if (e == 'S') {
        FLOWKV_CHECK(!in_class, what, ": \\S inside a character class is not supported");
        out += "[^" + std::string(kWhiteSpace) + "]";
      } else {
        out += c;
        out += e;
      }
      continue;
    }
    out += c;
    if (!in_class && c == '[') {
      in_class = true;
      // A ']' right after '[' or '[^' is a member, not the end.
      if (i + 1 < pattern.size() && pattern[i + 1] == '^') out += pattern[++i];
      if (i + 1 < pattern.size() && pattern[i + 1] == ']') out += pattern[++i];
    } else if (in_class && c == '[' && i + 1 < pattern.size() && pattern[i + 1] == ':') {
      const size_t end = pattern.find(":]", i + 2);  // a POSIX class such as [:alpha:]
      if (end != std::string::npos) {
        out.append(pattern, i + 1, end + 1 - i);
        i = end + 1;
      }
    } else if (in_class && c == ']') {
      in_class = false;
    }
  }
  return out;
}

}  // namespace

struct SplitRegex::Code {
  pcre2_code* code = nullptr;
  bool jit = false;
  std::string what;  // the pattern's source in errors (tokenizer file and field)
  ~Code() { pcre2_code_free(code); }
};

class SplitRegex::Scratch {
 public:
  explicit Scratch(const pcre2_code* code) {
    data = pcre2_match_data_create_from_pattern(code, nullptr);
    context = pcre2_match_context_create(nullptr);
    // The JIT's default 32 KiB stack suffices for these patterns; 1 MiB for safety.
    stack = pcre2_jit_stack_create(32 * 1024, 1024 * 1024, nullptr);
    FLOWKV_CHECK(data && context && stack, "out of memory for the tokenizer's regex");
    pcre2_jit_stack_assign(context, nullptr, stack);
    pcre2_set_depth_limit(context, kDepthLimit);
    pcre2_set_heap_limit(context, kHeapLimitKiB);
  }
  ~Scratch() {
    pcre2_match_data_free(data);
    pcre2_match_context_free(context);
    pcre2_jit_stack_free(stack);
  }
  pcre2_match_data* data = nullptr;
  pcre2_match_context* context = nullptr;
  pcre2_jit_stack* stack = nullptr;
};

SplitRegex::SplitRegex(const std::string& pattern, bool literal, const std::string& what)
    : code_(std::make_unique<Code>()) {
  code_->what = what;
  int err = 0;
  PCRE2_SIZE offset = 0;
  const uint32_t options = PCRE2_UTF | PCRE2_UCP | (literal ? PCRE2_LITERAL : 0);
  const std::string rewritten = literal ? pattern : with_unicode_white_space(pattern, what);
  code_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(rewritten.data()), rewritten.size(),
                              options, &err, &offset, nullptr);
  FLOWKV_CHECK(code_->code != nullptr, what, ": the pattern does not compile",
               literal ? "" : " (after \\s is written out)", " at offset ", offset, ": ",
               pcre2_message(err));
  code_->jit = pcre2_jit_compile(code_->code, PCRE2_JIT_COMPLETE) == 0;
}

SplitRegex::~SplitRegex() = default;
SplitRegex::SplitRegex(SplitRegex&&) noexcept = default;
SplitRegex& SplitRegex::operator=(SplitRegex&&) noexcept = default;

void SplitRegex::ScratchDeleter::operator()(Scratch* s) const {
  delete s;
}

SplitRegex::ScratchPtr SplitRegex::make_scratch() const {
  return ScratchPtr(new Scratch(code_->code));
}

void SplitRegex::split(std::string_view s, Scratch& scratch,
                       std::vector<std::pair<size_t, size_t>>& out) const {
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(s.data());
  size_t pos = 0, prev = 0;
  while (pos <= s.size()) {
    const uint32_t budget = match_budget(s.size() - pos);
    pcre2_set_match_limit(scratch.context, budget);
    // The caller validated the UTF-8: no re-check per match.
    const int rc = code_->jit ? pcre2_jit_match(code_->code, subject, s.size(), pos,
                                                PCRE2_NO_UTF_CHECK, scratch.data, scratch.context)
                              : pcre2_match(code_->code, subject, s.size(), pos, PCRE2_NO_UTF_CHECK,
                                            scratch.data, scratch.context);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (out_of_budget(rc)) {
      fail(code_->what, ": the tokenizer's pre-tokenizer regex exceeded its backtracking budget (",
           budget, " steps for one match, ", pcre2_message(rc), ") on a prompt of ", s.size(),
           " bytes, matching from byte ", pos,
           ": the pattern backtracks catastrophically (a nested repeat such as (a+)+); use the "
           "tokenizer.json the model was released with");
    }
    FLOWKV_CHECK(rc >= 0, "the tokenizer's split regex failed on a text of ", s.size(),
                 " bytes: ", pcre2_message(rc));
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(scratch.data);
    const size_t begin = ov[0], end = ov[1];
    if (begin > prev) out.emplace_back(prev, begin);
    if (end > begin) {
      out.emplace_back(begin, end);
      prev = pos = end;
    } else {
      // An empty match (none of the released patterns has one): step over one character, as
      // Oniguruma's find_iter does.
      prev = begin;
      if (begin >= s.size()) break;
      pos = begin + 1;
      while (pos < s.size() && (static_cast<uint8_t>(s[pos]) & 0xC0) == 0x80) ++pos;
    }
  }
  if (prev < s.size()) out.emplace_back(prev, s.size());
}

}  // namespace flowkv::text
