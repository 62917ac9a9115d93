#include "io/pipeline_folder.h"

#include <filesystem>

#include "core/boundary.h"
#include "flowkv/error.h"
#include "io/mapped_file.h"

namespace flowkv {

namespace fs = std::filesystem;

namespace {

PipelineFolder read_index(const std::string& dir) {
  const std::string file = (fs::path(dir) / "model_index.json").string();
  return at_input_boundary(file, [&] { return parse_pipeline_index(read_json_file(file), dir); });
}

}  // namespace

PipelineFolder parse_pipeline_index(const Json& index, const std::string& dir) {
  const std::string file = (fs::path(dir) / "model_index.json").string();
  return at_input_boundary(file, [&] {
    PipelineFolder p;
    p.path = dir;
    p.index = index;
    FLOWKV_CHECK(p.index.is_object(), file, ": not a JSON object");
    FLOWKV_CHECK(p.index.contains("_class_name") && p.index["_class_name"].is_string(), file,
                 ": no _class_name (the pipeline class) string");
    p.class_name = p.index["_class_name"].get<std::string>();
    for (const auto& [name, v] : p.index.items()) {
      if (name.empty() || name[0] == '_' || !v.is_array()) continue;  // options, metadata
      // A list of numbers is a pipeline option too (QwenImage21Pipeline's sample_sigmas).
      bool numbers = !v.empty();
      for (const Json& e : v) numbers = numbers && e.is_number();
      if (numbers) continue;
      FLOWKV_CHECK(v.size() == 2, file, ": component '", name, "' must be [library, class], got ",
                   v.size(), " entries");
      if (v[0].is_null() && v[1].is_null()) continue;  // a component the pipeline runs without
      FLOWKV_CHECK(v[0].is_string() && v[1].is_string(), file, ": component '", name,
                   "' must be [library, class] strings");
      FLOWKV_CHECK(name.find('/') == std::string::npos && name != "." && name != "..", file,
                   ": component name '", name, "' is not a folder name");
      p.components[name] = {v[0].get<std::string>(), v[1].get<std::string>(),
                            (fs::path(dir) / name).string()};
    }
    return p;
  });
}

const PipelineComponent& PipelineFolder::component(const std::string& name) const {
  auto it = components.find(name);
  FLOWKV_CHECK(it != components.end(), path, "/model_index.json names no '", name,
               "' component; this pipeline (", class_name, ") cannot run without it");
  return it->second;
}

std::optional<PipelineFolder> find_pipeline_folder(const std::string& path) {
  if (path.empty() || !path_exists(path) || path_kind(path) != PathKind::kFolder)
    return std::nullopt;
  fs::path dir = fs::path(path).lexically_normal();
  if (dir.filename().empty()) dir = dir.parent_path();  // "a/b/" -> "a/b"
  if (path_exists((dir / "model_index.json").string())) return read_index(dir.string());
  // A component subfolder: the parent's index must name it.
  const fs::path parent = dir.parent_path();
  if (parent.empty() || !path_exists((parent / "model_index.json").string())) return std::nullopt;
  PipelineFolder p = read_index(parent.string());
  if (!p.components.count(dir.filename().string())) return std::nullopt;
  return p;
}

}  // namespace flowkv
