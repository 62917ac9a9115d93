// quantize_checkpoint: any checkpoint flowkv reads, written as a GGUF file.
#include <map>
#include <memory>
#include <vector>

#include "families/family.h"
#include "flowkv/error.h"
#include "flowkv/io.h"
#include "io/checkpoint.h"
#include "io/gguf.h"

namespace flowkv {

namespace {

// The type a tensor is written as: `type` for matrices (or a family's stacks of matrices)
// whose rows are whole blocks of it, else Q8_0, else F16; F32 for everything else.
DType target_type(const Shape& shape, bool matrices, DType type) {
  if (!matrices) return DType::kF32;
  for (DType c : {type, DType::kQ8_0, DType::kF16}) {
    if (shape.back() % dtype_block(c) == 0) return c;
  }
  return DType::kF16;
}

}  // namespace

QuantizeReport quantize_checkpoint(const std::string& in, const std::string& out, DType type,
                                   const std::function<void(int64_t, int64_t)>& progress) {
  FLOWKV_CHECK(type != DType::kF32, "quantize: the type must be narrower than F32 (f16, bf16, ",
               "q8_0, q4_0, q4_1, q5_0, q5_1, q4_k, q5_k, q6_k)");
  const CheckpointScan scan = scan_checkpoint(in);
  FLOWKV_CHECK(!scan.tensors.empty(), in, ": no tensors to quantize");
  GgufMetadata meta;
  if (const families::Family* f = families::for_scan(scan)) {
    meta.emplace_back("general.architecture", GgufValue::string(f->info.name));
  }
  meta.emplace_back("general.quantization_version", GgufValue::u32(2));
  meta.emplace_back("flowkv.weight_type", GgufValue::string(std::string(dtype_name(type))));
  if (scan.config) meta.emplace_back("flowkv.config", GgufValue::string(scan.config->dump()));
  const CheckpointReader reader(scan);
  QuantizeReport rep;
  std::vector<Tensor> data;
  std::vector<TensorToWrite> tensors;
  data.reserve(scan.tensors.size());
  const families::Family* fam = families::for_scan(scan);
  // A GGUF input already holds the family's form.
  const bool reform = fam && fam->gguf_form && !scan.gguf;
  for (const auto& [name, info] : scan.tensors) {
    Tensor t = reader.get(name);
    bool matrices = info.shape.size() == 2;
    if (reform) {
      if (std::optional<Tensor> f = fam->gguf_form(name, t)) {
        t = std::move(*f);
        matrices = true;
      }
    }
    const DType to = target_type(t.shape(), matrices, type);
    data.push_back(t.to(to));
    tensors.push_back({name, to, t.shape(), data.back().raw()});
    rep.tensors += 1;
    rep.quantized += to == type ? 1 : 0;
    rep.fallback += matrices && to != type ? 1 : 0;
    rep.bytes_in += info.end - info.begin;
    rep.bytes_out += data.back().nbytes();
    if (progress) progress(rep.tensors, static_cast<int64_t>(scan.tensors.size()));
  }
  write_gguf(out, meta, tensors);
  return rep;
}

}  // namespace flowkv
