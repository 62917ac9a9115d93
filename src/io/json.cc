#include "io/json.h"

#include <cmath>

#include "core/checked.h"
#include "flowkv/error.h"
#include "flowkv/limits.h"
#include "io/mapped_file.h"

namespace flowkv {

namespace {

// nlohmann parses and frees nesting without recursion but copies and prints it recursively: a
// value nested a million deep (2 MB of brackets) would overflow the stack later. No file flowkv
// reads nests deeper than a few levels.
constexpr int kMaxJsonDepth = 64;

void check_depth(const std::string& text, const std::string& what) {
  int depth = 0;
  bool in_string = false, escaped = false;
  for (const char c : text) {
    if (in_string) {
      if (escaped)
        escaped = false;
      else if (c == '\\')
        escaped = true;
      else if (c == '"')
        in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      FLOWKV_CHECK(++depth <= kMaxJsonDepth, what, ": JSON nested deeper than ", kMaxJsonDepth,
                   " levels");
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
}

// A value for an error message: short, and never a whole hostile structure.
std::string shown(const Json& v) {
  if (v.is_object()) return "an object";
  if (v.is_array()) return "a list";
  std::string s = v.dump();
  if (s.size() > 80) s = s.substr(0, 77) + "...";
  return s;
}

}  // namespace

Json parse_json(const std::string& text, const std::string& what) {
  check_depth(text, what);
  try {
    return Json::parse(text);
  } catch (const Json::exception& e) {
    // nlohmann's message already says "ill-formed UTF-8", "syntax error ... at line L" or
    // "number overflow parsing '1e400'".
    fail(what, " is not valid JSON: ", e.what());
  }
}

Json read_json_file(const std::string& path) {
  return parse_json(read_file(path, limits::kMaxJsonFileBytes), path);
}

namespace {
[[noreturn]] void out_of_range(const std::string& where, const std::string& got, int64_t lo,
                               int64_t hi) {
  if (lo == 0 && !got.empty() && got[0] == '-') {
    fail(where, " must be a non-negative integer, got ", got);
  }
  fail(where, " must be an integer in [", lo, ", ", hi, "], got ", got);
}
}  // namespace

int64_t json_int_value(const Json& v, int64_t lo, int64_t hi, const std::string& where) {
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(INT64_MAX) || static_cast<int64_t>(u) < lo ||
        static_cast<int64_t>(u) > hi) {
      out_of_range(where, shown(v), lo, hi);
    }
    return static_cast<int64_t>(u);
  }
  if (v.is_number_integer()) {
    const int64_t i = v.get<int64_t>();
    if (i < lo || i > hi) out_of_range(where, shown(v), lo, hi);
    return i;
  }
  const double d = v.is_number_float() ? v.get<double>() : 0.5;
  // 2^63 is the first double outside int64: compare below it before any cast.
  if (!(d == std::floor(d) && d >= static_cast<double>(lo) && d < 9223372036854775808.0 &&
        static_cast<int64_t>(d) <= hi)) {
    out_of_range(where, shown(v), lo, hi);
  }
  return static_cast<int64_t>(d);
}

int64_t json_int(const Json& j, const char* key, int64_t def, int64_t lo, int64_t hi,
                 const std::string& src) {
  if (!j.contains(key) || j[key].is_null()) return def;
  return json_int_value(j[key], lo, hi, src + ": field \"" + key + "\"");
}

double json_number(const Json& j, const char* key, double def, double lo, double hi,
                   const std::string& src) {
  if (!j.contains(key) || j[key].is_null()) return def;
  const Json& v = j[key];
  FLOWKV_CHECK(v.is_number(), src, ": field \"", key, "\" must be a number, got ", shown(v));
  const double d = v.get<double>();
  FLOWKV_CHECK(std::isfinite(d) && d >= lo && d <= hi, src, ": field \"", key, "\" is ", d,
               ", outside [", lo, ", ", hi, "]");
  return d;
}

bool json_bool(const Json& j, const char* key, bool def, const std::string& src) {
  if (!j.contains(key) || j[key].is_null()) return def;
  FLOWKV_CHECK(j[key].is_boolean(), src, ": field \"", key, "\" must be true or false");
  return j[key].get<bool>();
}

void json_expect_class(const Json& j, const std::string& expected, const std::string& src) {
  if (!j.is_object() || !j.contains("_class_name") || !j["_class_name"].is_string()) return;
  const std::string cls = j["_class_name"].get<std::string>();
  FLOWKV_CHECK(cls == expected, src, ": _class_name is \"", cls, "\", expected \"", expected, "\"");
}

}  // namespace flowkv
