#include "io/checkpoint.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <set>

#include "core/boundary.h"
#include "core/checked.h"
#include "core/memory.h"
#include "flowkv/error.h"
#include "flowkv/limits.h"
#include "io/atomic_file.h"
#include "io/mapped_file.h"

namespace flowkv {

namespace fs = std::filesystem;

namespace {

constexpr const char* kSingle = "diffusion_pytorch_model.safetensors";
constexpr const char* kIndex = "diffusion_pytorch_model.safetensors.index.json";
// What transformers' save_pretrained writes (a pipeline's text_encoder/).
constexpr const char* kTfSingle = "model.safetensors";
constexpr const char* kTfIndex = "model.safetensors.index.json";

void add_file(CheckpointScan& scan, const std::string& file, bool lenient) {
  SafetensorsHeader h;
  try {
    h = read_safetensors_header(file);
  } catch (const Error& e) {
    if (!lenient) throw;
    scan.problems.push_back(e.what());
    return;
  }
  for (const TensorInfo& t : h.tensors) {
    auto [it, inserted] = scan.tensors.emplace(t.name, t);
    FLOWKV_CHECK(inserted, "tensor '", t.name, "' appears in both ", it->second.file, " and ",
                 file);
  }
  scan.files.push_back(file);
}

void scan_sharded(CheckpointScan& scan, const fs::path& dir, const char* index_name, bool lenient) {
  const std::string index_path = (dir / index_name).string();
  const Json index = read_json_file(index_path);
  FLOWKV_CHECK(index.is_object() && index.contains("weight_map") && index["weight_map"].is_object(),
               index_path, ": no \"weight_map\" object");
  std::map<std::string, std::string> weight_map;  // tensor -> shard file name
  std::vector<std::string> shard_order;
  for (auto it = index["weight_map"].begin(); it != index["weight_map"].end(); ++it) {
    FLOWKV_CHECK(it.value().is_string(), index_path, ": weight_map entry for '", it.key(),
                 "' is not a file name");
    const std::string file = it.value().get<std::string>();
    FLOWKV_CHECK(file.find('/') == std::string::npos && file != ".." && !file.empty(), index_path,
                 ": weight_map names '", file, "', which is not a file in this folder");
    weight_map[it.key()] = file;
    if (std::find(shard_order.begin(), shard_order.end(), file) == shard_order.end()) {
      shard_order.push_back(file);
    }
  }
  std::sort(shard_order.begin(), shard_order.end());
  std::vector<std::string> missing_files;
  for (const std::string& f : shard_order) {
    if (!path_exists((dir / f).string())) missing_files.push_back(f);
  }
  if (!missing_files.empty()) {
    std::vector<std::string> lines;
    for (const auto& f : missing_files) lines.push_back("missing shard file: " + f);
    if (!lenient) fail(format_problems(index_path + " names shard files that do not exist", lines));
    for (const auto& l : lines) scan.problems.push_back(index_path + ": " + l);
  }
  for (const std::string& f : shard_order) {
    if (path_exists((dir / f).string())) add_file(scan, (dir / f).string(), lenient);
  }
  std::vector<std::string> lines;
  for (const auto& [name, file] : weight_map) {
    auto it = scan.tensors.find(name);
    if (it == scan.tensors.end() && !path_exists((dir / file).string()))
      continue;  // reported above
    if (it == scan.tensors.end()) {
      lines.push_back("'" + name + "' is listed in the index (in " + file +
                      ") but no shard holds it");
    } else if (fs::path(it->second.file).filename() != file) {
      lines.push_back("'" + name + "' is listed in " + file + " but found in " +
                      fs::path(it->second.file).filename().string());
    }
  }
  for (const auto& [name, info] : scan.tensors) {
    if (!weight_map.count(name)) {
      scan.problems.push_back("'" + name + "' is in " + fs::path(info.file).filename().string() +
                              " but not in the index");
    }
  }
  if (!lines.empty() && !lenient) {
    fail(format_problems(index_path + " disagrees with its shards", lines));
  }
  for (const auto& l : lines) scan.problems.push_back(index_path + ": " + l);
}

bool is_gguf_file(const std::string& path) {
  return read_file_prefix(path, 4) == "GGUF";
}

void add_gguf_file(CheckpointScan& scan, const std::string& file, bool lenient) {
  try {
    auto h = std::make_shared<GgufHeader>(read_gguf_header(file));
    for (const TensorInfo& t : h->tensors) scan.tensors.emplace(t.name, t);  // names are unique
    // A file flowkv wrote carries its source's config.json (quantize_checkpoint).
    if (const GgufValue* c = h->find("flowkv.config"); c && c->type == GgufType::kString) {
      scan.config = parse_json(c->s, file + ": metadata flowkv.config");
    }
    scan.gguf = std::move(h);
  } catch (const Error& e) {
    if (!lenient) throw;
    scan.problems.push_back(e.what());
    return;
  }
  scan.files.push_back(file);
}

}  // namespace

static CheckpointScan scan_checkpoint_unguarded(const std::string& path_in, bool lenient) {
  fs::path path(path_in);
  FLOWKV_CHECK(path_exists(path_in), path_in, ": no such file or folder");
  CheckpointScan scan;
  if (path_kind(path_in) == PathKind::kFile) {
    scan.path = path.string();
    scan.single_file = true;
    if (is_gguf_file(path.string())) {
      add_gguf_file(scan, path.string(), lenient);
    } else {
      add_file(scan, path.string(), lenient);
    }
    return scan;
  }
  FLOWKV_CHECK(path_kind(path_in) == PathKind::kFolder, path_in, ": not a file or folder");
  // A pipeline folder: its transformer lives in transformer/.
  if (!path_exists((path / "config.json").string()) &&
      path_exists((path / "transformer" / "config.json").string())) {
    path /= "transformer";
  }
  // A component folder holding one GGUF file and no config.json (a quantized transformer or
  // text encoder put in a pipeline folder): that file, its config from its metadata.
  if (!path_exists((path / "config.json").string())) {
    std::vector<std::string> ggufs;
    std::error_code ec;
    for (fs::directory_iterator it(path, ec), end; !ec && it != end; it.increment(ec)) {
      if (it->path().extension() == ".gguf") ggufs.push_back(it->path().string());
    }
    std::sort(ggufs.begin(), ggufs.end());
    if (ggufs.size() > 1) {
      std::string names;
      for (const std::string& g : ggufs) names += (names.empty() ? "" : ", ") + g;
      fail(path.string(), ": no config.json and ", ggufs.size(), " GGUF files (", names,
           "); keep one, or name the file");
    }
    if (ggufs.size() == 1) return scan_checkpoint_unguarded(ggufs[0], lenient);
  }
  scan.path = path.string();
  const fs::path config = path / "config.json";
  FLOWKV_CHECK(path_exists(config.string()), path.string(),
               ": no config.json (expected a diffusers transformer folder, a pipeline folder "
               "with transformer/, or a single .safetensors file)");
  try {
    scan.config = read_json_file(config.string());
    FLOWKV_CHECK(scan.config->is_object(), config.string(), ": not a JSON object");
  } catch (const Error& e) {
    if (!lenient) throw;
    scan.config.reset();
    scan.problems.push_back(e.what());
  }
  // diffusers' file names first, then transformers' (a text encoder folder).
  const char* index = path_exists((path / kIndex).string())     ? kIndex
                      : path_exists((path / kTfIndex).string()) ? kTfIndex
                                                                : nullptr;
  const char* single = path_exists((path / kSingle).string())     ? kSingle
                       : path_exists((path / kTfSingle).string()) ? kTfSingle
                                                                  : nullptr;
  if (index) {
    try {
      scan_sharded(scan, path, index, lenient);
    } catch (const Error& e) {
      if (!lenient) throw;
      scan.problems.push_back(e.what());
    }
  } else if (single) {
    add_file(scan, (path / single).string(), lenient);
  } else {
    const std::string msg = path.string() + ": no " + kSingle + " and no " + kIndex +
                            " (nor transformers' " + kTfSingle + " or " + kTfIndex + ")";
    if (!lenient) fail(msg);
    scan.problems.push_back(msg);
  }
  return scan;
}

CheckpointScan scan_checkpoint(const std::string& path_in, bool lenient) {
  return at_input_boundary(path_in, [&] { return scan_checkpoint_unguarded(path_in, lenient); });
}

std::vector<std::string> check_against_table(const std::map<std::string, TensorInfo>& tensors,
                                             const std::vector<ExpectedTensor>& expected) {
  std::vector<std::string> missing, wrong, unexpected;
  std::set<std::string> known;
  for (const ExpectedTensor& e : expected) {
    known.insert(e.name);
    auto it = tensors.find(e.name);
    if (it == tensors.end()) {
      missing.push_back("missing: " + e.name + " " + shape_str(e.shape));
      continue;
    }
    const TensorInfo& t = it->second;
    if (t.shape != e.shape) {
      wrong.push_back("wrong shape: " + e.name + " is " + shape_str(t.shape) + ", expected " +
                      shape_str(e.shape));
    }
    if (!t.dtype_known) {
      wrong.push_back("wrong dtype: " + e.name + " is " + t.dtype_name +
                      ", expected F32, BF16, F16 or (2-D weights) a GGUF block-quantized type");
    } else if (dtype_is_quantized(t.dtype) && e.shape.size() != 2) {
      wrong.push_back("wrong dtype: " + e.name + " is " + t.dtype_name +
                      "; block-quantized types are accepted only for 2-D weights, expected F32, "
                      "BF16 or F16");
    }
  }
  for (const auto& [name, t] : tensors) {
    if (!known.count(name)) unexpected.push_back("unexpected: " + name + " " + shape_str(t.shape));
  }
  std::vector<std::string> all;
  for (auto* v : {&missing, &wrong, &unexpected}) all.insert(all.end(), v->begin(), v->end());
  return all;
}

void check_weights_fit(const std::vector<ExpectedTensor>& table,
                       const std::function<int64_t(const ExpectedTensor&)>& held_bytes,
                       const std::string& what) {
  int64_t bytes = 0;
  for (const ExpectedTensor& e : table) {
    checked_numel(e.shape, e.name);  // a shape whose bytes overflow fails here, first
    bytes = checked_add(bytes, held_bytes(e), "weight bytes of " + what);
  }
  check_memory(bytes, "loading " + what,
               "free memory, set a larger budget, or use a smaller or quantized checkpoint");
}

std::string format_problems(const std::string& headline, const std::vector<std::string>& lines,
                            size_t max_lines) {
  std::string out = headline + " (" + std::to_string(lines.size()) + " problem" +
                    (lines.size() == 1 ? "" : "s") + "):";
  for (size_t i = 0; i < lines.size() && i < max_lines; ++i) out += "\n  " + lines[i];
  if (lines.size() > max_lines) {
    out += "\n  ... and " + std::to_string(lines.size() - max_lines) + " more";
  }
  return out;
}

void write_diffusers_folder(const std::string& dir, const Json& config,
                            const std::vector<TensorToWrite>& tensors, int64_t max_shard_bytes) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  FLOWKV_CHECK(!ec, "cannot create ", dir, ": ", ec.message());
  // Greedy shards in the given order, as diffusers' save_pretrained does.
  std::vector<std::vector<TensorToWrite>> shards(1);
  int64_t size = 0;
  for (const TensorToWrite& t : tensors) {
    const int64_t b = dtype_bytes(t.dtype, shape_numel(t.shape));
    if (size > 0 && size + b > max_shard_bytes) {
      shards.emplace_back();
      size = 0;
    }
    shards.back().push_back(t);
    size += b;
  }
  const fs::path root(dir);
  // Shard files of an older export ("diffusion_pytorch_model-00001-of-00003.safetensors").
  auto old_shards = [&] {
    const std::string prefix = "diffusion_pytorch_model-", suffix = ".safetensors";
    std::vector<std::string> found;
    for (fs::directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec)) {
      const std::string n = it->path().filename().string();
      if (n.size() > prefix.size() + suffix.size() && n.rfind(prefix, 0) == 0 &&
          n.compare(n.size() - suffix.size(), suffix.size(), suffix) == 0 &&
          n.find("-of-") != std::string::npos) {
        found.push_back(n);
      }
    }
    FLOWKV_CHECK(!ec, "cannot list ", dir, ": ", ec.message());
    return found;
  };
  // Every file is written atomically (io/atomic_file.h). The new weights go in first; then
  // whatever of an older export would shadow or mix with them is removed: the loader prefers
  // an index over the single file, and stale shards would be read by a stale index.
  if (shards.size() == 1) {
    write_safetensors((root / kSingle).string(), shards[0], {{"format", "pt"}});
    remove_file_durably((root / kIndex).string());
    for (const std::string& n : old_shards()) remove_file_durably((root / n).string());
  } else {
    Json index;
    int64_t total = 0;
    index["weight_map"] = Json::object();
    std::set<std::string> written;
    for (size_t i = 0; i < shards.size(); ++i) {
      char name[96];
      std::snprintf(name, sizeof name, "diffusion_pytorch_model-%05zu-of-%05zu.safetensors", i + 1,
                    shards.size());
      write_safetensors((root / name).string(), shards[i], {{"format", "pt"}});
      written.insert(name);
      for (const TensorToWrite& t : shards[i]) {
        index["weight_map"][t.name] = name;
        total += dtype_bytes(t.dtype, shape_numel(t.shape));
      }
    }
    index["metadata"] = {{"total_size", total}};
    write_file_atomic((root / kIndex).string(), index.dump(2));
    remove_file_durably((root / kSingle).string());
    for (const std::string& n : old_shards()) {
      if (!written.count(n)) remove_file_durably((root / n).string());
    }
  }
  write_file_atomic((root / "config.json").string(), config.dump(2));
}

void write_zero_folder(const std::string& dir, const Json& config,
                       const std::vector<ExpectedTensor>& table, DType dtype) {
  std::vector<TensorToWrite> list;
  for (const ExpectedTensor& e : table) list.push_back({e.name, dtype, e.shape, nullptr});
  write_diffusers_folder(dir, config, list);
}

CheckpointReader::CheckpointReader(const CheckpointScan& scan) {
  if (scan.gguf) {
    gguf_ = std::make_shared<GgufFile>(GgufFile::open(scan.gguf->path));
    // By the scan's names: a loader may hand in a scan whose tensors it renamed (a llama.cpp
    // file's, models/qwen25_vl/source.h); TensorInfo::name stays the stored one.
    for (const auto& [name, t] : scan.tensors) index_[name] = {0, t};
    return;
  }
  for (const std::string& f : scan.files) files_.push_back(SafetensorsFile::open(f));
  for (size_t i = 0; i < files_.size(); ++i) {
    for (const TensorInfo& t : files_[i].header().tensors) index_[t.name] = {i, t};
  }
}

CheckpointReader::~CheckpointReader() {
  for (const SafetensorsFile& f : files_) f.release_all();
  if (gguf_) gguf_->release_all();
}

Tensor CheckpointReader::get(const std::string& name) const {
  auto it = index_.find(name);
  FLOWKV_CHECK(it != index_.end(), "checkpoint has no tensor '", name, "'");
  if (last_ && gguf_) gguf_->release(last_->second);
  if (last_ && !gguf_) files_[last_->first].release(last_->second);
  last_ = &it->second;
  const TensorInfo& info = it->second.second;
  Tensor t = gguf_ ? gguf_->view(info) : files_[it->second.first].view(info);
  // Weights enter here: a NaN or infinity would silently poison every output.
  const int64_t bad = first_non_finite(t);
  FLOWKV_CHECK(bad < 0, info.file, ": tensor '", info.name, "' holds NaN or infinity at element ",
               bad, "; the checkpoint is corrupt or was saved after training diverged");
  return t;
}

int64_t count_blocks(const std::map<std::string, TensorInfo>& t, const std::string& prefix) {
  int64_t count = 0;
  for (const auto& [name, info] : t) {
    if (name.rfind(prefix, 0) != 0) continue;
    const size_t dot = name.find('.', prefix.size());
    const std::string idx = name.substr(prefix.size(), dot - prefix.size());
    if (idx.empty() || idx.find_first_not_of("0123456789") != std::string::npos) continue;
    FLOWKV_CHECK(idx.size() <= 6 && std::stoll(idx) < limits::kMaxBlocks, info.file, ": tensor '",
                 name, "' has block index ", idx, ", beyond the limit of ", limits::kMaxBlocks,
                 " blocks");
    count = std::max<int64_t>(count, std::stoll(idx) + 1);
  }
  return count;
}

const TensorInfo* find_tensor(const std::map<std::string, TensorInfo>& t, const std::string& name) {
  auto it = t.find(name);
  return it == t.end() ? nullptr : &it->second;
}

}  // namespace flowkv
