// OpenAI images request bodies -> flowkv::GenerateRequest (request.h).
#include "request.h"

#include <charconv>
#include <cmath>
#include <set>

#include "flowkv/limits.h"

namespace flowkv::server {

namespace {

using nlohmann::json;

[[noreturn]] void bad(const std::string& param, const std::string& message) {
  throw ApiError(400, message, param, "invalid_value");
}

const std::string& need_string(const json& v, const std::string& name) {
  if (!v.is_string()) bad(name, "'" + name + "' must be a string");
  return v.get_ref<const std::string&>();
}

bool need_bool(const json& v, const std::string& name) {
  if (!v.is_boolean()) bad(name, "'" + name + "' must be true or false");
  return v.get<bool>();
}

int64_t need_int(const json& v, const std::string& name, int64_t lo, int64_t hi) {
  int64_t x = 0;
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(hi)) {
      bad(name, "'" + name + "' must be an integer from " + std::to_string(lo) + " to " +
                    std::to_string(hi));
    }
    x = static_cast<int64_t>(u);
  } else if (v.is_number_integer()) {
    x = v.get<int64_t>();
  } else {
    bad(name, "'" + name + "' must be an integer");
  }
  if (x < lo || x > hi) {
    bad(name, "'" + name + "' must be an integer from " + std::to_string(lo) + " to " +
                  std::to_string(hi) + ", not " + std::to_string(x));
  }
  return x;
}

// Fields flowkv has no use for, accepted only at OpenAI's "let the server choose" value.
bool is_auto(const json& v) {
  return v.is_null() || (v.is_string() && v.get<std::string>() == "auto");
}

}  // namespace

json error_body(const std::string& message, const std::string& type, const std::string& param,
                const std::string& code) {
  json e = {{"message", message}, {"type", type}};
  e["param"] = param.empty() ? json(nullptr) : json(param);
  e["code"] = code.empty() ? json(nullptr) : json(code);
  return json{{"error", e}};
}

bool parse_u64(const std::string& text, uint64_t& out) {
  if (text.empty() || text.size() > 20) return false;
  const char* end = text.data() + text.size();
  auto [p, ec] = std::from_chars(text.data(), end, out);
  return ec == std::errc() && p == end && text[0] != '+' && text[0] != '-';
}

bool parse_i64(const std::string& text, int64_t& out) {
  if (text.empty() || text.size() > 20) return false;
  const char* end = text.data() + text.size();
  auto [p, ec] = std::from_chars(text.data(), end, out);
  return ec == std::errc() && p == end;
}

std::pair<int64_t, int64_t> parse_size(const std::string& text, int64_t max_pixels) {
  if (text == "auto") return {0, 0};
  const std::string form = "'size' must be \"auto\" or \"WIDTHxHEIGHT\" in pixels, e.g. 1024x1024";
  const size_t x = text.find('x');
  if (x == std::string::npos) bad("size", form + ", not \"" + text.substr(0, 64) + "\"");
  uint64_t w = 0, h = 0;
  if (!parse_u64(text.substr(0, x), w) || !parse_u64(text.substr(x + 1), h)) {
    bad("size", form + ", not \"" + text.substr(0, 64) + "\"");
  }
  const uint64_t side = static_cast<uint64_t>(limits::kMaxImageSide);
  if (w == 0 || h == 0 || w > side || h > side) {
    bad("size", "'size' " + text + ": each side must be from 1 to " + std::to_string(side));
  }
  if (static_cast<int64_t>(w * h) > max_pixels) {
    bad("size", "'size' " + text + " is " + std::to_string(w * h) +
                    " pixels, over this server's limit of " + std::to_string(max_pixels) +
                    " (--max-image-pixels)");
  }
  return {static_cast<int64_t>(w), static_cast<int64_t>(h)};
}

json parse_body(const std::string& text) {
  struct Over {
    std::string what;
  };
  int64_t values = 0;
  try {
    json body = json::parse(
        text,
        [&values](int depth, json::parse_event_t event, json&) {
          if (depth >= kMaxJsonDepth)
            throw Over{"nested deeper than " + std::to_string(kMaxJsonDepth)};
          if (event == json::parse_event_t::value || event == json::parse_event_t::object_start ||
              event == json::parse_event_t::array_start) {
            if (++values > kMaxJsonValues)
              throw Over{"more than " + std::to_string(kMaxJsonValues) + " values"};
          }
          return true;
        },
        false);
    if (body.is_discarded())
      throw ApiError(400, "the request body is not valid JSON", "", "invalid_json");
    return body;
  } catch (const Over& o) {
    throw ApiError(400,
                   "the request body's JSON is " + o.what + "; an images request is a flat object",
                   "", "invalid_json");
  }
}

bool valid_utf8(const std::string& s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    int n = 0;
    uint32_t cp = 0;
    if (c < 0x80) {
      ++i;
      continue;
    } else if ((c & 0xE0) == 0xC0) {
      n = 1;
      cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      n = 2;
      cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      n = 3;
      cp = c & 0x07;
    } else {
      return false;
    }
    if (i + static_cast<size_t>(n) >= s.size()) return false;
    for (int k = 1; k <= n; ++k) {
      const auto d = static_cast<unsigned char>(s[i + static_cast<size_t>(k)]);
      if ((d & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (d & 0x3F);
    }
    static constexpr uint32_t kMin[] = {0, 0x80, 0x800, 0x10000};
    if (cp < kMin[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += static_cast<size_t>(n) + 1;
  }
  return true;
}

ImageRequest parse_request(const json& body, bool edit, const RequestLimits& limits) {
  if (!body.is_object()) bad("", "the request body must be a JSON object");
  ImageRequest r;
  GenerateRequest& g = r.generate;
  bool has_prompt = false;
  for (const auto& [key, v] : body.items()) {
    if (key == "prompt") {
      g.prompt = need_string(v, key);
      if (static_cast<int64_t>(g.prompt.size()) > limits.max_prompt_bytes) {
        bad(key, "'prompt' is " + std::to_string(g.prompt.size()) + " bytes, over the limit of " +
                     std::to_string(limits.max_prompt_bytes));
      }
      has_prompt = true;
    } else if (key == "model") {
      if (!v.is_null()) r.model = need_string(v, key);
    } else if (key == "user" || key == "safety_identifier") {
      if (!v.is_null()) r.user = need_string(v, key).substr(0, 256);
    } else if (key == "n") {
      if (!v.is_null()) r.n = static_cast<int>(need_int(v, key, 1, limits.max_n));
    } else if (key == "size") {
      if (!v.is_null()) {
        r.size = need_string(v, key);
        std::tie(g.width, g.height) = parse_size(r.size, limits.max_image_pixels);
      }
    } else if (key == "response_format") {
      if (!v.is_null() && need_string(v, key) != "b64_json") {
        throw ApiError(400,
                       "'response_format' " + v.get<std::string>() +
                           " is not supported: this server keeps no files to link to, so images "
                           "come back inline; use \"b64_json\"",
                       key, "unsupported_value");
      }
    } else if (key == "output_format") {
      if (!v.is_null() && need_string(v, key) != "png") {
        throw ApiError(400,
                       "'output_format' " + v.get<std::string>() +
                           " is not supported: flowkv writes PNG (lossless, with an alpha "
                           "channel where the model decodes one); use \"png\"",
                       key, "unsupported_value");
      }
    } else if (key == "output_compression") {
      if (!v.is_null() && !(v.is_number() && v.get<double>() == 100.0)) {
        throw ApiError(400, "'output_compression' applies to jpeg and webp only; PNG is lossless",
                       key, "unsupported_value");
      }
    } else if (key == "quality" || key == "background" || key == "style" || key == "moderation" ||
               key == "input_fidelity") {
      if (!is_auto(v)) {
        std::string hint = key == "quality" ? " (flowkv's 'steps' sets the effort)" : "";
        throw ApiError(400,
                       "'" + key + "' is not supported by flowkv; leave it out or \"auto\"" + hint,
                       key, "unsupported_value");
      }
    } else if (key == "mask" && edit) {
      throw ApiError(400, "'mask' is not supported: flowkv's models edit the whole picture", key,
                     "unsupported_value");
    } else if (key == "stream") {
      if (!v.is_null()) r.stream = need_bool(v, key);
    } else if (key == "partial_images") {
      if (!v.is_null()) r.partial_images = static_cast<int>(need_int(v, key, 0, 3));
    } else if (key == "flowkv_progress") {
      r.progress_events = need_bool(v, key);
    } else if (key == "steps") {
      g.steps = static_cast<int>(need_int(v, key, 1, limits.max_steps));
    } else if (key == "seed") {
      if (v.is_number_unsigned()) {
        g.seed = v.get<uint64_t>();
      } else if (v.is_number_integer() && v.get<int64_t>() >= 0) {
        g.seed = static_cast<uint64_t>(v.get<int64_t>());
      } else {
        bad(key, "'seed' must be an integer from 0 to 18446744073709551615");
      }
    } else if (key == "negative_prompt") {
      g.negative_prompt = need_string(v, key);
      if (static_cast<int64_t>(g.negative_prompt.size()) > limits.max_prompt_bytes) {
        bad(key, "'negative_prompt' is over the limit of " +
                     std::to_string(limits.max_prompt_bytes) + " bytes");
      }
      g.has_negative_prompt = true;
    } else if (key == "cfg_scale") {
      if (!v.is_number()) bad(key, "'cfg_scale' must be a number");
      const double s = v.get<double>();
      if (!std::isfinite(s) || s < 0 || s > 100) bad(key, "'cfg_scale' must be from 0 to 100");
      g.cfg_scale = static_cast<float>(s);
    } else if (key == "resolution") {
      g.resolution = need_int(v, key, 32, 4096);
    } else if (key == "kv_cache") {
      g.kv_cache = need_bool(v, key);
    } else if (key == "vae_tiling") {
      g.vae_tiling = need_bool(v, key);
    } else if (key == "dtype") {
      static const std::set<std::string> kTypes = {"auto", "f32", "bf16", "int8"};
      if (!kTypes.count(need_string(v, key))) bad(key, "'dtype' must be auto, f32, bf16 or int8");
      g.dtype = v.get<std::string>();
    } else if (key == "step_caches") {
      if (!v.is_array() || v.size() > 8) {
        bad(key,
            "'step_caches' must be an array of at most 8 strings, e.g. "
            "[\"taylorseer:interval=2\"]");
      }
      for (const json& c : v) {
        const std::string& s = need_string(c, key);
        if (s.empty() || s.size() > 256) bad(key, "'step_caches': each entry 1 to 256 characters");
        g.step_caches.push_back(s);
      }
    } else {
      throw ApiError(400, "Unrecognized request argument supplied: " + key.substr(0, 64), key,
                     "unknown_parameter");
    }
  }
  if (!has_prompt) throw ApiError(400, "'prompt' is required", "prompt", "missing_required");
  if (r.partial_images > 0 && !r.stream) {
    bad("partial_images", "'partial_images' needs \"stream\": true");
  }
  return r;
}

json form_fields_to_json(const std::multimap<std::string, std::string>& fields) {
  static const std::set<std::string> kInts = {"n", "partial_images", "steps", "resolution",
                                              "output_compression"};
  static const std::set<std::string> kBools = {"stream", "kv_cache", "vae_tiling",
                                               "flowkv_progress"};
  json out = json::object();
  for (const auto& [raw, value] : fields) {
    std::string name = raw;
    if (name.size() > 2 && name.compare(name.size() - 2, 2, "[]") == 0) {
      name.resize(name.size() - 2);
    }
    if (name == "step_caches") {
      if (!out.contains(name)) out[name] = json::array();
      out[name].push_back(value);
      continue;
    }
    if (out.contains(name)) bad(name, "'" + name + "' is given more than once");
    if (kInts.count(name)) {
      int64_t x = 0;
      if (!parse_i64(value, x)) bad(name, "'" + name + "' must be an integer");
      out[name] = x;
    } else if (name == "seed") {
      uint64_t x = 0;
      if (!parse_u64(value, x)) bad(name, "'seed' must be an integer from 0 to 2^64-1");
      out[name] = x;
    } else if (name == "cfg_scale") {
      double x = 0;
      const char* end = value.data() + value.size();
      auto [p, ec] = std::from_chars(value.data(), end, x);
      if (value.empty() || ec != std::errc() || p != end) bad(name, "'cfg_scale' must be a number");
      out[name] = x;
    } else if (kBools.count(name)) {
      if (value != "true" && value != "false") bad(name, "'" + name + "' must be true or false");
      out[name] = value == "true";
    } else {
      out[name] = value;
    }
  }
  return out;
}

}  // namespace flowkv::server
