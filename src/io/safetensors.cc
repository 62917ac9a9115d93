#include "io/safetensors.h"

#include <algorithm>

#include "core/boundary.h"
#include "core/checked.h"
#include "flowkv/error.h"
#include "flowkv/limits.h"
#include "io/atomic_file.h"
#include "io/json.h"

namespace flowkv {

namespace {

constexpr int64_t kMaxHeaderBytes = int64_t{100} << 20;  // the format's own limit

bool parse_dtype(const std::string& s, DType* out) {
  if (s == "F32")
    *out = DType::kF32;
  else if (s == "BF16")
    *out = DType::kBF16;
  else if (s == "F16")
    *out = DType::kF16;
  else
    return false;
  return true;
}

int64_t known_element_size(const std::string& s) {
  static const std::map<std::string, int64_t> sizes = {
      {"F64", 8}, {"F32", 4}, {"F16", 2},  {"BF16", 2},    {"I64", 8},
      {"I32", 4}, {"I16", 2}, {"I8", 1},   {"U8", 1},      {"U16", 2},
      {"U32", 4}, {"U64", 8}, {"BOOL", 1}, {"F8_E4M3", 1}, {"F8_E5M2", 1}};
  auto it = sizes.find(s);
  return it == sizes.end() ? 0 : it->second;
}

int64_t read_u64_le(const std::string& b) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(b[static_cast<size_t>(i)]);
  if (v > static_cast<uint64_t>(INT64_MAX)) return -1;
  return static_cast<int64_t>(v);
}

TensorInfo parse_entry(const std::string& path, const std::string& name, const Json& e) {
  TensorInfo t;
  t.name = name;
  t.file = path;
  const std::string where = path + ": tensor '" + name + "'";
  FLOWKV_CHECK(e.is_object(), where, ": header entry is not an object");
  FLOWKV_CHECK(e.contains("dtype") && e["dtype"].is_string(), where, ": missing dtype");
  FLOWKV_CHECK(e.contains("shape") && e["shape"].is_array(), where, ": missing shape");
  FLOWKV_CHECK(
      e.contains("data_offsets") && e["data_offsets"].is_array() && e["data_offsets"].size() == 2,
      where, ": missing data_offsets [begin, end]");
  t.dtype_name = e["dtype"].get<std::string>();
  t.dtype_known = parse_dtype(t.dtype_name, &t.dtype);
  const int64_t elem = known_element_size(t.dtype_name);
  FLOWKV_CHECK(elem > 0, where, ": unknown dtype '", t.dtype_name, "'");
  // Every size is a signed 64-bit value checked on the way in: offsets above 2^63 would turn
  // negative and point before the data section.
  for (const Json& d : e["shape"])
    t.shape.push_back(json_int_value(d, 0, INT64_MAX, where + ": every shape entry"));
  const int64_t bytes =
      checked_mul(checked_numel(t.shape, where + " shape"), elem, where + " bytes");
  t.begin = json_int_value(e["data_offsets"][0], 0, INT64_MAX, where + ": data_offsets[0]");
  t.end = json_int_value(e["data_offsets"][1], 0, INT64_MAX, where + ": data_offsets[1]");
  FLOWKV_CHECK(t.begin <= t.end, where, ": data_offsets begin ", t.begin, " is after end ", t.end);
  FLOWKV_CHECK(t.end - t.begin == bytes, where, ": data_offsets span ", t.end - t.begin,
               " bytes but shape ", shape_str(t.shape), " of ", t.dtype_name, " needs ", bytes);
  return t;
}

}  // namespace

static SafetensorsHeader parse_header_unguarded(const std::string& path, const std::string& prefix,
                                                int64_t file_size) {
  FLOWKV_CHECK(file_size >= 8, path, ": truncated: ", file_size,
               " bytes is too short for a safetensors file (8-byte header length missing)");
  FLOWKV_CHECK(prefix.size() >= 8, path, ": truncated header");
  const int64_t n = read_u64_le(prefix.substr(0, 8));
  FLOWKV_CHECK(n >= 0 && n <= kMaxHeaderBytes, path, ": header length ", n,
               " is not plausible (the format allows up to 100 MiB)");
  FLOWKV_CHECK(8 + n <= file_size, path, ": header length ", n, " runs past the end of the file (",
               file_size, " bytes): the file is truncated or not safetensors");
  FLOWKV_CHECK(static_cast<int64_t>(prefix.size()) >= 8 + n, path, ": truncated header");
  SafetensorsHeader h;
  h.path = path;
  h.file_size = file_size;
  h.data_start = 8 + n;
  const Json j = parse_json(prefix.substr(8, static_cast<size_t>(n)), path + " header");
  FLOWKV_CHECK(j.is_object(), path, ": header is not a JSON object");
  FLOWKV_CHECK(static_cast<int64_t>(j.size()) <= limits::kMaxTensors, path, ": header lists ",
               j.size(), " tensors, more than the limit of ", limits::kMaxTensors);
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (it.key() == "__metadata__") {
      FLOWKV_CHECK(it.value().is_object(), path, ": __metadata__ is not an object");
      for (auto m = it.value().begin(); m != it.value().end(); ++m) {
        FLOWKV_CHECK(m.value().is_string(), path, ": __metadata__ values must be strings");
        h.metadata[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    h.tensors.push_back(parse_entry(path, it.key(), it.value()));
  }
  std::sort(h.tensors.begin(), h.tensors.end(), [](const TensorInfo& a, const TensorInfo& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  const int64_t data_size = file_size - h.data_start;
  for (size_t i = 0; i < h.tensors.size(); ++i) {
    const TensorInfo& t = h.tensors[i];
    FLOWKV_CHECK(t.end <= data_size, path, ": tensor '", t.name, "' data [", t.begin, ", ", t.end,
                 ") lies past the end of the data section (", data_size,
                 " bytes): the file is truncated");
    if (i > 0 && t.begin < h.tensors[i - 1].end && t.end > t.begin) {
      fail(path, ": tensors '", h.tensors[i - 1].name, "' and '", t.name,
           "' overlap in the data section");
    }
  }
  return h;
}

SafetensorsHeader parse_safetensors_header(const std::string& path, const std::string& prefix,
                                           int64_t file_size) {
  return at_input_boundary(path, [&] { return parse_header_unguarded(path, prefix, file_size); });
}

SafetensorsHeader read_safetensors_header(const std::string& path) {
  const int64_t size = file_size(path);
  FLOWKV_CHECK(size >= 8, path, ": truncated: ", size,
               " bytes is too short for a safetensors file (8-byte header length missing)");
  const std::string first = read_file_prefix(path, 8);
  const int64_t n = read_u64_le(first);
  FLOWKV_CHECK(n >= 0 && n <= kMaxHeaderBytes, path, ": header length ", n,
               " is not plausible (the format allows up to 100 MiB)");
  FLOWKV_CHECK(8 + n <= size, path, ": header length ", n, " runs past the end of the file (", size,
               " bytes): the file is truncated or not safetensors");
  return parse_safetensors_header(path, read_file_prefix(path, 8 + n), size);
}

SafetensorsFile SafetensorsFile::open(const std::string& path) {
  SafetensorsFile f;
  f.map_ = MappedFile::open(path);
  const int64_t size = f.map_->size();
  FLOWKV_CHECK(size >= 8, path, ": truncated: ", size,
               " bytes is too short for a safetensors file (8-byte header length missing)");
  const std::string first(reinterpret_cast<const char*>(f.map_->data()), 8);
  const int64_t n = read_u64_le(first);
  FLOWKV_CHECK(n >= 0 && n <= kMaxHeaderBytes && 8 + n <= size, path, ": header length ", n,
               " runs past the end of the file (", size,
               " bytes): the file is truncated or not safetensors");
  f.header_ = parse_safetensors_header(
      path, std::string(reinterpret_cast<const char*>(f.map_->data()), static_cast<size_t>(8 + n)),
      size);
  return f;
}

void SafetensorsFile::release(const TensorInfo& info) const {
  map_->release(header_.data_start + info.begin, info.end - info.begin);
}

void SafetensorsFile::release_all() const {
  map_->release(0, map_->size());
}

Tensor SafetensorsFile::view(const TensorInfo& info) const {
  FLOWKV_CHECK(info.dtype_known, info.file, ": tensor '", info.name, "' has dtype ",
               info.dtype_name, "; flowkv reads F32, BF16 and F16");
  const std::byte* p = map_->data() + header_.data_start + info.begin;
  return Tensor::wrap(const_cast<std::byte*>(p), info.shape, info.dtype, map_);
}

void write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  Json header = Json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  int64_t offset = 0;
  for (const TensorToWrite& t : tensors) {
    const int64_t bytes = shape_numel(t.shape) * dtype_size(t.dtype);
    header[t.name] = {{"dtype", std::string(dtype_name(t.dtype))},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text = header.dump();
  text.append((8 - (text.size() % 8)) % 8, ' ');  // keep the data section 8-byte aligned
  // A temporary file in the same folder, every write checked, fsynced, renamed into place.
  AtomicFile f(path);
  uint8_t len[8];
  const uint64_t n = text.size();
  for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(n >> (8 * i));
  f.write(len, 8);
  f.write(text);
  for (const TensorToWrite& t : tensors) {
    const int64_t bytes = shape_numel(t.shape) * dtype_size(t.dtype);
    if (t.data) {
      f.write(t.data, static_cast<size_t>(bytes));
    } else {
      f.skip(bytes);  // a hole: the file stays sparse
    }
  }
  f.commit();
}

}  // namespace flowkv
