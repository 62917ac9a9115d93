// The OpenAI images API's request bodies (JSON for generations, multipart form fields for
// edits) turned into a flowkv::GenerateRequest, every field checked against the server's limits.
// Hostile input: nothing here trusts the body; every failure is an ApiError naming the field.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <utility>

#include "flowkv/generate.h"

namespace flowkv::server {

// An error answered in OpenAI's shape: {"error": {"message", "type", "param", "code"}}.
struct ApiError : std::runtime_error {
  ApiError(int status, const std::string& message, std::string param = {}, std::string code = {},
           std::string type = "invalid_request_error")
      : std::runtime_error(message),
        status(status),
        param(std::move(param)),
        code(std::move(code)),
        type(std::move(type)) {}
  int status;
  std::string param, code, type;
};

// The body of an error response.
nlohmann::json error_body(const std::string& message, const std::string& type,
                          const std::string& param, const std::string& code);

struct RequestLimits {
  // Defaults a 2-core CPU can honour within the default --timeout at real model sizes
  // (docs/serving.md); raise them for bigger machines.
  int64_t max_image_pixels = int64_t{1024} * 1024;   // the output size
  int64_t max_upload_pixels = int64_t{4096} * 4096;  // each uploaded image (resized by the model)
  int max_steps = 50;
  int max_references = 8;
  int max_n = 2;
  int64_t max_prompt_bytes = int64_t{64} << 10;
};

struct ImageRequest {
  std::string model;  // "" when not given
  std::string user;
  GenerateRequest generate;  // references are filled in by the server (uploaded files)
  int n = 1;
  bool stream = false;
  int partial_images = 0;
  bool progress_events = true;  // flowkv.progress events in a stream
  std::string size = "auto";    // as asked
};

// The JSON text of a response: bytes that are not UTF-8 (a client's, echoed in a message)
// become U+FFFD instead of an exception.
inline std::string dump(const nlohmann::json& j) {
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

// A request's JSON body, parsed with a bound: at most kMaxJsonDepth deep and kMaxJsonValues
// values, stopped at the first value over either (60 MB of '[' costs microseconds, not
// gigabytes). The images API's bodies are a flat object of a few fields. ApiError 400 otherwise.
constexpr int kMaxJsonDepth = 16;
constexpr int64_t kMaxJsonValues = 4096;
nlohmann::json parse_body(const std::string& text);

// Whether `s` is well-formed UTF-8 (no overlongs, surrogates or code points past U+10FFFF).
bool valid_utf8(const std::string& s);

// "auto" -> (0, 0); "WxH" (decimal, 1..65536 each, W*H <= max_pixels) -> (W, H).
std::pair<int64_t, int64_t> parse_size(const std::string& text, int64_t max_pixels);

// A JSON body (an object) of /v1/images/generations, or the fields of an edit after
// form_fields_to_json. Unknown fields are refused, as OpenAI refuses them.
ImageRequest parse_request(const nlohmann::json& body, bool edit, const RequestLimits& limits);

// A multipart form's text parts (name -> value; a name may repeat, "x[]" counts as "x") as the
// JSON object parse_request reads: integers, numbers and booleans converted by the field's type.
nlohmann::json form_fields_to_json(const std::multimap<std::string, std::string>& fields);

// Strict decimal parsers: the whole text, no sign on unsigned, no spaces, in range.
bool parse_u64(const std::string& text, uint64_t& out);
bool parse_i64(const std::string& text, int64_t& out);

}  // namespace flowkv::server
