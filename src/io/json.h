// JSON files (config.json, shard indexes) with errors that name the file and the problem.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace flowkv {

using Json = nlohmann::json;

// Parses text as JSON; `what` names the source in errors. Rejects malformed JSON and
// strings that are not valid UTF-8.
Json parse_json(const std::string& text, const std::string& what);
Json read_json_file(const std::string& path);

}  // namespace flowkv
