#include "flowkv/inspect.h"

#include <sstream>

#include "families/family.h"
#include "flowkv/error.h"
#include "flowkv/predict.h"
#include "io/checkpoint.h"
#include "io/mapped_file.h"
#include "io/pipeline_folder.h"
#include "ops/linear.h"

namespace flowkv {

namespace {

// How the files are laid out; a family that maps another layout (FLUX.2's BFL files) says so.
std::string layout_name(const CheckpointScan& scan) {
  if (scan.gguf) return "single .gguf file (GGUF v" + std::to_string(scan.gguf->version) + ")";
  if (scan.single_file) return "single .safetensors file";
  if (scan.files.size() > 1)
    return "diffusers folder, " + std::to_string(scan.files.size()) + " shards";
  return "diffusers folder";
}

// One line per tensor holding NaN or infinity.
std::vector<std::string> non_finite_tensors(const CheckpointScan& scan) {
  std::vector<std::string> out;
  auto check = [&](const TensorInfo& t, const Tensor& v) {
    const int64_t bad = first_non_finite(v);
    if (bad >= 0) {
      out.push_back("non-finite value: " + t.name + " holds NaN or infinity at element " +
                    std::to_string(bad));
    }
  };
  if (scan.gguf) {
    const GgufFile file = GgufFile::open(scan.gguf->path);
    for (const TensorInfo& t : file.header().tensors) check(t, file.view(t));
    return out;
  }
  for (const std::string& f : scan.files) {
    const SafetensorsFile file = SafetensorsFile::open(f);
    for (const TensorInfo& t : file.header().tensors) {
      if (t.dtype_known) check(t, file.view(t));
    }
  }
  return out;
}

void unknown(const CheckpointScan& scan, InspectReport& r) {
  const bool named = scan.config && scan.config->is_object() &&
                     scan.config->contains("_class_name") &&
                     (*scan.config)["_class_name"].is_string();
  const std::string shown =
      named ? "\"" + (*scan.config)["_class_name"].get<std::string>() + "\"" : "no _class_name";
  std::string known;
  const auto& all = families::registry();
  for (size_t i = 0; i < all.size(); ++i)
    known += (i == 0 ? "" : i + 1 == all.size() ? " and " : ", ") + all[i].info.title;
  r.family = "unknown";
  r.variant = "not a known transformer (" + shown + ")";
  r.problems.push_back("flowkv does not know this model (" + shown + "); it runs " + known +
                       " transformers");
}

// The memory figures of the report: weights as Linear would hold them at the automatic compute
// type, and the cost model's KV and activations for a 1024x1024 image with one 1024x1024
// reference (where the family takes pictures) and 512 text tokens.
void predict_memory(const CheckpointScan& scan, InspectReport& r) {
  bool all_bf16 = !scan.tensors.empty();
  for (const auto& [name, t] : scan.tensors) all_bf16 &= t.dtype_known && t.dtype == DType::kBF16;
  const DType compute = all_bf16 ? DType::kBF16 : DType::kF32;
  for (const auto& [name, t] : scan.tensors) {
    r.held_weight_bytes += t.dtype_known ? ops::held_weight_bytes(t.dtype, t.shape, compute)
                                         : 4 * shape_numel(t.shape);
  }
  try {
    PredictRequest q;
    q.model = r.path;
    q.text_tokens = 512;
    q.target_tokens = 4096;
    const bool images = detect_family(r.path).takes_images;
    q.ref_tokens = images ? std::vector<int64_t>{4096} : std::vector<int64_t>{};
    const KVPrediction p = predict(q);
    r.memory_request = images ? "1024x1024 image, one 1024x1024 reference, 512 text tokens"
                              : "1024x1024 image, 512 text tokens";
    r.request_kv_bytes = p.kv_bytes;
    r.request_activation_bytes = p.activation_bytes;
  } catch (const Error& e) {
    r.memory_request = std::string("not predicted: ") + e.what();
  }
}

// A pipeline folder: every component's class and stored bytes, and whether they fit together.
void inspect_pipeline(const PipelineFolder& p, InspectReport& r) {
  r.pipeline_class = p.class_name;
  for (const auto& [name, c] : p.components) {
    ComponentReport cr{.name = name, .class_name = c.class_name};
    if (!path_exists(c.path)) {
      cr.note = "missing";
      r.problems.push_back(p.path + "/model_index.json names " + name + "/, which is missing");
    } else if (name == "tokenizer" || name == "processor") {  // files, no weights
      const std::string tj = c.path + "/tokenizer.json";
      cr.note = path_exists(tj) ? "tokenizer.json " + std::to_string(file_size(tj)) + " bytes"
                                : "no tokenizer.json";
      if (name == "processor") {
        cr.note += path_exists(c.path + "/preprocessor_config.json")
                       ? ", preprocessor_config.json"
                       : ", no preprocessor_config.json";
      }
    } else if (name == "scheduler") {
      cr.note = path_exists(c.path + "/scheduler_config.json") ? "scheduler_config.json"
                                                               : "no scheduler_config.json";
    } else {
      const CheckpointScan scan = scan_checkpoint(c.path, /*lenient=*/true);
      for (const auto& [n, t] : scan.tensors) {
        cr.parameters += shape_numel(t.shape);
        cr.bytes_by_dtype[t.dtype_name] += t.end - t.begin;
      }
      for (const std::string& q : scan.problems) r.problems.push_back(name + ": " + q);
    }
    r.components.push_back(cr);
  }
  for (const families::Family& f : families::registry()) {
    if (!f.runs_pipeline || !f.runs_pipeline(p.class_name)) continue;
    try {
      // What opening it for generate checks: components present and fitting, tokenizer /
      // processor, the scheduler config; no weights.
      (void)f.open_pipeline(p, {});
    } catch (const Error& e) {
      r.problems.push_back(e.what());
    }
    return;
  }
  r.problems.push_back("flowkv does not generate with a " + p.class_name + " pipeline");
}

}  // namespace

InspectReport inspect(const std::string& path, const InspectOptions& opts) {
  InspectReport r;
  r.path = path;
  const CheckpointScan scan = scan_checkpoint(path, /*lenient=*/true);
  r.problems = scan.problems;
  if (opts.check_values) {
    for (const std::string& p : non_finite_tensors(scan)) r.problems.push_back(p);
  }
  r.files = static_cast<int64_t>(scan.files.size());
  r.tensors = static_cast<int64_t>(scan.tensors.size());
  for (const auto& [name, t] : scan.tensors) {
    r.bytes_by_dtype[t.dtype_name] += t.end - t.begin;
    r.tensors_by_dtype[t.dtype_name] += 1;
  }
  if (scan.gguf) {
    for (const auto& [key, v] : scan.gguf->metadata)
      r.metadata.push_back(key + " = " + v.summary());
  }
  r.layout = layout_name(scan);
  for (const auto& [name, t] : scan.tensors) r.parameters += shape_numel(t.shape);
  if (const families::Family* f = families::for_scan(scan)) {
    f->inspect(scan, r);
    predict_memory(scan, r);
  } else {
    unknown(scan, r);
  }
  // The pipeline folder itself (not one of its component folders): every component.
  if (path_kind(path) == PathKind::kFolder && path_exists(path + "/model_index.json")) {
    try {
      if (const std::optional<PipelineFolder> p = find_pipeline_folder(path)) {
        inspect_pipeline(*p, r);
      }
    } catch (const Error& e) {
      r.problems.push_back(e.what());
    }
  }
  return r;
}

std::string format_report(const InspectReport& r) {
  std::ostringstream o;
  auto gib = [](int64_t b) {
    std::ostringstream s;
    s.setf(std::ios::fixed);
    s.precision(3);
    s << static_cast<double>(b) / (1 << 30) << " GiB";
    return s.str();
  };
  o << "path:       " << r.path << "\n";
  o << "layout:     " << r.layout << " (" << r.files << " file" << (r.files == 1 ? "" : "s") << ", "
    << r.tensors << " tensors)\n";
  o << "family:     " << r.family << "\n";
  o << "variant:    " << r.variant << "\n";
  o << "parameters: " << r.parameters << " (" << static_cast<double>(r.parameters) / 1e9 << " B)\n";
  o << "types:     ";
  for (const auto& [dt, n] : r.tensors_by_dtype) o << " " << dt << " " << n;
  o << "\n";
  o << "bytes:     ";
  for (const auto& [dt, b] : r.bytes_by_dtype) o << " " << dt << " " << b << " (" << gib(b) << ")";
  o << "\n";
  if (r.held_weight_bytes > 0) {
    o << "memory:     weights " << gib(r.held_weight_bytes) << " as held";
    if (r.request_kv_bytes + r.request_activation_bytes > 0) {
      o << " + KV " << gib(r.request_kv_bytes) << " + activations "
        << gib(r.request_activation_bytes) << " = "
        << gib(r.held_weight_bytes + r.request_kv_bytes + r.request_activation_bytes);
    }
    o << " (" << r.memory_request << ")\n";
  }
  if (!r.pipeline_class.empty()) {
    o << "pipeline:   " << r.pipeline_class << " (" << r.components.size() << " components)\n";
    for (const ComponentReport& c : r.components) {
      o << "  " << c.name << ": " << c.class_name;
      if (c.parameters > 0) o << ", " << static_cast<double>(c.parameters) / 1e9 << " B parameters";
      for (const auto& [dt, b] : c.bytes_by_dtype) o << ", " << dt << " " << gib(b);
      if (!c.note.empty()) o << ", " << c.note;
      o << "\n";
    }
  }
  if (!r.metadata.empty()) {
    o << "metadata:   " << r.metadata.size() << " keys\n";
    for (const std::string& m : r.metadata) o << "  " << m << "\n";
  }
  if (!r.config_json.empty()) {
    o << "config" << (r.config_inferred ? " (inferred from shapes): " : ":     ") << r.config_json
      << "\n";
  }
  if (r.problems.empty()) {
    o << "problems:   none\n";
  } else {
    o << "problems:   " << r.problems.size() << "\n";
    for (const std::string& p : r.problems) o << "  - " << p << "\n";
  }
  return o.str();
}

}  // namespace flowkv
