// flowkv/calibrate.h: the case manifest (cases.json), every problem an Error naming the file and
// the field.
#include <filesystem>
#include <limits>

#include "flowkv/calibrate.h"
#include "flowkv/error.h"
#include "flowkv/limits.h"
#include "io/json.h"
#include "io/mapped_file.h"

namespace flowkv {

namespace {

constexpr size_t kMaxCases = 100000;

std::string string_field(const Json& j, const char* key, bool required, const std::string& where) {
  if (!j.contains(key) || j[key].is_null()) {
    FLOWKV_CHECK(!required, where, ": field \"", key, "\" is missing");
    return "";
  }
  FLOWKV_CHECK(j[key].is_string(), where, ": field \"", key, "\" must be a string");
  return j[key].get<std::string>();
}

std::string resolved(const std::string& path, const std::string& base_dir,
                     const std::string& where) {
  FLOWKV_CHECK(!path.empty(), where, " is an empty path");
  const std::filesystem::path p(path);
  return p.is_absolute() || base_dir.empty() ? path
                                             : (std::filesystem::path(base_dir) / p).string();
}

EvalCase parse_case(const Json& c, const std::string& base_dir, const std::string& where) {
  FLOWKV_CHECK(c.is_object(), where, " must be an object");
  EvalCase e;
  e.name = string_field(c, "name", true, where);
  e.task = string_field(c, "task", false, where);
  e.prompt = string_field(c, "prompt", true, where);
  FLOWKV_CHECK(static_cast<int64_t>(e.prompt.size()) <= limits::kMaxTextBytes, where,
               ": the prompt is longer than ", limits::kMaxTextBytes, " bytes");
  if (c.contains("references") && !c["references"].is_null()) {
    const Json& refs = c["references"];
    FLOWKV_CHECK(refs.is_array(), where, ": field \"references\" must be a list of paths");
    FLOWKV_CHECK(static_cast<int64_t>(refs.size()) <= limits::kMaxReferences, where, ": ",
                 refs.size(), " references; at most ", limits::kMaxReferences);
    for (size_t i = 0; i < refs.size(); ++i) {
      const std::string at = where + ": references[" + std::to_string(i) + "]";
      FLOWKV_CHECK(refs[i].is_string(), at, " must be a string (a path)");
      e.references.push_back(resolved(refs[i].get<std::string>(), base_dir, at));
    }
  }
  const std::string truth = string_field(c, "truth", false, where);
  if (c.contains("truth") && !c["truth"].is_null())
    e.truth = resolved(truth, base_dir, where + ": truth");
  return e;
}

}  // namespace

CaseManifest parse_case_manifest(const std::string& text, const std::string& base_dir,
                                 const std::string& what) {
  const Json j = parse_json(text, what);
  FLOWKV_CHECK(j.is_object(), what, ": must be a JSON object with a \"cases\" list");
  CaseManifest m;
  if (j.contains("size") && !j["size"].is_null()) {
    const Json& size = j["size"];
    FLOWKV_CHECK(size.is_array() && size.size() == 2, what,
                 ": field \"size\" must be [width, height]");
    m.width = json_int_value(size[0], 1, limits::kMaxImageSide, what + ": size[0] (width)");
    m.height = json_int_value(size[1], 1, limits::kMaxImageSide, what + ": size[1] (height)");
    FLOWKV_CHECK(m.width * m.height <= limits::kMaxImagePixels, what, ": size ", m.width, "x",
                 m.height, " is more than ", limits::kMaxImagePixels, " pixels");
  }
  m.steps = static_cast<int>(json_int(j, "steps", 0, 1, limits::kMaxSteps, what));
  if (j.contains("seed") && !j["seed"].is_null()) {
    const Json& s = j["seed"];
    FLOWKV_CHECK(s.is_number_unsigned() || (s.is_number_integer() && s.get<int64_t>() >= 0), what,
                 ": field \"seed\" must be a non-negative integer");
    m.seed = s.get<uint64_t>();
  }
  FLOWKV_CHECK(j.contains("cases") && j["cases"].is_array(), what,
               ": field \"cases\" must be a list of cases");
  const Json& cases = j["cases"];
  FLOWKV_CHECK(!cases.empty(), what, ": \"cases\" is empty");
  FLOWKV_CHECK(cases.size() <= kMaxCases, what, ": ", cases.size(), " cases; at most ", kMaxCases);
  for (size_t i = 0; i < cases.size(); ++i)
    m.cases.push_back(parse_case(cases[i], base_dir, what + ": cases[" + std::to_string(i) + "]"));
  return m;
}

CaseManifest read_case_manifest(const std::string& path) {
  const std::string dir = std::filesystem::path(path).parent_path().string();
  return parse_case_manifest(read_text_file(path), dir, path);
}

}  // namespace flowkv
