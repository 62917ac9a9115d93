// UTF-8 helpers of the tokenizer: validation, NFC (utf8proc), the byte-level alphabet of
// GPT-2-style BPE and a lossy decoder that replaces invalid bytes as Rust's
// String::from_utf8_lossy does (one U+FFFD per maximal invalid subpart).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace flowkv::text {

// Offset of the first byte that does not start a well-formed UTF-8 sequence (overlong forms,
// surrogates and code points above U+10FFFF are ill-formed), or npos when all of s is valid.
size_t invalid_utf8_offset(std::string_view s);

// The canonical composition (NFC) of valid UTF-8 text. ASCII text is returned unchanged
// without calling utf8proc.
std::string nfc(std::string_view valid_utf8);

// s with every ill-formed subsequence replaced by U+FFFD, as Rust's from_utf8_lossy does.
std::string utf8_lossy(std::string_view s);

// Appends the UTF-8 encoding of code point cp (< 0x110000, not a surrogate).
void append_utf8(std::string& out, uint32_t cp);

// GPT-2's bytes_to_unicode: the printable bytes ('!'..'~', 0xA1..0xAC, 0xAE..0xFF) stand for
// themselves; the other 68 bytes, in increasing order, for U+0100, U+0101, ...
struct ByteLevelAlphabet {
  ByteLevelAlphabet();
  std::array<uint32_t, 256> code_point;  // byte -> code point
  std::array<std::string, 256> utf8;     // byte -> its code point in UTF-8
  // The byte a code point stands for, or -1 when it is outside the alphabet.
  int byte_of(uint32_t cp) const { return cp < 324 ? byte_of_[cp] : -1; }

 private:
  std::array<int16_t, 324> byte_of_;
};
const ByteLevelAlphabet& byte_level_alphabet();

// Decodes the UTF-8 sequence at s[i] (valid input only), advancing i.
uint32_t next_code_point(std::string_view s, size_t& i);

}  // namespace flowkv::text
