// The pre-tokenizer's split regex on PCRE2 (8-bit, UTF + UCP, JIT-compiled where the platform
// has a JIT). PCRE2 is a backtracking engine with Oniguruma's semantics for what the Hugging
// Face patterns use: \p{L} / \p{N}, Unicode \s, (?i:...) with Unicode case folding and the
// (?!\S) look-ahead (std::regex has no \p{..}; RE2 no look-ahead).
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace flowkv::text {

class SplitRegex {
 public:
  // Compiles pattern (a regex, or a literal when `literal`); an Error names `what` and PCRE2's
  // message with the offset of the problem.
  SplitRegex(const std::string& pattern, bool literal, const std::string& what);
  ~SplitRegex();
  SplitRegex(SplitRegex&&) noexcept;
  SplitRegex& operator=(SplitRegex&&) noexcept;

  // Scratch for matching (match data, JIT stack); one per thread, reusable across calls.
  class Scratch;
  struct ScratchDeleter {
    void operator()(Scratch* s) const;
  };
  using ScratchPtr = std::unique_ptr<Scratch, ScratchDeleter>;
  ScratchPtr make_scratch() const;

  // Appends to `out` the [begin, end) byte ranges of s that HF's Split with behaviour
  // "Isolated" makes: each match, and each gap between matches, in order. s is valid UTF-8;
  // the pattern sees s alone (no context around it), as in HF.
  void split(std::string_view s, Scratch& scratch,
             std::vector<std::pair<size_t, size_t>>& out) const;

 private:
  struct Code;
  std::unique_ptr<Code> code_;
};

}  // namespace flowkv::text
