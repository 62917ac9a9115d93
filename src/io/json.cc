#include "io/json.h"

#include "flowkv/error.h"
#include "io/mapped_file.h"

namespace flowkv {

Json parse_json(const std::string& text, const std::string& what) {
  try {
    return Json::parse(text);
  } catch (const Json::parse_error& e) {
    // nlohmann's message already says "ill-formed UTF-8" or "syntax error ... at line L".
    fail(what, " is not valid JSON: ", e.what());
  }
}

Json read_json_file(const std::string& path) {
  return parse_json(read_text_file(path), path);
}

}  // namespace flowkv
