#include "flowkv/inspect.h"

#include <sstream>

#include "flowkv/error.h"
#include "io/checkpoint.h"
#include "models/flux2/config.h"
#include "models/flux2/weights.h"
#include "models/qwen_image/config.h"
#include "models/qwen_image/weights.h"

namespace flowkv {

namespace {

bool looks_like_flux2(const CheckpointScan& scan, const flux2::WeightSource& src) {
  if (scan.config && scan.config->contains("_class_name") &&
      (*scan.config)["_class_name"].is_string()) {
    return (*scan.config)["_class_name"].get<std::string>() == "Flux2Transformer2DModel";
  }
  return src.tensors().count("double_stream_modulation_img.linear.weight") > 0 ||
         src.tensors().count("single_stream_modulation.linear.weight") > 0;
}

std::string layout_name(const CheckpointScan& scan, bool bfl) {
  if (scan.single_file) return bfl ? "BFL original single file" : "single .safetensors file";
  if (scan.files.size() > 1)
    return "diffusers folder, " + std::to_string(scan.files.size()) + " shards";
  return "diffusers folder";
}

// One line per tensor holding NaN or infinity.
std::vector<std::string> non_finite_tensors(const CheckpointScan& scan) {
  std::vector<std::string> out;
  for (const std::string& f : scan.files) {
    const SafetensorsFile file = SafetensorsFile::open(f);
    for (const TensorInfo& t : file.header().tensors) {
      if (!t.dtype_known) continue;
      const int64_t bad = first_non_finite(file.view(t));
      if (bad >= 0) {
        out.push_back("non-finite value: " + t.name + " holds NaN or infinity at element " +
                      std::to_string(bad));
      }
    }
  }
  return out;
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
  for (const auto& [name, t] : scan.tensors) r.bytes_by_dtype[t.dtype_name] += t.end - t.begin;
  const flux2::WeightSource src(scan);
  r.layout = layout_name(scan, src.bfl_layout());
  for (const auto& [name, t] : src.tensors()) r.parameters += shape_numel(t.shape);

  const std::string cls = scan.config ? qwen::class_name(*scan.config) : "";
  if (cls == "QwenImage21Transformer2DModel" || cls == "QwenImageTransformer2DModel") {
    const bool v21 = cls == "QwenImage21Transformer2DModel";
    r.family = v21 ? "Qwen-Image-2.1" : "Qwen-Image";
    try {
      std::vector<ExpectedTensor> table;
      if (v21) {
        const qwen::Config21 c =
            qwen::Config21::from_json(*scan.config, scan.path + "/config.json");
        table = qwen::weight_table(c);
        r.config_json = c.to_json().dump();
        r.variant = "Qwen-Image-2.1 (" + std::to_string(c.num_layers) + " blocks, width " +
                    std::to_string(c.dim()) + "); exact prefix cache " +
                    (c.causal_condition ? "available (causal_condition)"
                                        : "unavailable (no causal_condition)");
      } else {
        const qwen::ConfigQwenImage c =
            qwen::ConfigQwenImage::from_json(*scan.config, scan.path + "/config.json");
        table = qwen::weight_table(c);
        r.config_json = c.to_json().dump();
        r.variant = "Qwen-Image (" + std::to_string(c.num_layers) + " dual-stream blocks, width " +
                    std::to_string(c.dim()) + "); no exact conditioning cache";
      }
      for (const std::string& p : check_against_table(scan.tensors, table)) r.problems.push_back(p);
    } catch (const Error& e) {
      r.problems.push_back(e.what());
    }
    return r;
  }
  if (!looks_like_flux2(scan, src)) {
    r.family = "unknown";
    const std::string shown = cls.empty() ? "no _class_name" : "\"" + cls + "\"";
    r.variant = "not a known transformer (" + shown + ")";
    r.problems.push_back("flowkv does not know this model (" + shown +
                         "); it runs FLUX.2, Qwen-Image and Qwen-Image-2.1 transformers");
    return r;
  }
  r.family = "FLUX.2";
  flux2::Config found;
  try {
    found = flux2::infer_config(src.tensors());
  } catch (const Error& e) {
    r.problems.push_back(e.what());
    r.variant = "FLUX.2 whose tensors cannot be read as a model";
    return r;
  }
  flux2::Config cfg = found;
  r.config_inferred = true;
  if (scan.config) {
    try {
      cfg = flux2::Config::from_json(*scan.config, scan.path + "/config.json");
      r.config_inferred = false;
    } catch (const Error& e) {
      r.problems.push_back(e.what());
    }
  }
  try {
    cfg.validate(r.config_inferred ? scan.path + " (config inferred from shapes)"
                                   : scan.path + "/config.json");
  } catch (const Error& e) {
    r.problems.push_back(e.what());
    r.variant = "FLUX.2 with an impossible configuration";
    return r;
  }
  r.variant = flux2::variant_name(cfg);
  r.config_json = cfg.to_json().dump();
  for (const std::string& k : src.unmapped()) r.problems.push_back("unknown BFL key: " + k);
  if (!r.config_inferred) {
    for (const std::string& s : flux2::config_disagreements(cfg, found, src.tensors())) {
      r.problems.push_back(s);
    }
  }
  for (const std::string& s : check_against_table(src.tensors(), flux2::weight_table(cfg))) {
    r.problems.push_back(s);
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
  o << "bytes:     ";
  for (const auto& [dt, b] : r.bytes_by_dtype) o << " " << dt << " " << b << " (" << gib(b) << ")";
  o << "\n";
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
