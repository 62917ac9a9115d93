#include "text/utf8.h"

#include <utf8proc.h>

#include <cstdlib>
#include <memory>

#include "flowkv/error.h"

namespace flowkv::text {

namespace {

// The length of the well-formed prefix of the sequence at s[i] (Unicode table 3-7) and whether
// it is complete: {n, true} for a whole character of n bytes, {k, false} for an ill-formed
// maximal subpart of k >= 1 bytes.
std::pair<size_t, bool> sequence_at(std::string_view s, size_t i) {
  const auto b = static_cast<uint8_t>(s[i]);
  if (b < 0x80) return {1, true};
  size_t len = 0;
  uint8_t lo = 0x80, hi = 0xBF;  // range of the second byte
  if (b >= 0xC2 && b <= 0xDF) {
    len = 2;
  } else if (b >= 0xE0 && b <= 0xEF) {
    len = 3;
    if (b == 0xE0) lo = 0xA0;
    if (b == 0xED) hi = 0x9F;  // no surrogates
  } else if (b >= 0xF0 && b <= 0xF4) {
    len = 4;
    if (b == 0xF0) lo = 0x90;
    if (b == 0xF4) hi = 0x8F;  // nothing above U+10FFFF
  } else {
    return {1, false};
  }
  for (size_t k = 1; k < len; ++k) {
    if (i + k >= s.size()) return {k, false};
    const auto c = static_cast<uint8_t>(s[i + k]);
    const uint8_t l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xBF;
    if (c < l || c > h) return {k, false};
  }
  return {len, true};
}

}  // namespace

size_t invalid_utf8_offset(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    if (static_cast<uint8_t>(s[i]) < 0x80) {
      ++i;
      continue;
    }
    const auto [n, ok] = sequence_at(s, i);
    if (!ok) return i;
    i += n;
  }
  return std::string_view::npos;
}

std::string utf8_lossy(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    const auto [n, ok] = sequence_at(s, i);
    if (ok)
      out.append(s.substr(i, n));
    else
      out.append("\xEF\xBF\xBD");
    i += n;
  }
  return out;
}

std::string nfc(std::string_view s) {
  bool ascii = true;
  for (const char c : s) ascii &= static_cast<uint8_t>(c) < 0x80;
  if (ascii) return std::string(s);
  utf8proc_uint8_t* dst = nullptr;
  const utf8proc_ssize_t n = utf8proc_map(
      reinterpret_cast<const utf8proc_uint8_t*>(s.data()), static_cast<utf8proc_ssize_t>(s.size()),
      &dst, static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
  std::unique_ptr<utf8proc_uint8_t, decltype(&std::free)> owned(dst, &std::free);
  FLOWKV_CHECK(n >= 0, "NFC normalisation failed: ", utf8proc_errmsg(n));
  return std::string(reinterpret_cast<const char*>(dst), static_cast<size_t>(n));
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

uint32_t next_code_point(std::string_view s, size_t& i) {
  const auto b = static_cast<uint8_t>(s[i]);
  if (b < 0x80) {
    ++i;
    return b;
  }
  const size_t len = b >= 0xF0 ? 4 : b >= 0xE0 ? 3 : 2;
  uint32_t cp = b & (0x7F >> len);
  for (size_t k = 1; k < len && i + k < s.size(); ++k) {
    cp = (cp << 6) | (static_cast<uint8_t>(s[i + k]) & 0x3F);
  }
  i += len;
  return cp;
}

ByteLevelAlphabet::ByteLevelAlphabet() {
  byte_of_.fill(-1);
  uint32_t extra = 256;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    code_point[b] = printable ? static_cast<uint32_t>(b) : extra++;
    append_utf8(utf8[b], code_point[b]);
    byte_of_[code_point[b]] = static_cast<int16_t>(b);
  }
}

const ByteLevelAlphabet& byte_level_alphabet() {
  static const ByteLevelAlphabet alphabet;
  return alphabet;
}

}  // namespace flowkv::text
