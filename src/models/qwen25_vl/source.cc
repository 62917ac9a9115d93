// Qwen2.5-VL text encoder sources (source.h): the llama.cpp name table, the config from llama.cpp
// metadata (gguf-py constants.py / convert_hf_to_gguf.py TextModel.set_gguf_parameters, read for
// the key names) and the resolution of a path to a scan.
#include "models/qwen25_vl/source.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <vector>

#include "core/boundary.h"
#include "flowkv/error.h"
#include "flowkv/limits.h"
#include "io/mapped_file.h"
#include "models/qwen25_vl/weights.h"

namespace flowkv::qwen25_vl {

namespace fs = std::filesystem;

namespace {

// llama.cpp's names (gguf-py tensor_mapping.py for MODEL_ARCH.QWEN2VL) and transformers'.
struct NameRow {
  const char* llama_cpp;
  const char* transformers;
};
// Outside the layers: "model." + transformers.
constexpr NameRow kGlobalNames[] = {
    {"token_embd.weight", "embed_tokens.weight"},
    {"output_norm.weight", "norm.weight"},
};
// Per layer N: "blk.N." + llama_cpp, "model.layers.N." + transformers.
constexpr NameRow kLayerNames[] = {
    {"attn_norm.weight", "input_layernorm.weight"},
    {"attn_q.weight", "self_attn.q_proj.weight"},
    {"attn_q.bias", "self_attn.q_proj.bias"},
    {"attn_k.weight", "self_attn.k_proj.weight"},
    {"attn_k.bias", "self_attn.k_proj.bias"},
    {"attn_v.weight", "self_attn.v_proj.weight"},
    {"attn_v.bias", "self_attn.v_proj.bias"},
    {"attn_output.weight", "self_attn.o_proj.weight"},
    {"ffn_norm.weight", "post_attention_layernorm.weight"},
    {"ffn_gate.weight", "mlp.gate_proj.weight"},
    {"ffn_up.weight", "mlp.up_proj.weight"},
    {"ffn_down.weight", "mlp.down_proj.weight"},
};
// In the file, not read: the LM head (the prompt encoder takes hidden states).
constexpr const char* kIgnored[] = {"output.weight"};

constexpr const char* kEmbed = "token_embd.weight";

// Qwen2.5-VL's special tokens, by their text in tokenizer.ggml.tokens.
constexpr std::pair<const char*, const char*> kTokenIds[] = {
    {"image_token_id", "<|image_pad|>"},
    {"video_token_id", "<|video_pad|>"},
    {"vision_start_token_id", "<|vision_start|>"},
    {"vision_end_token_id", "<|vision_end|>"},
};

std::string key_of(const char* k) {
  return std::string(kLlamaCppArch) + "." + k;
}

const GgufValue& required(const GgufHeader& h, const std::string& key) {
  const GgufValue* v = h.find(key);
  FLOWKV_CHECK(v, h.path, ": metadata ", key,
               " is missing (a llama.cpp Qwen2.5-VL GGUF carries it)");
  return *v;
}

bool is_int_type(GgufType t) {
  switch (t) {
    case GgufType::kU8:
    case GgufType::kI8:
    case GgufType::kU16:
    case GgufType::kI16:
    case GgufType::kU32:
    case GgufType::kI32:
    case GgufType::kU64:
    case GgufType::kI64:
      return true;
    default:
      return false;
  }
}
bool is_unsigned(GgufType t) {
  return t == GgufType::kU8 || t == GgufType::kU16 || t == GgufType::kU32 || t == GgufType::kU64;
}

// An integer scalar in [lo, hi].
int64_t int_value(const GgufHeader& h, const std::string& key, const GgufValue& v, int64_t lo,
                  int64_t hi) {
  FLOWKV_CHECK(is_int_type(v.type), h.path, ": metadata ", key, " is ", gguf_type_name(v.type),
               ", expected an integer");
  const bool big = is_unsigned(v.type) && v.u > static_cast<uint64_t>(hi);
  const int64_t x = is_unsigned(v.type) ? static_cast<int64_t>(std::min<uint64_t>(v.u, hi)) : v.i;
  FLOWKV_CHECK(!big && x >= lo && x <= hi, h.path, ": metadata ", key, " is ", v.summary(),
               ", outside [", lo, ", ", hi, "]");
  return x;
}

double float_value(const GgufHeader& h, const std::string& key) {
  const GgufValue& v = required(h, key);
  FLOWKV_CHECK(v.type == GgufType::kF32 || v.type == GgufType::kF64, h.path, ": metadata ", key,
               " is ", gguf_type_name(v.type), ", expected a float");
  FLOWKV_CHECK(std::isfinite(v.f) && v.f > 0, h.path, ": metadata ", key, " is ", v.f,
               ", expected a positive number");
  if (v.type == GgufType::kF64) return v.f;
  // A FLOAT32 value as the shortest decimal that rounds to it (1e-06, not 9.99999997e-07): the
  // number transformers' config held before the converter narrowed it.
  char buf[32];
  const auto [end, ec] = std::to_chars(buf, buf + sizeof buf, static_cast<float>(v.f));
  FLOWKV_CHECK(ec == std::errc(), h.path, ": metadata ", key, " cannot be printed");
  return std::strtod(std::string(buf, end).c_str(), nullptr);
}

const TensorInfo* find_info(const GgufHeader& h, std::string_view name) {
  for (const TensorInfo& t : h.tensors) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

// The text fields both configs hold must agree (a config.json beside a llama.cpp GGUF).
void check_agree(const Config& json, const Config& meta, const std::string& json_path,
                 const std::string& gguf_path) {
  const qwen3::Config &a = json.text, &b = meta.text;
  std::vector<std::string> lines;
  auto cmp = [&](const char* name, double x, double y) {
    if (std::abs(x - y) > 1e-6 * std::max(std::abs(x), std::abs(y))) {
      lines.push_back(std::string(name) + ": " + std::to_string(x) + " in config.json, " +
                      std::to_string(y) + " in the GGUF");
    }
  };
  cmp("hidden_size", a.hidden_size, b.hidden_size);
  cmp("intermediate_size", a.intermediate_size, b.intermediate_size);
  cmp("num_hidden_layers", a.num_hidden_layers, b.num_hidden_layers);
  cmp("num_attention_heads", a.num_attention_heads, b.num_attention_heads);
  cmp("num_key_value_heads", a.num_key_value_heads, b.num_key_value_heads);
  cmp("vocab_size", a.vocab_size, b.vocab_size);
  cmp("rms_norm_eps", a.rms_norm_eps, b.rms_norm_eps);
  cmp("rope_theta", a.rope_theta, b.rope_theta);
  for (int i = 0; i < 3; ++i) {
    cmp(("mrope_section[" + std::to_string(i) + "]").c_str(),
        static_cast<double>(json.mrope_section[i]), static_cast<double>(meta.mrope_section[i]));
  }
  if (!lines.empty()) {
    fail(format_problems(json_path + " does not describe the language model of " + gguf_path,
                         lines));
  }
}

bool has_safetensors(const fs::path& dir) {
  for (const char* f :
       {"model.safetensors", "model.safetensors.index.json", "diffusion_pytorch_model.safetensors",
        "diffusion_pytorch_model.safetensors.index.json"}) {
    if (path_exists((dir / f).string())) return true;
  }
  return false;
}

struct Resolved {
  std::string target;  // what scan_checkpoint reads
  std::string dir;     // the folder (empty for a file given directly)
  bool has_config = false;
};

// A pipeline folder -> text_encoder/; a folder with config.json and one GGUF but no safetensors
// -> that GGUF (config.json kept beside it).
Resolved resolve(const std::string& path) {
  fs::path p(path);
  if (path_kind(path) != PathKind::kFolder) return {path, "", false};
  if (!path_exists((p / "config.json").string()) &&
      path_kind((p / "text_encoder").string()) == PathKind::kFolder) {
    p /= "text_encoder";
  }
  Resolved r{p.string(), p.string(), path_exists((p / "config.json").string())};
  if (!r.has_config || has_safetensors(p)) return r;
  std::vector<std::string> ggufs;
  std::error_code ec;
  for (fs::directory_iterator it(p, ec), end; !ec && it != end; it.increment(ec)) {
    if (it->path().extension() == ".gguf") ggufs.push_back(it->path().string());
  }
  std::sort(ggufs.begin(), ggufs.end());
  FLOWKV_CHECK(ggufs.size() <= 1, p.string(), ": no safetensors and ", ggufs.size(),
               " GGUF files; keep one, or name the file");
  if (ggufs.size() == 1) r.target = ggufs[0];
  return r;
}

}  // namespace

std::string to_llama_cpp_name(const std::string& name) {
  const std::string layers = "model.layers.";
  if (name.starts_with(layers)) {
    const size_t dot = name.find('.', layers.size());
    if (dot == std::string::npos) return "";
    const std::string index = name.substr(layers.size(), dot - layers.size());
    const std::string rest = name.substr(dot + 1);
    for (const NameRow& r : kLayerNames) {
      if (rest == r.transformers) return "blk." + index + "." + r.llama_cpp;
    }
    return "";
  }
  for (const NameRow& r : kGlobalNames) {
    if (name == std::string("model.") + r.transformers) return r.llama_cpp;
  }
  return "";
}

bool is_llama_cpp_gguf(const GgufHeader& h) {
  const GgufValue* arch = h.find("general.architecture");
  if (arch && arch->type == GgufType::kString && arch->s == kLlamaCppArch) return true;
  return find_info(h, kEmbed) != nullptr;
}

Config config_from_llama_cpp(const GgufHeader& h, const Json* beside) {
  const std::string src = h.path;
  const GgufValue* arch = h.find("general.architecture");
  FLOWKV_CHECK(arch && arch->type == GgufType::kString, src,
               ": no general.architecture string; a llama.cpp Qwen2.5-VL text GGUF names \"",
               kLlamaCppArch, "\"");
  FLOWKV_CHECK(arch->s == kLlamaCppArch, src, ": general.architecture is \"", arch->s,
               "\", expected \"", kLlamaCppArch,
               "\" (llama.cpp's Qwen2-VL / Qwen2.5-VL language model)");
  auto int_key = [&](const char* k, int64_t hi) {
    const std::string key = key_of(k);
    return int_value(h, key, required(h, key), 1, hi);
  };
  Json t = Json::object();
  t["hidden_size"] = int_key("embedding_length", limits::kMaxWidth);
  t["num_hidden_layers"] = int_key("block_count", limits::kMaxBlocks);
  t["intermediate_size"] = int_key("feed_forward_length", limits::kMaxWidth);
  t["num_attention_heads"] = int_key("attention.head_count", limits::kMaxWidth);
  t["num_key_value_heads"] = int_key("attention.head_count_kv", limits::kMaxWidth);
  if (h.find(key_of("attention.key_length"))) {
    t["head_dim"] = int_key("attention.key_length", limits::kMaxWidth);
  }
  if (h.find(key_of("context_length"))) {
    t["max_position_embeddings"] = int_key("context_length", limits::kMaxTokens * 64);
  }
  t["rms_norm_eps"] = float_value(h, key_of("attention.layer_norm_rms_epsilon"));
  const double theta = float_value(h, key_of("rope.freq_base"));
  t["rope_theta"] = theta;
  const std::string sk = key_of("rope.dimension_sections");
  const GgufValue& s = required(h, sk);
  const int64_t n = s.array_size();
  FLOWKV_CHECK(s.type == GgufType::kArray && is_int_type(s.array_type) && (n == 3 || n == 4), src,
               ": metadata ", sk, " is ", s.summary(),
               ", expected 3 or 4 integers (the t, h, w rotary sections and a zero)");
  Json sections = Json::array();
  for (int64_t k = 0; k < n; ++k) {
    const auto z = static_cast<size_t>(k);
    GgufValue e;
    e.type = s.array_type;
    if (is_unsigned(s.array_type)) {
      e.u = s.au[z];
    } else {
      e.i = s.ai[z];
    }
    const int64_t x = int_value(h, sk + "[" + std::to_string(k) + "]", e, 0, limits::kMaxWidth);
    if (k < 3) sections.push_back(x);
    FLOWKV_CHECK(k < 3 || x == 0, src, ": metadata ", sk, " has a fourth section of ", x,
                 "; Qwen2.5-VL's rotary embedding has three (t, h, w)");
  }
  t["rope_parameters"] = {
      {"rope_type", "default"}, {"rope_theta", theta}, {"mrope_section", sections}};
  const TensorInfo* embed = find_info(h, kEmbed);
  FLOWKV_CHECK(embed, src, ": no tensor ", kEmbed, " (the token embeddings)");
  FLOWKV_CHECK(embed->shape.size() == 2, src, ": tensor ", kEmbed, " has shape ",
               shape_str(embed->shape), ", expected [vocab, embedding_length]");
  FLOWKV_CHECK(embed->shape[0] <= limits::kMaxVocab, src, ": tensor ", kEmbed, " has ",
               embed->shape[0], " rows, beyond the vocabulary limit of ", limits::kMaxVocab);
  t["vocab_size"] = embed->shape[0];
  t["model_type"] = "qwen2_5_vl_text";
  Json j = {{"model_type", "qwen2_5_vl"}, {"text_config", t}};
  j["tie_word_embeddings"] = find_info(h, "output.weight") == nullptr;
  if (const GgufValue* tokens = h.find("tokenizer.ggml.tokens");
      tokens && tokens->type == GgufType::kArray && tokens->array_type == GgufType::kString) {
    for (const auto& [field, text] : kTokenIds) {
      const auto it = std::find(tokens->as.begin(), tokens->as.end(), text);
      if (it != tokens->as.end()) j[field] = it - tokens->as.begin();
    }
  }
  // A config.json beside the file knows the ids (and the vision config) better.
  if (beside && beside->is_object()) {
    for (const char* key : {"image_token_id", "video_token_id", "vision_start_token_id",
                            "vision_end_token_id", "vision_config"}) {
      if (beside->contains(key)) j[key] = (*beside)[key];
    }
  }
  return Config::from_json(j, src + " (llama.cpp GGUF metadata)");
}

std::map<std::string, TensorInfo> rename_llama_cpp_tensors(
    const std::map<std::string, TensorInfo>& tensors, const Config& cfg, const std::string& path) {
  const std::vector<ExpectedTensor> table = text_weight_table(cfg, Layout::kModel);
  std::vector<ExpectedTensor> named;
  named.reserve(table.size());
  for (const ExpectedTensor& e : table) {
    const std::string n = to_llama_cpp_name(e.name);
    FLOWKV_CHECK(!n.empty(), "qwen25_vl: no llama.cpp name for ", e.name);
    named.push_back({n, e.shape});
  }
  std::map<std::string, TensorInfo> present;
  for (const auto& [name, info] : tensors) {
    if (std::find(std::begin(kIgnored), std::end(kIgnored), name) == std::end(kIgnored)) {
      present.emplace(name, info);
    }
  }
  const std::vector<std::string> problems = check_against_table(present, named);
  if (!problems.empty()) {
    fail(format_problems(path + " does not hold the Qwen2.5-VL language model of its metadata "
                                "(llama.cpp names)",
                         problems));
  }
  std::map<std::string, TensorInfo> out;
  for (size_t k = 0; k < table.size(); ++k) out.emplace(table[k].name, present.at(named[k].name));
  return out;
}

static TextEncoderSource open_unguarded(const std::string& path) {
  const Resolved r = resolve(path);
  TextEncoderSource s;
  std::optional<Json> beside;
  const std::string beside_path = (fs::path(r.dir) / "config.json").string();
  if (r.has_config) beside = read_json_file(beside_path);
  s.scan = scan_checkpoint(r.target);
  if (s.scan.gguf && is_llama_cpp_gguf(*s.scan.gguf)) {
    const Config meta = config_from_llama_cpp(*s.scan.gguf, beside ? &*beside : nullptr);
    s.llama_cpp = true;
    s.cfg = meta;
    if (beside) {
      s.cfg = Config::from_json(*beside, beside_path);
      check_agree(s.cfg, meta, beside_path, s.scan.path);
      s.model_config = beside;
      s.config_path = beside_path;
    }
    s.scan.tensors = rename_llama_cpp_tensors(s.scan.tensors, s.cfg, s.scan.path);
    s.scan.config = s.model_config;
    return s;
  }
  if (s.scan.config) {
    s.model_config = s.scan.config;
    s.config_path = s.scan.gguf ? s.scan.path + ": metadata flowkv.config"
                                : (fs::path(s.scan.path) / "config.json").string();
  } else if (beside) {
    s.model_config = beside;
    s.config_path = beside_path;
  }
  FLOWKV_CHECK(s.model_config.has_value(), s.scan.path,
               ": a Qwen2.5-VL text encoder needs its config.json (transformers' "
               "Qwen2_5_VLConfig), or a GGUF that carries it (flowkv quantize) or llama.cpp's "
               "\"",
               kLlamaCppArch, "\" metadata");
  s.cfg = Config::from_json(*s.model_config, s.config_path);
  return s;
}

TextEncoderSource open_text_encoder(const std::string& path) {
  return at_input_boundary(path, [&] { return open_unguarded(path); });
}

Config text_encoder_config(const std::string& path) {
  const Resolved r = resolve(path);
  if (r.has_config) {
    const std::string config = (fs::path(r.dir) / "config.json").string();
    return Config::from_json(read_json_file(config), config);
  }
  return open_text_encoder(path).cfg;
}

}  // namespace flowkv::qwen25_vl
