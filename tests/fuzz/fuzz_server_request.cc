// libFuzzer target: the server's request parsing (tools/server/request.h). The input is read
// three ways: as a JSON body of /v1/images/generations and of an edit (through the server's
// bounded parse_body), as the value of a "size" field, and, split at newlines into name=value
// pairs, as a multipart form's text fields. An ApiError (400), whose error body renders, is
// the expected answer to a hostile input; any other exception is a bug.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <string>

#include "fuzz_common.h"
#include "request.h"

namespace {

// A hostile input must end in a 400 whose error body renders (the server answers it): the
// message may echo the client's bytes, which need not be UTF-8.
void only_api_errors(const std::function<void()>& f) {
  try {
    f();
  } catch (const flowkv::server::ApiError& e) {
    FUZZ_ASSERT(e.status == 400, "status %d for a bad request", e.status);
    const std::string body =
        flowkv::server::dump(flowkv::server::error_body(e.what(), e.type, e.param, e.code));
    FUZZ_ASSERT(!body.empty() && body.front() == '{', "error body %s", body.c_str());
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using flowkv::server::RequestLimits;
  const std::string text(reinterpret_cast<const char*>(data), size);
  RequestLimits limits;
  only_api_errors([&] {
    // As the server reads a body: bounded in depth and values (ApiError 400 beyond).
    const nlohmann::json body = flowkv::server::parse_body(text);
    for (bool edit : {false, true}) {
      only_api_errors([&] {
        const flowkv::server::ImageRequest r = flowkv::server::parse_request(body, edit, limits);
        FUZZ_ASSERT(r.n >= 1 && r.n <= limits.max_n, "n %d", r.n);
        FUZZ_ASSERT(r.generate.width * r.generate.height <= limits.max_image_pixels, "size");
      });
    }
  });
  only_api_errors([&] {
    const auto [w, h] = flowkv::server::parse_size(text, limits.max_image_pixels);
    FUZZ_ASSERT(w >= 0 && h >= 0 && w * h <= limits.max_image_pixels, "size %ldx%ld", w, h);
  });
  only_api_errors([&] {
    std::multimap<std::string, std::string> fields;
    size_t start = 0;
    while (start < text.size()) {
      size_t end = text.find('\n', start);
      if (end == std::string::npos) end = text.size();
      const std::string line = text.substr(start, end - start);
      const size_t eq = line.find('=');
      std::string name = line.substr(0, eq),
                  value = eq == std::string::npos ? "" : line.substr(eq + 1);
      // The server refuses a text field that is not UTF-8 before it reaches the form's JSON.
      if (!flowkv::server::valid_utf8(name) || !flowkv::server::valid_utf8(value)) return;
      fields.emplace(std::move(name), std::move(value));
      start = end + 1;
    }
    flowkv::server::parse_request(flowkv::server::form_fields_to_json(fields), true, limits);
  });
  return 0;
}
