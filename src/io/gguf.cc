#include "io/gguf.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <set>
#include <sstream>

#include "core/checked.h"
#include "flowkv/error.h"
#include "flowkv/limits.h"
#include "io/atomic_file.h"

namespace flowkv {
namespace {

constexpr uint32_t kMagic = 0x46554747;  // "GGUF" read as a little-endian u32
constexpr int kMaxDims = 4;              // GGML_MAX_DIMS
// A tensor of more dimensions is stored folded to 4 (gguf.h: kGgufShapeKey).
constexpr int kMaxShapeDims = 8;
constexpr int64_t kDefaultAlignment = 32;
constexpr int64_t kMaxAlignment = int64_t{1} << 30;

// ggml's type ids and names (ggml.h); removed ids keep their old names for the message.
constexpr std::string_view kGgmlNames[] = {"F32",
                                           "F16",
                                           "Q4_0",
                                           "Q4_1",
                                           "Q4_2 (removed)",
                                           "Q4_3 (removed)",
                                           "Q5_0",
                                           "Q5_1",
                                           "Q8_0",
                                           "Q8_1",
                                           "Q2_K",
                                           "Q3_K",
                                           "Q4_K",
                                           "Q5_K",
                                           "Q6_K",
                                           "Q8_K",
                                           "IQ2_XXS",
                                           "IQ2_XS",
                                           "IQ3_XXS",
                                           "IQ1_S",
                                           "IQ4_NL",
                                           "IQ3_S",
                                           "IQ2_S",
                                           "IQ4_XS",
                                           "I8",
                                           "I16",
                                           "I32",
                                           "I64",
                                           "F64",
                                           "IQ1_M",
                                           "BF16",
                                           "Q4_0_4_4",
                                           "Q4_0_4_8",
                                           "Q4_0_8_8",
                                           "TQ1_0",
                                           "TQ2_0",
                                           "IQ4_NL_4_4",
                                           "IQ4_NL_4_8",
                                           "IQ4_NL_8_8",
                                           "MXFP4",
                                           "NVFP4",
                                           "Q1_0",
                                           "Q2_0"};

constexpr DType kSupported[] = {DType::kF32,  DType::kF16,  DType::kBF16, DType::kQ8_0,
                                DType::kQ4_0, DType::kQ4_1, DType::kQ5_0, DType::kQ5_1,
                                DType::kQ4_K, DType::kQ5_K, DType::kQ6_K};

bool dtype_of_ggml(uint32_t id, DType* out) {
  for (DType t : kSupported) {
    if (ggml_type_of(t) == id) {
      *out = t;
      return true;
    }
  }
  return false;
}

std::string supported_list() {
  std::string s;
  for (DType t : kSupported) s += (s.empty() ? "" : ", ") + std::string(dtype_name(t));
  return s;
}

// Bounds-checked little-endian reads from the header bytes.
class Cursor {
 public:
  Cursor(const std::string& path, const uint8_t* p, int64_t n) : path_(path), p_(p), n_(n) {}

  int64_t pos() const { return pos_; }
  int64_t left() const { return n_ - pos_; }

  void need(int64_t bytes, std::string_view what) {
    FLOWKV_CHECK(bytes >= 0 && bytes <= left(), path_, ": GGUF file truncated reading ", what,
                 " at byte ", pos_, " (needs ", bytes, " bytes, ", left(), " left)");
  }
  template <class T>
  T read(std::string_view what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, p_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  std::string string(std::string_view what) {
    const uint64_t len = read<uint64_t>(what);
    FLOWKV_CHECK(len <= static_cast<uint64_t>(limits::kMaxGgufStringBytes), path_, ": ", what,
                 " is a string of ", len, " bytes; the limit is ", limits::kMaxGgufStringBytes);
    need(static_cast<int64_t>(len), what);
    std::string s(reinterpret_cast<const char*>(p_ + pos_), static_cast<size_t>(len));
    pos_ += static_cast<int64_t>(len);
    return s;
  }
  const std::string& path() const { return path_; }

 private:
  const std::string& path_;
  const uint8_t* p_;
  int64_t n_;
  int64_t pos_ = 0;
};

int64_t scalar_size(GgufType t) {
  switch (t) {
    case GgufType::kU8:
    case GgufType::kI8:
    case GgufType::kBool:
      return 1;
    case GgufType::kU16:
    case GgufType::kI16:
      return 2;
    case GgufType::kU32:
    case GgufType::kI32:
    case GgufType::kF32:
      return 4;
    case GgufType::kU64:
    case GgufType::kI64:
    case GgufType::kF64:
      return 8;
    case GgufType::kString:
      return 8;  // at least its length
    case GgufType::kArray:
      return 12;  // at least its element type and count
  }
  return 1;
}

GgufType value_type(Cursor& c, std::string_view what) {
  const uint32_t t = c.read<uint32_t>(what);
  FLOWKV_CHECK(t <= static_cast<uint32_t>(GgufType::kF64), c.path(), ": ", what,
               " has unknown GGUF value type ", t, " (known: 0..12)");
  return static_cast<GgufType>(t);
}

// Reads one scalar of type t into v (i, u, f or s).
void read_scalar(Cursor& c, GgufType t, GgufValue& v, const std::string& what) {
  switch (t) {
    case GgufType::kU8:
      v.u = c.read<uint8_t>(what);
      return;
    case GgufType::kI8:
      v.i = c.read<int8_t>(what);
      return;
    case GgufType::kU16:
      v.u = c.read<uint16_t>(what);
      return;
    case GgufType::kI16:
      v.i = c.read<int16_t>(what);
      return;
    case GgufType::kU32:
      v.u = c.read<uint32_t>(what);
      return;
    case GgufType::kI32:
      v.i = c.read<int32_t>(what);
      return;
    case GgufType::kF32:
      v.f = c.read<float>(what);
      return;
    case GgufType::kBool: {
      const uint8_t b = c.read<uint8_t>(what);
      FLOWKV_CHECK(b <= 1, c.path(), ": ", what, " is a bool of value ", int{b}, " (not 0 or 1)");
      v.i = b;
      return;
    }
    case GgufType::kString:
      v.s = c.string(what);
      return;
    case GgufType::kU64:
      v.u = c.read<uint64_t>(what);
      return;
    case GgufType::kI64:
      v.i = c.read<int64_t>(what);
      return;
    case GgufType::kF64:
      v.f = c.read<double>(what);
      return;
    case GgufType::kArray:
      break;
  }
  fail(c.path(), ": ", what, ": an array inside an array is not supported");
}

GgufValue read_value(Cursor& c, GgufType t, const std::string& what) {
  GgufValue v;
  v.type = t;
  if (t != GgufType::kArray) {
    read_scalar(c, t, v, what);
    return v;
  }
  v.array_type = value_type(c, what + " (array element type)");
  FLOWKV_CHECK(v.array_type != GgufType::kArray, c.path(), ": ", what,
               ": an array of arrays is not supported");
  const uint64_t n = c.read<uint64_t>(what + " (array length)");
  FLOWKV_CHECK(n <= static_cast<uint64_t>(limits::kMaxGgufArrayElements), c.path(), ": ", what,
               " is an array of ", n, " elements; the limit is ", limits::kMaxGgufArrayElements);
  const auto count = static_cast<int64_t>(n);
  // Every element takes at least scalar_size bytes: refuse a count the file cannot hold before
  // reserving anything.
  FLOWKV_CHECK(count * scalar_size(v.array_type) <= c.left(), c.path(), ": ", what,
               " is an array of ", count, " ", gguf_type_name(v.array_type),
               " elements, more than the ", c.left(), " bytes left in the file hold");
  const auto sz = static_cast<size_t>(count);
  GgufValue e;
  switch (v.array_type) {
    case GgufType::kU8:
    case GgufType::kU16:
    case GgufType::kU32:
    case GgufType::kU64:
      v.au.reserve(sz);
      for (int64_t k = 0; k < count; ++k) {
        read_scalar(c, v.array_type, e, what);
        v.au.push_back(e.u);
      }
      break;
    case GgufType::kF32:
    case GgufType::kF64:
      v.af.reserve(sz);
      for (int64_t k = 0; k < count; ++k) {
        read_scalar(c, v.array_type, e, what);
        v.af.push_back(e.f);
      }
      break;
    case GgufType::kString:
      v.as.reserve(sz);
      for (int64_t k = 0; k < count; ++k) v.as.push_back(c.string(what));
      break;
    default:  // signed integers and bool
      v.ai.reserve(sz);
      for (int64_t k = 0; k < count; ++k) {
        read_scalar(c, v.array_type, e, what);
        v.ai.push_back(e.i);
      }
      break;
  }
  return v;
}

int64_t align_up(int64_t x, int64_t a, std::string_view what) {
  return checked_add(x, (a - x % a) % a, what);
}

}  // namespace

std::string_view gguf_type_name(GgufType t) {
  constexpr std::string_view names[] = {"UINT8",  "INT8",    "UINT16", "INT16",  "UINT32",
                                        "INT32",  "FLOAT32", "BOOL",   "STRING", "ARRAY",
                                        "UINT64", "INT64",   "FLOAT64"};
  const auto i = static_cast<uint32_t>(t);
  return i < std::size(names) ? names[i] : "?";
}

std::string ggml_type_name(uint32_t id) {
  if (id < std::size(kGgmlNames)) return std::string(kGgmlNames[id]);
  return "type " + std::to_string(id);
}

uint32_t ggml_type_of(DType t) {
  switch (t) {
    case DType::kF32:
      return 0;
    case DType::kF16:
      return 1;
    case DType::kQ4_0:
      return 2;
    case DType::kQ4_1:
      return 3;
    case DType::kQ5_0:
      return 6;
    case DType::kQ5_1:
      return 7;
    case DType::kQ8_0:
      return 8;
    case DType::kQ4_K:
      return 12;
    case DType::kQ5_K:
      return 13;
    case DType::kQ6_K:
      return 14;
    case DType::kBF16:
      return 30;
  }
  return 0;
}

GgufValue GgufValue::string(std::string v) {
  GgufValue r;
  r.type = GgufType::kString;
  r.s = std::move(v);
  return r;
}
GgufValue GgufValue::u32(uint32_t v) {
  GgufValue r;
  r.type = GgufType::kU32;
  r.u = v;
  return r;
}
GgufValue GgufValue::u64(uint64_t v) {
  GgufValue r;
  r.type = GgufType::kU64;
  r.u = v;
  return r;
}
GgufValue GgufValue::i32(int32_t v) {
  GgufValue r;
  r.type = GgufType::kI32;
  r.i = v;
  return r;
}
GgufValue GgufValue::f32(float v) {
  GgufValue r;
  r.type = GgufType::kF32;
  r.f = v;
  return r;
}
GgufValue GgufValue::boolean(bool v) {
  GgufValue r;
  r.type = GgufType::kBool;
  r.i = v;
  return r;
}
GgufValue GgufValue::strings(std::vector<std::string> v) {
  GgufValue r;
  r.type = GgufType::kArray;
  r.array_type = GgufType::kString;
  r.as = std::move(v);
  return r;
}
GgufValue GgufValue::i32s(std::vector<int64_t> v) {
  GgufValue r;
  r.type = GgufType::kArray;
  r.array_type = GgufType::kI32;
  r.ai = std::move(v);
  return r;
}

int64_t GgufValue::array_size() const {
  if (type != GgufType::kArray) return 0;
  return static_cast<int64_t>(ai.size() + au.size() + af.size() + as.size());
}

std::string GgufValue::summary(int max_items) const {
  std::ostringstream out;
  auto scalar = [&](GgufType t, int64_t iv, uint64_t uv, double fv, const std::string& sv) {
    switch (t) {
      case GgufType::kString:
        out << '"' << (sv.size() > 60 ? sv.substr(0, 57) + "..." : sv) << '"';
        break;
      case GgufType::kBool:
        out << (iv ? "true" : "false");
        break;
      case GgufType::kF32:
      case GgufType::kF64:
        out << fv;
        break;
      case GgufType::kU8:
      case GgufType::kU16:
      case GgufType::kU32:
      case GgufType::kU64:
        out << uv;
        break;
      default:
        out << iv;
    }
  };
  if (type != GgufType::kArray) {
    scalar(type, i, u, f, s);
    return out.str();
  }
  const int64_t n = array_size();
  out << '[';
  for (int64_t k = 0; k < n && k < max_items; ++k) {
    if (k) out << ", ";
    const auto z = static_cast<size_t>(k);
    scalar(array_type, ai.empty() ? 0 : ai[z], au.empty() ? 0 : au[z], af.empty() ? 0 : af[z],
           as.empty() ? std::string() : as[z]);
  }
  if (n > max_items) out << ", ... " << n << " " << gguf_type_name(array_type) << " items";
  out << ']';
  return out.str();
}

const GgufValue* GgufHeader::find(std::string_view key) const {
  for (const auto& [k, v] : metadata) {
    if (k == key) return &v;
  }
  return nullptr;
}

namespace {

// flowkv.shape.<name>: the PyTorch shape of a tensor write_gguf folded to 4 dimensions. Checked
// against the stored tensor (5 to kMaxShapeDims sizes, the innermost three as stored, the same
// element count) before it replaces the stored shape.
void restore_folded_shapes(GgufHeader& h) {
  const std::string prefix = kGgufShapeKey;
  std::map<std::string_view, TensorInfo*> by_name;
  for (TensorInfo& t : h.tensors) by_name.emplace(t.name, &t);
  for (const auto& [key, v] : h.metadata) {
    if (!key.starts_with(prefix)) continue;
    const std::string what = h.path + ": metadata \"" + key + "\"";
    auto it = by_name.find(std::string_view(key).substr(prefix.size()));
    FLOWKV_CHECK(it != by_name.end(), what, " names no tensor of the file");
    TensorInfo& t = *it->second;
    const bool ints = v.type == GgufType::kArray && (v.ai.size() > 0 || v.au.size() > 0);
    const int64_t n = v.array_size();
    FLOWKV_CHECK(ints && n >= kMaxDims + 1 && n <= kMaxShapeDims, what,
                 " must be an integer array of ", kMaxDims + 1, " to ", kMaxShapeDims,
                 " sizes (the shape of a tensor stored folded to ", kMaxDims, " dimensions)");
    Shape shape;
    for (int64_t k = 0; k < n; ++k) {
      const auto z = static_cast<size_t>(k);
      const bool ok = v.ai.empty() ? (v.au[z] >= 1 && v.au[z] <= static_cast<uint64_t>(INT64_MAX))
                                   : v.ai[z] >= 1;
      FLOWKV_CHECK(ok, what, ": size ", k, " is not a positive integer");
      shape.push_back(v.ai.empty() ? static_cast<int64_t>(v.au[z]) : v.ai[z]);
    }
    const int64_t numel = checked_numel(shape, what + " element count");
    FLOWKV_CHECK(t.shape.size() == static_cast<size_t>(kMaxDims) &&
                     std::equal(t.shape.end() - 3, t.shape.end(), shape.end() - 3) &&
                     numel == shape_numel(t.shape),
                 what, ": shape ", shape_str(shape), " does not fold to the stored ",
                 shape_str(t.shape), " (its leading sizes multiplied, the last three kept)");
    t.shape = std::move(shape);
  }
}

}  // namespace

GgufHeader parse_gguf_header(const std::string& path, const void* data, int64_t size,
                             int64_t file_size) {
  FLOWKV_CHECK(size >= 0 && size <= file_size, path, ": ", size,
               " header bytes given for a file of ", file_size);
  Cursor c(path, static_cast<const uint8_t*>(data), size);
  GgufHeader h;
  h.path = path;
  h.file_size = file_size;
  FLOWKV_CHECK(size >= 4, path, ": not a GGUF file (", size, " bytes, too short for the magic)");
  const uint32_t magic = c.read<uint32_t>("magic");
  FLOWKV_CHECK(magic == kMagic, path, ": not a GGUF file (the first 4 bytes are not \"GGUF\")");
  h.version = c.read<uint32_t>("version");
  FLOWKV_CHECK(h.version != 0x02000000u && h.version != 0x03000000u, path,
               ": a big-endian GGUF file; only little-endian GGUF is supported");
  FLOWKV_CHECK(h.version == 2 || h.version == 3, path, ": GGUF version ", h.version,
               " is not supported (versions 2 and 3 are)");
  const uint64_t n_tensors = c.read<uint64_t>("tensor count");
  const uint64_t n_kv = c.read<uint64_t>("metadata count");
  FLOWKV_CHECK(n_tensors <= static_cast<uint64_t>(limits::kMaxTensors), path, ": ", n_tensors,
               " tensors; the limit is ", limits::kMaxTensors);
  FLOWKV_CHECK(n_kv <= static_cast<uint64_t>(limits::kMaxGgufKeys), path, ": ", n_kv,
               " metadata keys; the limit is ", limits::kMaxGgufKeys);
  // A key takes at least 12 bytes (length and type), a tensor info at least 8 + 4 + 4 + 8.
  FLOWKV_CHECK(static_cast<int64_t>(n_kv) * 12 + static_cast<int64_t>(n_tensors) * 24 <= c.left(),
               path, ": GGUF file truncated: ", n_kv, " metadata keys and ", n_tensors,
               " tensors cannot fit in the ", c.left(), " bytes after the header");

  std::set<std::string> keys;
  h.metadata.reserve(static_cast<size_t>(n_kv));
  for (uint64_t k = 0; k < n_kv; ++k) {
    std::string key = c.string("metadata key " + std::to_string(k));
    FLOWKV_CHECK(!key.empty(), path, ": metadata key ", k, " is empty");
    FLOWKV_CHECK(keys.insert(key).second, path, ": metadata key \"", key, "\" appears twice");
    const GgufType t = value_type(c, "metadata \"" + key + "\"");
    GgufValue v = read_value(c, t, "metadata \"" + key + "\"");
    h.metadata.emplace_back(std::move(key), std::move(v));
  }
  if (const GgufValue* a = h.find("general.alignment")) {
    FLOWKV_CHECK(a->type == GgufType::kU32, path, ": general.alignment is ",
                 gguf_type_name(a->type), "; it must be UINT32");
    const auto al = static_cast<int64_t>(a->u);
    FLOWKV_CHECK(al > 0 && al <= kMaxAlignment && (al & (al - 1)) == 0, path,
                 ": general.alignment ", al, " is not a power of two up to ", kMaxAlignment);
    h.alignment = al;
  } else {
    h.alignment = kDefaultAlignment;
  }

  std::set<std::string> names;
  h.tensors.reserve(static_cast<size_t>(n_tensors));
  for (uint64_t k = 0; k < n_tensors; ++k) {
    TensorInfo ti;
    ti.file = path;
    ti.name = c.string("name of tensor " + std::to_string(k));
    const std::string what = "tensor \"" + ti.name + "\"";
    FLOWKV_CHECK(!ti.name.empty(), path, ": tensor ", k, " has an empty name");
    FLOWKV_CHECK(names.insert(ti.name).second, path, ": ", what, " appears twice");
    const uint32_t n_dims = c.read<uint32_t>(what + " dimension count");
    FLOWKV_CHECK(n_dims >= 1 && n_dims <= kMaxDims, path, ": ", what, " has ", n_dims,
                 " dimensions (1 to ", kMaxDims, " are allowed)");
    int64_t ne[kMaxDims];
    for (uint32_t d = 0; d < n_dims; ++d) {
      const uint64_t v = c.read<uint64_t>(what + " dimensions");
      FLOWKV_CHECK(v >= 1 && v <= static_cast<uint64_t>(INT64_MAX), path, ": ", what,
                   " has dimension ", d, " of size ", v, " (must be 1 to 2^63-1)");
      ne[d] = static_cast<int64_t>(v);
    }
    for (uint32_t d = n_dims; d-- > 0;) ti.shape.push_back(ne[d]);  // ggml order -> PyTorch
    const uint32_t type = c.read<uint32_t>(what + " type");
    ti.dtype_name = ggml_type_name(type);
    FLOWKV_CHECK(dtype_of_ggml(type, &ti.dtype), path, ": ", what, " has ggml type ", ti.dtype_name,
                 " (id ", type, "), which flowkv does not read; supported: ", supported_list());
    ti.dtype_known = true;
    const int64_t numel = checked_numel(ti.shape, path + ": " + what + " element count");
    const int64_t block = dtype_block(ti.dtype);
    FLOWKV_CHECK(ne[0] % block == 0, path, ": ", what, " is ", ti.dtype_name, " but its rows of ",
                 ne[0], " elements are not a whole number of ", block, "-element blocks");
    const int64_t bytes =
        checked_mul(numel / block, dtype_block_bytes(ti.dtype), path + ": " + what + " byte size");
    const uint64_t off = c.read<uint64_t>(what + " offset");
    FLOWKV_CHECK(off <= static_cast<uint64_t>(INT64_MAX), path, ": ", what, " offset ", off,
                 " is out of range");
    ti.begin = static_cast<int64_t>(off);
    FLOWKV_CHECK(ti.begin % h.alignment == 0, path, ": ", what, " offset ", ti.begin,
                 " is not a multiple of the alignment ", h.alignment);
    ti.end = checked_add(ti.begin, bytes, path + ": " + what + " end");
    h.tensors.push_back(std::move(ti));
  }
  h.data_start = align_up(c.pos(), h.alignment, path + ": data section start");
  restore_folded_shapes(h);

  // Every tensor inside the data section, none overlapping another, each aligned in memory.
  const int64_t data_bytes = file_size - std::min(file_size, h.data_start);
  std::vector<const TensorInfo*> by_begin;
  by_begin.reserve(h.tensors.size());
  for (const TensorInfo& t : h.tensors) {
    FLOWKV_CHECK(h.data_start <= file_size && t.end <= data_bytes, path, ": tensor \"", t.name,
                 "\" (bytes ", t.begin, "..", t.end,
                 " of the data section) runs past the end of "
                 "the file (the data section holds ",
                 data_bytes, " bytes)");
    const int64_t elem_align = dtype_is_quantized(t.dtype) ? 1 : dtype_size(t.dtype);
    FLOWKV_CHECK((h.data_start + t.begin) % elem_align == 0, path, ": tensor \"", t.name,
                 "\" starts at byte ", h.data_start + t.begin, ", not aligned for ", t.dtype_name);
    by_begin.push_back(&t);
  }
  std::sort(by_begin.begin(), by_begin.end(),
            [](const TensorInfo* a, const TensorInfo* b) { return a->begin < b->begin; });
  for (size_t k = 1; k < by_begin.size(); ++k) {
    const TensorInfo& a = *by_begin[k - 1];
    const TensorInfo& b = *by_begin[k];
    FLOWKV_CHECK(b.begin >= a.end || a.begin == a.end || b.begin == b.end, path, ": tensors \"",
                 a.name, "\" (bytes ", a.begin, "..", a.end, ") and \"", b.name, "\" (bytes ",
                 b.begin, "..", b.end, ") overlap");
  }
  return h;
}

GgufHeader read_gguf_header(const std::string& path) {
  auto map = MappedFile::open(path);
  return parse_gguf_header(path, map->data(), map->size(), map->size());
}

GgufFile GgufFile::open(const std::string& path) {
  GgufFile f;
  f.map_ = MappedFile::open(path);
  f.header_ = parse_gguf_header(path, f.map_->data(), f.map_->size(), f.map_->size());
  return f;
}

void GgufFile::release(const TensorInfo& info) const {
  map_->release(header_.data_start + info.begin, info.end - info.begin);
}

void GgufFile::release_all() const {
  map_->release(0, map_->size());
}

Tensor GgufFile::view(const TensorInfo& info) const {
  FLOWKV_CHECK(info.dtype_known && info.begin >= 0 && info.end >= info.begin &&
                   header_.data_start + info.end <= map_->size(),
               header_.path, ": tensor \"", info.name, "\" is not a tensor of this file");
  const std::byte* p = map_->data() + header_.data_start + info.begin;
  return Tensor::wrap(const_cast<std::byte*>(p), info.shape, info.dtype,
                      std::shared_ptr<void>(map_, nullptr));
}

Tensor GgufFile::view(std::string_view name) const {
  for (const TensorInfo& t : header_.tensors) {
    if (t.name == name) return view(t);
  }
  fail(header_.path, ": no tensor \"", name, "\"");
}

// ---- writer ----

namespace {

class Out {
 public:
  template <class T>
  void put(T v) {
    const auto* p = reinterpret_cast<const char*>(&v);
    buf_.append(p, sizeof(T));
  }
  void str(const std::string& s) {
    put<uint64_t>(s.size());
    buf_ += s;
  }
  std::string& buf() { return buf_; }

 private:
  std::string buf_;
};

void put_scalar(Out& o, GgufType t, int64_t i, uint64_t u, double f, const std::string& s) {
  switch (t) {
    case GgufType::kU8:
      return o.put<uint8_t>(static_cast<uint8_t>(u));
    case GgufType::kI8:
      return o.put<int8_t>(static_cast<int8_t>(i));
    case GgufType::kU16:
      return o.put<uint16_t>(static_cast<uint16_t>(u));
    case GgufType::kI16:
      return o.put<int16_t>(static_cast<int16_t>(i));
    case GgufType::kU32:
      return o.put<uint32_t>(static_cast<uint32_t>(u));
    case GgufType::kI32:
      return o.put<int32_t>(static_cast<int32_t>(i));
    case GgufType::kF32:
      return o.put<float>(static_cast<float>(f));
    case GgufType::kBool:
      return o.put<uint8_t>(i ? 1 : 0);
    case GgufType::kString:
      return o.str(s);
    case GgufType::kU64:
      return o.put<uint64_t>(u);
    case GgufType::kI64:
      return o.put<int64_t>(i);
    case GgufType::kF64:
      return o.put<double>(f);
    case GgufType::kArray:
      break;
  }
  fail("write_gguf: nested arrays are not supported");
}

void put_value(Out& o, const std::string& key, const GgufValue& v) {
  o.put<uint32_t>(static_cast<uint32_t>(v.type));
  if (v.type != GgufType::kArray) return put_scalar(o, v.type, v.i, v.u, v.f, v.s);
  FLOWKV_CHECK(v.array_type != GgufType::kArray, "write_gguf: metadata \"", key,
               "\" is an array of arrays");
  o.put<uint32_t>(static_cast<uint32_t>(v.array_type));
  const int64_t n = v.array_size();
  o.put<uint64_t>(static_cast<uint64_t>(n));
  for (int64_t k = 0; k < n; ++k) {
    const auto z = static_cast<size_t>(k);
    put_scalar(o, v.array_type, z < v.ai.size() ? v.ai[z] : 0, z < v.au.size() ? v.au[z] : 0,
               z < v.af.size() ? v.af[z] : 0, z < v.as.size() ? v.as[z] : std::string());
  }
}

}  // namespace

void write_gguf(const std::string& path, const GgufMetadata& metadata,
                const std::vector<TensorToWrite>& tensors) {
  int64_t alignment = kDefaultAlignment;
  // Tensors of more than 4 dimensions: stored with their leading sizes folded into one, the
  // shape kept in metadata for the reader (parse_gguf_header restores it).
  GgufMetadata meta = metadata;
  std::vector<Shape> stored;
  for (const TensorToWrite& t : tensors) {
    stored.push_back(t.shape);
    if (t.shape.size() <= static_cast<size_t>(kMaxDims)) continue;
    FLOWKV_CHECK(t.shape.size() <= static_cast<size_t>(kMaxShapeDims), "write_gguf ", path,
                 ": tensor \"", t.name, "\" has ", t.shape.size(), " dimensions (1 to ",
                 kMaxShapeDims, ")");
    const auto last = t.shape.end() - 3;
    const int64_t lead = checked_numel(Shape(t.shape.begin(), last), "write_gguf: " + t.name);
    stored.back() = {lead, last[0], last[1], last[2]};
    GgufValue v;
    v.type = GgufType::kArray;
    v.array_type = GgufType::kI64;
    v.ai.assign(t.shape.begin(), t.shape.end());
    meta.emplace_back(kGgufShapeKey + t.name, std::move(v));
  }
  std::set<std::string> keys;
  for (const auto& [k, v] : meta) {
    FLOWKV_CHECK(keys.insert(k).second, "write_gguf ", path, ": metadata key \"", k,
                 "\" given twice");
    const int64_t n = v.array_size();
    const size_t used = (v.ai.empty() ? 0 : 1) + (v.au.empty() ? 0 : 1) + (v.af.empty() ? 0 : 1) +
                        (v.as.empty() ? 0 : 1);
    FLOWKV_CHECK(v.type != GgufType::kArray || used <= 1, "write_gguf ", path, ": metadata \"", k,
                 "\" fills more than one array (", n, " items)");
    if (k == "general.alignment") {
      FLOWKV_CHECK(
          v.type == GgufType::kU32 && v.u > 0 && v.u <= kMaxAlignment && (v.u & (v.u - 1)) == 0,
          "write_gguf ", path, ": general.alignment must be a power-of-two UINT32");
      alignment = static_cast<int64_t>(v.u);
    }
  }
  Out o;
  o.put<uint32_t>(kMagic);
  o.put<uint32_t>(3);
  o.put<uint64_t>(tensors.size());
  o.put<uint64_t>(meta.size());
  for (const auto& [k, v] : meta) {
    o.str(k);
    put_value(o, k, v);
  }
  std::set<std::string> names;
  std::vector<int64_t> sizes;
  int64_t offset = 0;
  for (size_t k = 0; k < tensors.size(); ++k) {
    const TensorToWrite& t = tensors[k];
    const Shape& shape = stored[k];
    FLOWKV_CHECK(names.insert(t.name).second, "write_gguf ", path, ": tensor \"", t.name,
                 "\" given twice");
    FLOWKV_CHECK(!shape.empty() && shape.size() <= kMaxDims, "write_gguf ", path, ": tensor \"",
                 t.name, "\" has ", shape.size(), " dimensions (1 to ", kMaxDims, ")");
    const int64_t numel = checked_numel(shape, "write_gguf: tensor " + t.name);
    FLOWKV_CHECK(shape.back() % dtype_block(t.dtype) == 0, "write_gguf ", path, ": tensor \"",
                 t.name, "\" rows of ", shape.back(), " are not whole ", dtype_name(t.dtype),
                 " blocks");
    const int64_t bytes = checked_mul(numel / dtype_block(t.dtype), dtype_block_bytes(t.dtype),
                                      "write_gguf: tensor " + t.name);
    o.str(t.name);
    o.put<uint32_t>(static_cast<uint32_t>(shape.size()));
    for (size_t d = shape.size(); d-- > 0;) o.put<uint64_t>(static_cast<uint64_t>(shape[d]));
    o.put<uint32_t>(ggml_type_of(t.dtype));
    o.put<uint64_t>(static_cast<uint64_t>(offset));
    sizes.push_back(bytes);
    offset = align_up(checked_add(offset, bytes, "write_gguf"), alignment, "write_gguf");
  }
  std::string& head = o.buf();
  head.append(
      static_cast<size_t>((alignment - static_cast<int64_t>(head.size()) % alignment) % alignment),
      '\0');
  AtomicFile f(path);
  f.write(head);
  const std::string pad(static_cast<size_t>(alignment), '\0');
  for (size_t k = 0; k < tensors.size(); ++k) {
    if (tensors[k].data) {
      f.write(tensors[k].data, static_cast<size_t>(sizes[k]));
    } else {
      f.skip(sizes[k]);
    }
    const int64_t p = (alignment - sizes[k] % alignment) % alignment;
    f.write(pad.data(), static_cast<size_t>(p));
  }
  f.commit();
}

}  // namespace flowkv
