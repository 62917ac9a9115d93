// libFuzzer target: the GGUF header parser (io/gguf.h) and the dequantizers (quant/quant.h), on
// the input as a file. Each input is parsed as a whole file and as the head of a larger one (the
// data section runs on past the input). A successful parse must leave every tensor inside the
// data section, aligned, sized by its shape and type, without overlaps; the tensors whose bytes
// are inside the input are then dequantized row by row (ASan checks that no read leaves them).
// A header in llama.cpp's Qwen2.5-VL names ("qwen2vl") also goes through the config built from
// its metadata and the tensor renaming (models/qwen25_vl/source.h).
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "fuzz_common.h"
#include "io/gguf.h"
#include "models/qwen25_vl/source.h"
#include "quant/quant.h"

namespace {

using flowkv::GgufHeader;

void check_invariants(const GgufHeader& h, int64_t file_size) {
  FUZZ_ASSERT(h.alignment > 0 && (h.alignment & (h.alignment - 1)) == 0, "alignment %lld",
              static_cast<long long>(h.alignment));
  FUZZ_ASSERT(h.data_start % h.alignment == 0, "data_start %lld not aligned",
              static_cast<long long>(h.data_start));
  for (const flowkv::TensorInfo& t : h.tensors) {
    FUZZ_ASSERT(
        t.dtype_known && t.begin >= 0 && t.begin <= t.end && h.data_start + t.end <= file_size,
        "tensor '%s' accepted with data [%lld, %lld) past the file", t.name.c_str(),
        static_cast<long long>(t.begin), static_cast<long long>(t.end));
    FUZZ_ASSERT(t.begin % h.alignment == 0, "tensor '%s' misaligned", t.name.c_str());
    FUZZ_ASSERT(!t.shape.empty() && t.shape.back() % flowkv::dtype_block(t.dtype) == 0,
                "tensor '%s': rows not whole blocks", t.name.c_str());
    __int128 n = 1;
    for (int64_t d : t.shape) {
      FUZZ_ASSERT(d >= 1, "tensor '%s' accepted with dimension %lld", t.name.c_str(),
                  static_cast<long long>(d));
      n *= d;
    }
    const __int128 bytes = n / flowkv::dtype_block(t.dtype) * flowkv::dtype_block_bytes(t.dtype);
    FUZZ_ASSERT(bytes == t.end - t.begin, "tensor '%s': span does not match its shape",
                t.name.c_str());
  }
  for (size_t i = 0; i < h.tensors.size(); ++i) {
    for (size_t j = i + 1; j < h.tensors.size() && j < i + 64; ++j) {
      const auto &a = h.tensors[i], &b = h.tensors[j];
      FUZZ_ASSERT(a.end <= b.begin || b.end <= a.begin || a.begin == a.end || b.begin == b.end,
                  "tensors '%s' and '%s' overlap", a.name.c_str(), b.name.c_str());
    }
  }
}

// Dequantizes (at most ~1M elements of) every tensor held inside the input.
void dequantize_all(const GgufHeader& h, const uint8_t* data, int64_t size) {
  int64_t budget = int64_t{1} << 20;
  std::vector<float> row;
  for (const flowkv::TensorInfo& t : h.tensors) {
    if (h.data_start + t.end > size) continue;
    const int64_t cols = t.shape.back();
    if (cols > budget) continue;
    const int64_t rows = (t.end - t.begin) / flowkv::dtype_bytes(t.dtype, cols);
    const int64_t row_bytes = flowkv::dtype_bytes(t.dtype, cols);
    row.resize(static_cast<size_t>(cols));
    for (int64_t r = 0; r < rows && budget >= cols; ++r, budget -= cols) {
      const uint8_t* src = data + h.data_start + t.begin + r * row_bytes;
      // Copied to a buffer of exactly one row: ASan reports any read past it.
      std::vector<uint8_t> exact(src, src + row_bytes);
      flowkv::quant::dequantize_row(t.dtype, exact.data(), row.data(), cols);
      flowkv::quant::dequantize_row_ref(t.dtype, exact.data(), row.data(), cols);
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto n = static_cast<int64_t>(size);
  for (const int64_t file_size : {n, n + (int64_t{1} << 30)}) {
    flowkv::fuzz::expect_only_flowkv_errors([&] {
      const GgufHeader h = flowkv::parse_gguf_header("fuzz.gguf", data, n, file_size);
      check_invariants(h, file_size);
      dequantize_all(h, data, n);
      if (flowkv::qwen25_vl::is_llama_cpp_gguf(h)) {
        const auto cfg = flowkv::qwen25_vl::config_from_llama_cpp(h);
        std::map<std::string, flowkv::TensorInfo> tensors;
        for (const flowkv::TensorInfo& t : h.tensors) tensors.emplace(t.name, t);
        const auto renamed = flowkv::qwen25_vl::rename_llama_cpp_tensors(tensors, cfg, h.path);
        FUZZ_ASSERT(static_cast<int64_t>(renamed.size()) == 2 + 12 * cfg.text.num_hidden_layers,
                    "renamed %zu tensors", renamed.size());
      }
    });
  }
  return 0;
}
