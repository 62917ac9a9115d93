// The showcase's case manifest and sweep files (flowkv/showcase.h): every field checked, every
// failure a flowkv::Error naming the file and the field ("cases.json: cases[2] \"compose-7\":
// references[0] must be a string").
#include "flowkv/showcase.h"

#include <filesystem>
#include <set>
#include <string>
#include <system_error>
#include <vector>

#include "flowkv/error.h"
#include "flowkv/limits.h"
#include "flowkv/step_cache.h"
#include "io/json.h"

namespace flowkv {

namespace {

constexpr size_t kMaxNameBytes = 64, kMaxLabelBytes = 128, kMaxPathBytes = 4096;

bool name_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
         c == '_' || c == '-';
}

// A short, printable form of a hostile string for an error message.
std::string quoted(const std::string& s) {
  std::string out = "\"";
  for (size_t i = 0; i < s.size() && i < 60; ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    out += (c >= 0x20 && c < 0x7f && c != '"') ? static_cast<char>(c) : '?';
  }
  return out + (s.size() > 60 ? "...\"" : "\"");
}

// Refuses fields other than `known` in an object.
void only_fields(const Json& j, std::initializer_list<const char*> known,
                 const std::string& where) {
  for (const auto& [key, value] : j.items()) {
    bool ok = false;
    for (const char* k : known) ok = ok || key == k;
    if (!ok) {
      std::string list;
      for (const char* k : known) list += std::string(list.empty() ? "" : ", ") + k;
      fail(where, ": unknown field ", quoted(key), " (known: ", list, ")");
    }
  }
}

const std::string& string_field(const Json& j, const char* key, const std::string& where,
                                bool required, size_t max_bytes) {
  static const std::string empty;
  if (!j.contains(key) || j[key].is_null()) {
    FLOWKV_CHECK(!required, where, ": field \"", key, "\" is missing");
    return empty;
  }
  FLOWKV_CHECK(j[key].is_string(), where, ": field \"", key, "\" must be a string");
  const std::string& s = j[key].get_ref<const std::string&>();
  FLOWKV_CHECK(s.size() <= max_bytes, where, ": field \"", key, "\" is longer than ", max_bytes,
               " bytes");
  return s;
}

std::string check_name(const std::string& s, const std::string& where) {
  FLOWKV_CHECK(!s.empty() && s.size() <= kMaxNameBytes && s[0] != '.', where,
               ": a name is 1-64 characters of A-Z a-z 0-9 . _ - not starting with '.', got ",
               quoted(s));
  for (char c : s) {
    FLOWKV_CHECK(name_char(c), where,
                 ": a name is 1-64 characters of A-Z a-z 0-9 . _ - not starting with '.', got ",
                 quoted(s));
  }
  return s;
}

std::string resolve(const std::string& base_dir, const std::string& p, const std::string& where) {
  FLOWKV_CHECK(!p.empty(), where, ": an empty path");
  FLOWKV_CHECK(p.find('\0') == std::string::npos, where, ": a path with a NUL character");
  const std::filesystem::path path(p);
  if (path.is_absolute() || base_dir.empty()) return p;
  return (std::filesystem::path(base_dir) / path).lexically_normal().string();
}

// An optional "size": [width, height] of j, into w and h (left as they are when absent or null).
void parse_size(const Json& j, const std::string& where, int64_t& w, int64_t& h) {
  if (!j.contains("size") || j["size"].is_null()) return;
  const Json& size = j["size"];
  FLOWKV_CHECK(size.is_array() && size.size() == 2, where,
               ": field \"size\" must be [width, height]");
  w = json_int_value(size[0], 1, limits::kMaxImageSide, where + ": size[0] (width)");
  h = json_int_value(size[1], 1, limits::kMaxImageSide, where + ": size[1] (height)");
}

ShowcaseCase parse_case(const Json& j, size_t index, const std::string& base_dir,
                        const std::string& what) {
  std::string where = what + ": cases[" + std::to_string(index) + "]";
  FLOWKV_CHECK(j.is_object(), where, " must be an object");
  ShowcaseCase c;
  c.name =
      check_name(string_field(j, "name", where, true, kMaxPathBytes), where + ": field \"name\"");
  where += " \"" + c.name + "\"";
  only_fields(j, {"name", "task", "prompt", "size", "references", "truth"}, where);
  parse_size(j, where, c.width, c.height);
  c.task = string_field(j, "task", where, true, kMaxPathBytes);
  FLOWKV_CHECK(!c.task.empty() && c.task.size() <= kMaxNameBytes, where,
               ": field \"task\" must be 1-64 bytes");
  c.prompt = string_field(j, "prompt", where, true, static_cast<size_t>(limits::kMaxTextBytes));
  if (j.contains("references") && !j["references"].is_null()) {
    const Json& refs = j["references"];
    FLOWKV_CHECK(refs.is_array(), where, ": field \"references\" must be a list of paths");
    FLOWKV_CHECK(static_cast<int64_t>(refs.size()) <= limits::kMaxReferences, where, ": more than ",
                 limits::kMaxReferences, " references");
    for (size_t i = 0; i < refs.size(); ++i) {
      const std::string at = where + ": references[" + std::to_string(i) + "]";
      FLOWKV_CHECK(refs[i].is_string(), at, " must be a string");
      const std::string& p = refs[i].get_ref<const std::string&>();
      FLOWKV_CHECK(p.size() <= kMaxPathBytes, at, ": longer than ", kMaxPathBytes, " bytes");
      c.references.push_back(resolve(base_dir, p, at));
    }
  }
  const std::string& truth = string_field(j, "truth", where, false, kMaxPathBytes);
  if (j.contains("truth") && !j["truth"].is_null()) {
    c.truth = resolve(base_dir, truth, where + ": field \"truth\"");
  }
  return c;
}

void check_file(const std::string& path, const std::string& where) {
  std::error_code ec;
  const auto st = std::filesystem::status(path, ec);
  FLOWKV_CHECK(!ec && std::filesystem::exists(st), where, ": ", path, ": no such file");
  FLOWKV_CHECK(std::filesystem::is_regular_file(st), where, ": ", path, ": not a file");
}

std::string directory_of(const std::string& path) {
  std::string dir = std::filesystem::path(path).parent_path().string();
  return dir.empty() ? "." : dir;
}

ShowcaseConfig parse_config(const Json& j, size_t index, const std::string& what) {
  std::string where = what + ": [" + std::to_string(index) + "]";
  FLOWKV_CHECK(j.is_object(), where, " must be an object {\"label\", \"caches\", \"steps\"}");
  only_fields(j, {"label", "caches", "steps"}, where);
  ShowcaseConfig c;
  c.label = string_field(j, "label", where, true, kMaxLabelBytes);
  FLOWKV_CHECK(!c.label.empty(), where, ": field \"label\" is empty");
  for (char ch : c.label) {
    FLOWKV_CHECK(ch >= 0x20 && ch < 0x7f, where, ": field \"label\" must be printable ASCII");
  }
  where += " \"" + c.label + "\"";
  c.steps = static_cast<int>(json_int(j, "steps", 0, 1, limits::kMaxSteps, where));
  FLOWKV_CHECK(j.contains("caches"), where,
               ": field \"caches\" is missing (an empty list: uncached)");
  const Json& caches = j["caches"];
  FLOWKV_CHECK(caches.is_array(), where, ": field \"caches\" must be a list of strings");
  FLOWKV_CHECK(caches.size() <= 16, where, ": more than 16 caches");
  for (size_t i = 0; i < caches.size(); ++i) {
    const std::string at = where + ": caches[" + std::to_string(i) + "]";
    FLOWKV_CHECK(caches[i].is_string(), at, " must be a string");
    const std::string& spec = caches[i].get_ref<const std::string&>();
    if (spec == "kv") {
      FLOWKV_CHECK(!c.kv, at, ": \"kv\" given twice");
      c.kv = true;
      continue;
    }
    try {
      check_step_caches({spec});
    } catch (const Error& e) {
      fail(at, ": ", e.what());
    }
    c.step_caches.push_back(spec);
  }
  return c;
}

void check_unique_labels(const std::vector<ShowcaseConfig>& configs, const std::string& what) {
  std::set<std::string> labels, slugs;
  for (const ShowcaseConfig& c : configs) {
    FLOWKV_CHECK(labels.insert(c.label).second, what, ": the label ", quoted(c.label),
                 " is used twice");
    FLOWKV_CHECK(slugs.insert(showcase_slug(c.label)).second, what, ": the label ", quoted(c.label),
                 " names the same files as another (", showcase_slug(c.label), ")");
  }
}

ShowcaseManifest manifest_from_json(const Json& j, const std::string& base_dir,
                                    const std::string& what) {
  FLOWKV_CHECK(j.is_object(), what, ": the manifest must be an object with a \"cases\" list");
  only_fields(j, {"size", "steps", "seed", "cases"}, what);
  ShowcaseManifest m;
  parse_size(j, what, m.width, m.height);
  m.steps = static_cast<int>(json_int(j, "steps", 0, 1, limits::kMaxSteps, what));
  m.seed = static_cast<uint64_t>(json_int(j, "seed", 0, 0, INT64_MAX, what));
  FLOWKV_CHECK(j.contains("cases"), what, ": field \"cases\" is missing");
  const Json& cases = j["cases"];
  FLOWKV_CHECK(cases.is_array(), what, ": field \"cases\" must be a list");
  FLOWKV_CHECK(!cases.empty(), what, ": field \"cases\" is empty");
  FLOWKV_CHECK(static_cast<int64_t>(cases.size()) <= kMaxShowcaseCases, what, ": ", cases.size(),
               " cases; at most ", kMaxShowcaseCases);
  std::set<std::string> names;
  for (size_t i = 0; i < cases.size(); ++i) {
    m.cases.push_back(parse_case(cases[i], i, base_dir, what));
    ShowcaseCase& c = m.cases.back();
    if (c.width == 0) c.width = m.width, c.height = m.height;
    FLOWKV_CHECK(names.insert(m.cases.back().name).second, what, ": cases[", i, "]: the name \"",
                 m.cases.back().name, "\" is used twice");
  }
  return m;
}

std::vector<ShowcaseConfig> sweep_from_json(const Json& j, const std::string& what) {
  FLOWKV_CHECK(j.is_array(), what,
               ": a sweep is a list of {\"label\", \"caches\": [...], \"steps\"} objects");
  FLOWKV_CHECK(!j.empty(), what, ": the sweep is empty");
  FLOWKV_CHECK(static_cast<int64_t>(j.size()) <= kMaxShowcaseConfigs, what, ": ", j.size(),
               " configurations; at most ", kMaxShowcaseConfigs);
  std::vector<ShowcaseConfig> out;
  for (size_t i = 0; i < j.size(); ++i) out.push_back(parse_config(j[i], i, what));
  check_unique_labels(out, what);
  return out;
}

}  // namespace

ShowcaseManifest parse_showcase_manifest(const std::string& text, const std::string& base_dir,
                                         const std::string& what) {
  return manifest_from_json(parse_json(text, what), base_dir, what);
}

ShowcaseManifest read_showcase_manifest(const std::string& path) {
  check_file(path, "--cases");
  ShowcaseManifest m = manifest_from_json(read_json_file(path), directory_of(path), path);
  for (size_t i = 0; i < m.cases.size(); ++i) {
    const ShowcaseCase& c = m.cases[i];
    const std::string where = path + ": cases[" + std::to_string(i) + "] \"" + c.name + "\"";
    for (size_t r = 0; r < c.references.size(); ++r) {
      check_file(c.references[r], where + ": references[" + std::to_string(r) + "]");
    }
    if (!c.truth.empty()) check_file(c.truth, where + ": truth");
  }
  return m;
}

std::vector<ShowcaseConfig> parse_showcase_sweep(const std::string& text, const std::string& what) {
  return sweep_from_json(parse_json(text, what), what);
}

std::vector<ShowcaseConfig> read_showcase_sweep(const std::string& path) {
  check_file(path, "--sweep");
  return sweep_from_json(read_json_file(path), path);
}

std::vector<ShowcaseConfig> showcase_sweep(const std::string& name) {
  FLOWKV_CHECK(name == "quick" || name == "full",
               "--sweep: \"quick\", \"full\" or a .json file, not ", quoted(name));
  // Each policy's settings: its defaults first, then two that skip more or less. A policy
  // registered later and not listed here runs at its defaults only.
  struct Settings {
    const char* name;
    std::vector<std::string> specs;
  };
  const std::vector<Settings> table = {
      {"fbcache", {"fbcache", "fbcache:threshold=0.2", "fbcache:threshold=1"}},
      {"dbcache",
       {"dbcache", "dbcache:fn=1,bn=1,threshold=0.3,warmup=2",
        "dbcache:fn=1,bn=1,threshold=1,warmup=2"}},
      {"teacache", {"teacache", "teacache:threshold=0.3", "teacache:threshold=1"}},
      {"magcache",
       {"magcache:ratios=flux1", "magcache:ratios=flux1,threshold=0.03",
        "magcache:ratios=flux1,threshold=0.12"}},
      {"taylorseer",
       {"taylorseer", "taylorseer:interval=2", "taylorseer:interval=3",
        "taylorseer:forecaster=dmd,interval=2"}},
      {"fora", {"fora", "fora:interval=2", "fora:interval=4"}},
      {"pab", {"pab", "pab:skip=3", "pab:hi=1000"}},
      {"fastercache", {"fastercache", "fastercache:attn_skip=3", "fastercache:attn_hi=901"}},
      {"seacache", {"seacache", "seacache:threshold=0.1", "seacache:threshold=0.5"}},
      {"meancache", {"meancache", "meancache:budget=5", "meancache:budget=3,span=1"}},
  };
  auto settings_of = [&](const std::string& policy) {
    for (const Settings& s : table) {
      if (policy == s.name) return s.specs;
    }
    return std::vector<std::string>{policy};
  };
  std::vector<ShowcaseConfig> out = {{"uncached", false, {}, 0}, {"kv", true, {}, 0}};
  for (const StepCachePolicy& p : step_cache_policies()) {
    const std::vector<std::string> specs = settings_of(p.name);
    if (name == "quick") {
      out.push_back({"kv+" + specs[0], true, {specs[0]}, 0});
      continue;
    }
    for (const std::string& spec : specs) {
      out.push_back({spec, false, {spec}, 0});
      out.push_back({"kv+" + spec, true, {spec}, 0});
    }
  }
  if (name == "full") {
    for (int steps : {4, 8, 28}) {
      std::string at = "@";  // (not "@" + to_string: GCC 12's -Wrestrict false positive)
      at += std::to_string(steps);
      out.push_back({"uncached" + at, false, {}, steps});
      out.push_back({"kv" + at, true, {}, steps});
      out.push_back({"taylorseer" + at, false, {"taylorseer"}, steps});
      out.push_back({"kv+taylorseer" + at, true, {"taylorseer"}, steps});
    }
  }
  return out;
}

std::string showcase_sweep_json(const std::vector<ShowcaseConfig>& sweep) {
  // One configuration per line: easy to edit and to diff.
  std::string out = "[\n";
  for (size_t i = 0; i < sweep.size(); ++i) {
    const ShowcaseConfig& c = sweep[i];
    nlohmann::ordered_json caches = nlohmann::ordered_json::array();  // label first
    if (c.kv) caches.push_back("kv");
    for (const std::string& spec : c.step_caches) caches.push_back(spec);
    nlohmann::ordered_json j = {{"label", c.label}, {"caches", caches}};
    if (c.steps > 0) j["steps"] = c.steps;
    out += " " + j.dump() + (i + 1 < sweep.size() ? ",\n" : "\n");
  }
  return out + "]\n";
}

std::string showcase_slug(const std::string& label) {
  std::string s;
  for (char c : label) {
    if (name_char(c)) {
      s += c;
    } else if (s.empty() || s.back() != '_') {
      s += '_';
    }
  }
  return s;
}

}  // namespace flowkv
