// Reading the golden dumps of python/ref and comparing traced intermediates with them.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "core/exec_context.h"
#include "flowkv/generate.h"
#include "io/json.h"
#include "io/safetensors.h"
#include "test_util.h"

namespace flowkv::test {

inline std::string golden(const std::string& rel) {
  return std::string(FLOWKV_GOLDEN_DIR) + "/" + rel;
}

// A generate() request as the python/ref pipeline dumpers record it in their meta.json: the
// prompt, reference files (under tests/golden), steps, seed, and where given the size and the
// negative prompt with its CFG scale and output resolution.
inline GenerateRequest golden_request(const Json& q) {
  GenerateRequest r;
  r.prompt = q["prompt"].get<std::string>();
  for (const Json& ref : q["references"]) r.references.push_back(golden(ref.get<std::string>()));
  r.steps = q["steps"].get<int>();
  r.seed = q["seed"].get<uint64_t>();
  if (q.contains("width"))
    r.width = q["width"].get<int64_t>(), r.height = q["height"].get<int64_t>();
  if (q.contains("negative_prompt")) {
    r.negative_prompt = q["negative_prompt"].get<std::string>();
    r.has_negative_prompt = true;
    r.cfg_scale = q["true_cfg_scale"].get<float>();
    r.resolution = q["output_resolution"].get<int64_t>();
  }
  return r;
}

// All tensors of a safetensors file as f32 copies.
inline std::map<std::string, Tensor> load_tensors(const std::string& path) {
  SafetensorsFile f = SafetensorsFile::open(path);
  std::map<std::string, Tensor> out;
  for (const TensorInfo& t : f.header().tensors) out[t.name] = f.view(t).to_f32();
  return out;
}

// Records every traced tensor under prefix + name.
class CaptureTracer : public Tracer {
 public:
  std::string prefix;
  std::map<std::string, Tensor> got;
  void record(std::string_view name, const Tensor& t) override {
    got[prefix + std::string(name)] = t.clone();
  }
};

// Compares `got` with every dumped name that starts with `prefix`, in the dump's order
// (meta.json "dump_names": forward order), and reports the first one that diverges.
// Tolerance: max |got - ref| <= rel_tol * max |ref| for each tensor; the worst NMSE is
// reported beside it. The names compared are exactly those meta.json lists under the prefix:
// each must be dumped and traced (a rename on either side fails), and at least one must match
// (a prefix that matches nothing fails instead of passing empty).
inline void expect_matches_dump(const std::map<std::string, Tensor>& got,
                                const std::map<std::string, Tensor>& dump,
                                const std::vector<std::string>& order, const std::string& prefix,
                                double rel_tol, int* compared = nullptr) {
  int n = 0;
  double worst = 0, worst_nmse = 0;
  std::string worst_name;
  for (const std::string& name : order) {
    if (name.rfind(prefix, 0) != 0) continue;
    auto ref = dump.find(name);
    ASSERT_TRUE(ref != dump.end()) << name;
    auto it = got.find(name);
    ASSERT_TRUE(it != got.end()) << "flowkv did not trace " << name;
    ASSERT_EQ(it->second.shape(), ref->second.shape())
        << name << ": shape " << shape_str(it->second.shape()) << " vs reference "
        << shape_str(ref->second.shape());
    const ErrorStats e = compare(it->second.f32(), ref->second.f32(), ref->second.numel());
    ASSERT_LE(e.rel(), rel_tol) << "first diverging tensor: " << name << " (max abs error "
                                << e.max_abs << ", max |ref| " << e.max_ref << ")";
    if (std::getenv("FLOWKV_TRACE_ERRORS")) std::printf("    %-55s %.3g\n", name.c_str(), e.rel());
    if (e.rel() >= worst) {
      worst = e.rel();
      worst_name = name;
    }
    worst_nmse = std::max(worst_nmse, e.nmse());
    ++n;
  }
  ASSERT_GT(n, 0) << "no dumped tensor name starts with '" << prefix << "'";
  if (compared) *compared = n;
  std::printf("  %d tensors under '%s' match; worst relative error %.3g (%s), worst NMSE %.3g\n", n,
              prefix.c_str(), worst, worst_name.c_str(), worst_nmse);
}

// One dumped case: its folder, inputs, dumped intermediates in forward order, and meta.json.
struct GoldenCase {
  std::string dir;
  std::map<std::string, Tensor> in, dump;
  std::vector<std::string> order;
  Json meta;
  explicit GoldenCase(const std::string& rel) : dir(golden(rel)) {
    in = load_tensors(dir + "/inputs.safetensors");
    dump = load_tensors(dir + "/dump.safetensors");
    meta = read_json_file(dir + "/meta.json");
    order = meta.at("dump_names").get<std::vector<std::string>>();
  }
  const float* at(const std::string& name) const { return in.at(name).f32(); }
};

// How far two 8-bit pictures' values are apart (same size): the largest difference and how many
// values differ.
struct PixelDiff {
  int worst = 0;
  int64_t differ = 0;
};
inline PixelDiff diff_pixels(const std::vector<uint8_t>& got, const std::vector<uint8_t>& want) {
  PixelDiff r;
  for (size_t i = 0; i < std::min(got.size(), want.size()); ++i) {
    const int d = std::abs(int(got[i]) - int(want[i]));
    r.worst = std::max(r.worst, d);
    r.differ += d != 0;
  }
  return r;
}

}  // namespace flowkv::test
