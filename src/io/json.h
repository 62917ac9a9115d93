// JSON files (config.json, shard indexes) with errors that name the file and the problem.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace flowkv {

using Json = nlohmann::json;

// Parses text as JSON; `what` names the source in errors. Rejects malformed JSON, strings that
// are not valid UTF-8 and numbers out of double range (1e400): every failure is a flowkv::Error.
Json parse_json(const std::string& text, const std::string& what);
// A regular file of at most limits::kMaxJsonFileBytes, parsed.
Json read_json_file(const std::string& path);

// A value that must be an integer in [lo, hi]; an integral float (3.0) counts. `where` names
// the field in errors.
int64_t json_int_value(const Json& v, int64_t lo, int64_t hi, const std::string& where);

// Fields of an object: missing or null gives `def`; a wrong type or a value outside [lo, hi]
// (or not finite) is an Error naming `src` and the field.
int64_t json_int(const Json& j, const char* key, int64_t def, int64_t lo, int64_t hi,
                 const std::string& src);
double json_number(const Json& j, const char* key, double def, double lo, double hi,
                   const std::string& src);
bool json_bool(const Json& j, const char* key, bool def, const std::string& src);
// A diffusers config.json's _class_name, when it has one, must be `expected` (an Error naming
// both otherwise); a config without one is taken as the expected class.
void json_expect_class(const Json& j, const std::string& expected, const std::string& src);

}  // namespace flowkv
