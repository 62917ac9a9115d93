// The images routes of flowkv serve (state.h): a request's body -> a Job (fields checked,
// uploads checked from their headers and kept in memory, the request prepared once on the
// server's Pipeline), its run on that Pipeline, and the answer (JSON, or a stream: stream.cc).
// Nothing of a request touches the disk: uploads go to the pipeline as InputImage bytes, and
// pictures are encoded to PNG in memory.
#include <cstring>
#include <set>

#include "flowkv/error.h"
#include "flowkv/image.h"
#include "spng.h"
#include "state.h"
#include "turbojpeg.h"

namespace flowkv::server {

thread_local Served t_served;

double since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

std::string log_safe(const std::string& text) {
  std::string out;
  for (size_t i = 0; i < text.size() && out.size() < 256; ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c < 0x20 || c == 0x7f || c == '\\') {
      char b[8];
      std::snprintf(b, sizeof b, "\\x%02x", c);
      out += b;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out;
}

int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

namespace {

using nlohmann::json;

std::string base64(const std::string& in) {
  static const char* kAlphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  out.reserve((in.size() + 2) / 3 * 4);
  size_t i = 0;
  for (; i + 2 < in.size(); i += 3) {
    const uint32_t v = (uint32_t(uint8_t(in[i])) << 16) | (uint32_t(uint8_t(in[i + 1])) << 8) |
                       uint32_t(uint8_t(in[i + 2]));
    out += kAlphabet[(v >> 18) & 63];
    out += kAlphabet[(v >> 12) & 63];
    out += kAlphabet[(v >> 6) & 63];
    out += kAlphabet[v & 63];
  }
  if (i < in.size()) {
    uint32_t v = uint32_t(uint8_t(in[i])) << 16;
    if (i + 1 < in.size()) v |= uint32_t(uint8_t(in[i + 1])) << 8;
    out += kAlphabet[(v >> 18) & 63];
    out += kAlphabet[(v >> 12) & 63];
    out += i + 1 < in.size() ? kAlphabet[(v >> 6) & 63] : '=';
    out += '=';
  }
  return out;
}

// The picture as a PNG with its parameters chunk (what save_png would write), base64.
std::string png_b64(const GenerateResult& r) {
  return base64(encode_png(to_image(r), r.parameters));
}

// An uploaded image's size from its header, through the image libraries (libspng, libjpeg-turbo)
// that flowkv itself decodes with; refused when neither reads it. Cheap: no pixel is decoded
// before the size is known to be within --max-upload-pixels.
std::pair<int64_t, int64_t> image_header_size(const std::string& bytes, const std::string& what) {
  if (bytes.size() >= 8 && std::memcmp(bytes.data(), "\x89PNG\r\n\x1a\n", 8) == 0) {
    spng_ctx* ctx = spng_ctx_new(0);
    if (!ctx) throw ApiError(500, "out of memory", "", "", "server_error");
    spng_ihdr ihdr{};
    const int rc_buf = spng_set_png_buffer(ctx, bytes.data(), bytes.size());
    const int rc = rc_buf ? rc_buf : spng_get_ihdr(ctx, &ihdr);
    spng_ctx_free(ctx);
    if (rc) {
      throw ApiError(400, what + ": not a readable PNG (" + spng_strerror(rc) + ")", "image",
                     "invalid_image");
    }
    return {ihdr.width, ihdr.height};
  }
  if (bytes.size() >= 3 && static_cast<uint8_t>(bytes[0]) == 0xFF &&
      static_cast<uint8_t>(bytes[1]) == 0xD8) {
    tjhandle h = tjInitDecompress();
    if (!h) throw ApiError(500, "cannot start the JPEG decoder", "", "", "server_error");
    int w = 0, hh = 0, sub = 0, cs = 0;
    const int rc =
        tjDecompressHeader3(h, reinterpret_cast<const unsigned char*>(bytes.data()),
                            static_cast<unsigned long>(bytes.size()), &w, &hh, &sub, &cs);
    tjDestroy(h);
    if (rc != 0) {
      throw ApiError(400, what + ": not a readable JPEG", "image", "invalid_image");
    }
    return {w, hh};
  }
  throw ApiError(400, what + ": not a PNG or JPEG image", "image", "invalid_image_format");
}

// An edit's form: its image parts (in order) and its text fields as parse_request's JSON.
json read_form(const httplib::Request& hreq,
               std::vector<const httplib::MultipartFormData*>& images) {
  if (!hreq.is_multipart_form_data()) {
    throw ApiError(400, "/v1/images/edits takes multipart/form-data (image[] files and fields)", "",
                   "invalid_content_type");
  }
  std::multimap<std::string, std::string> fields;
  for (const auto& [name, part] : hreq.files) {
    if (!valid_utf8(name) || (part.filename.empty() && !valid_utf8(part.content))) {
      const std::string shown = valid_utf8(name) ? "'" + name.substr(0, 64) + "'" : "a field";
      throw ApiError(400, "form field " + shown + " is not valid UTF-8 text", "",
                     "invalid_encoding");
    }
    if (name == "image" || name == "image[]") {
      images.push_back(&part);
    } else if (!part.filename.empty()) {
      throw ApiError(400,
                     "unexpected file field '" + name.substr(0, 64) + "'; images go in image[]",
                     name.substr(0, 64), "unknown_parameter");
    } else {
      fields.emplace(name, part.content);
    }
  }
  return form_fields_to_json(fields);
}

// The uploads, checked from their headers (PNG or JPEG, within --max-upload-pixels), handed to
// the pipeline as encoded bytes under the names the client knows them by.
void add_uploads(const State& s, const std::vector<const httplib::MultipartFormData*>& images,
                 GenerateRequest& g) {
  if (images.empty())
    throw ApiError(400, "an edit needs at least one image (image[])", "image", "missing_required");
  if (static_cast<int>(images.size()) > s.opt.limits.max_references) {
    throw ApiError(400,
                   std::to_string(images.size()) + " images, over this server's limit of " +
                       std::to_string(s.opt.limits.max_references) + " (--max-references)",
                   "image", "too_many_images");
  }
  for (size_t i = 0; i < images.size(); ++i) {
    const std::string what =
        "image " + std::to_string(i + 1) + " (" + images[i]->filename.substr(0, 64) + ")";
    const std::string& bytes = images[i]->content;
    const auto [w, h] = image_header_size(bytes, what);
    if (w <= 0 || h <= 0 || w * h > s.opt.limits.max_upload_pixels) {
      throw ApiError(400,
                     what + " is " + std::to_string(w) + "x" + std::to_string(h) +
                         ", over this server's limit of " +
                         std::to_string(s.opt.limits.max_upload_pixels) +
                         " pixels (--max-upload-pixels)",
                     "image", "image_too_large");
    }
    InputImage in;
    in.name = what;
    in.encoded.assign(bytes.begin(), bytes.end());
    g.images.push_back(std::move(in));
  }
}

// Reads and checks a request; `job` is set first, so that an error can name it.
void admit(State& s, const httplib::Request& hreq, bool edit, std::shared_ptr<Job>& job) {
  if (s.stopping) {
    throw ApiError(503, "the server is shutting down", "", "shutting_down", "server_error");
  }
  job = std::make_shared<Job>();
  job->id = t_served.id;
  job->edit = edit;
  // The data's size, whatever the transfer encoding (the connection counted the raw bytes).
  int64_t bytes = static_cast<int64_t>(hreq.body.size());
  for (const auto& [name, part] : hreq.files) bytes += static_cast<int64_t>(part.content.size());
  if (bytes > s.opt.max_body) {
    throw ApiError(413,
                   "the request body is larger than this server's limit of " +
                       std::to_string(s.opt.max_body) + " bytes (--max-body)",
                   "", "payload_too_large");
  }
  json body;
  std::vector<const httplib::MultipartFormData*> images;
  if (edit) {
    body = read_form(hreq, images);
  } else {
    if (hreq.is_multipart_form_data()) {
      throw ApiError(400, "/v1/images/generations takes a JSON body (application/json)", "",
                     "invalid_content_type");
    }
    body = parse_body(hreq.body);
  }
  job->req = parse_request(body, edit, s.opt.limits);
  ImageRequest& r = job->req;
  t_served.user = r.user;
  if (!r.model.empty() && r.model != s.model_id) {
    throw ApiError(400,
                   "model '" + r.model.substr(0, 128) +
                       "' is not served here; this server serves '" + s.model_id + "'",
                   "model", "model_not_found");
  }
  if (r.generate.dtype != "auto" && r.generate.dtype != s.opt.dtype) {
    throw ApiError(400,
                   "dtype '" + r.generate.dtype + "': this server computes in '" + s.opt.dtype +
                       "' (flowkv serve --dtype); leave dtype out or ask for that",
                   "dtype", "invalid_value");
  }
  if (edit) add_uploads(s, images, r.generate);
  // Checked and its images decoded once, no weight read: the layout admission reads, the plan
  // a worker runs. The plan keeps the pixels; the upload bytes are no longer needed.
  job->prepared = std::make_shared<const PreparedRequest>(s.pipeline.prepare(r.generate));
  // The model's size multiples: a size it would round is refused, as docs/serving.md says,
  // naming the size it would make.
  const GenerateLayout& layout = job->prepared->layout();
  if (r.generate.width > 0 &&
      (layout.width != r.generate.width || layout.height != r.generate.height)) {
    throw ApiError(400,
                   "'size' " + r.size +
                       " is not a size this model makes (its sides are multiples "
                       "of its patch); the nearest is " +
                       std::to_string(layout.width) + "x" + std::to_string(layout.height),
                   "size", "invalid_size");
  }
  r.generate.images.clear();
  r.generate.images.shrink_to_fit();
  job->bytes = admit_memory(s, *job);
  if (Connection* c = HardenedServer::current()) job->fd = c->socket();
  job->deadline =
      Clock::now() + std::chrono::microseconds(static_cast<int64_t>(s.opt.timeout_seconds * 1e6));
}

std::string store_keys_header(const std::vector<Picture>& images) {
  std::set<std::string> keys;
  for (const Picture& im : images)
    keys.insert(im.meta.store_keys.begin(), im.meta.store_keys.end());
  std::string h;
  for (const std::string& k : keys) h += (h.empty() ? "" : ",") + k;
  return h;
}

std::string seconds_text(double s) {
  char b[32];
  std::snprintf(b, sizeof b, "%g", s);
  return b;
}

void send_error(httplib::Response& res, int status, const json& body) {
  res.status = status;
  if (status == 503) res.set_header("Retry-After", "5");
  res.set_content(dump(body), "application/json");
}

}  // namespace

std::vector<Picture> run(State& s, Job& j, const Emitter& emit) {
  s.admission->acquire(j.bytes, [&] { return should_stop(s, j); });
  struct Release {
    State& s;
    int64_t bytes;
    ~Release() { s.admission->release(bytes); }
  } release{s, j.bytes};
  std::vector<Picture> out;
  for (int i = 0; i < j.req.n; ++i) {
    // Picture i: seed + i, the same prepared images.
    const uint64_t seed = j.prepared->request().seed + static_cast<uint64_t>(i);
    const PreparedRequest one = i == 0 ? *j.prepared : j.prepared->with_seed(seed);
    GenerateControl c;
    c.cancelled = [&] { return should_stop(s, j); };
    c.on_step = [&](const StepEvent& e) {
      s.metrics.step(e.seconds);
      if (emit.step) emit.step(i, e);
    };
    c.previews = j.req.stream ? j.req.partial_images : 0;
    if (emit.partial) {
      c.on_preview = [&](int index, const StepEvent&, const GenerateResult& preview) {
        emit.partial(i, index, png_b64(preview));
      };
    }
    c.store = s.store;
    const auto t0 = Clock::now();
    GenerateResult r = s.pipeline.generate(one, {}, c);
    Picture im;
    im.seed = seed;
    im.b64 = png_b64(r);
    im.seconds = since(t0);
    r.pixels.clear();
    r.pixels.shrink_to_fit();
    im.meta = std::move(r);
    s.metrics.count("images");
    if (emit.completed) emit.completed(i, im);
    out.push_back(std::move(im));
  }
  return out;
}

json usage_of(const Job& j, int images) {
  const GenerateLayout& layout = j.layout();
  int64_t image_tokens = 0;
  for (int64_t t : layout.image_tokens) image_tokens += t;
  const int64_t in = layout.text_tokens + image_tokens;
  const int64_t out = layout.target_tokens * images;
  return json{{"input_tokens", in},
              {"input_tokens_details",
               {{"text_tokens", layout.text_tokens}, {"image_tokens", image_tokens}}},
              {"output_tokens", out},
              {"total_tokens", in + out}};
}

json flowkv_of(const Picture& im) {
  json stages = json::array();
  for (const StageReport& st : im.meta.stages) {
    stages.push_back({{"name", st.name}, {"seconds", st.seconds}, {"detail", st.detail}});
  }
  return json{{"seed", im.seed},
              {"seconds", im.seconds},
              {"width", im.meta.width},
              {"height", im.meta.height},
              {"channels", im.meta.channels},
              {"store_hits", im.meta.store_hits},
              {"store_misses", im.meta.store_misses},
              {"prompt_truncated", im.meta.prompt_truncated},
              {"stages", stages}};
}

std::pair<int, json> error_of(State& s, const Job* j, std::exception_ptr ep) {
  try {
    std::rethrow_exception(ep);
  } catch (const ApiError& e) {
    if (e.code == "queue_full") s.metrics.count("rejected_queue_full");
    return {e.status, error_body(e.what(), e.type, e.param, e.code)};
  } catch (const Cancelled& e) {
    if (j && j->timed_out) {
      s.metrics.count("timeouts");
      return {504, error_body("the request ran past this server's time limit of " +
                                  seconds_text(s.opt.timeout_seconds) + " s (--timeout)",
                              "server_error", "", "timeout")};
    }
    if (j && j->aborted) {
      s.metrics.count("shutdown_aborted");
      return {503, error_body("the server is shutting down; the request was stopped",
                              "server_error", "", "shutting_down")};
    }
    s.metrics.count("cancelled");
    return {499, json()};
  } catch (const KVBudgetError& e) {
    return {503, error_body(e.what(), "server_error", "", "memory_budget")};
  } catch (const Error& e) {
    // The library names an upload as the client knows it ("image 2 (photo.png)"); a path of the
    // server's (the model folder, the store) is replaced by a name before the client sees it.
    return {400, error_body(s.redact(e.what()), "invalid_request_error", "", "invalid_request")};
  } catch (const std::exception& e) {
    std::fprintf(stderr, "request %llu: internal error: %s\n",
                 static_cast<unsigned long long>(t_served.id), log_safe(e.what()).c_str());
    return {500, error_body("internal server error", "server_error", "", "internal_error")};
  } catch (...) {
    return {500, error_body("internal server error", "server_error", "", "internal_error")};
  }
}

void handle_images(State& s, const httplib::Request& hreq, httplib::Response& res, bool edit) {
  handling();
  std::shared_ptr<Job> job;
  try {
    admit(s, hreq, edit, job);
    if (!job->req.stream) {
      const std::vector<Picture> images = run(s, *job, {});
      json data = json::array();
      json extra = json::array();
      for (const Picture& im : images) {
        data.push_back({{"b64_json", im.b64}});
        extra.push_back(flowkv_of(im));
      }
      const Picture& last = images.back();
      json body = {
          {"created", unix_now()},
          {"data", data},
          {"output_format", "png"},
          {"size", std::to_string(last.meta.width) + "x" + std::to_string(last.meta.height)},
          {"usage", usage_of(*job, job->req.n)},
          {"flowkv", {{"request_id", job->id}, {"images", extra}}}};
      res.status = 200;
      if (const std::string k = store_keys_header(images); !k.empty())
        res.set_header("X-Flowkv-Store-Keys", k);
      res.set_content(dump(body), "application/json");
      return;
    }
    if (s.admission->full()) {
      throw ApiError(503, "the server is busy (--queue is full); retry after a while", "",
                     "queue_full", "server_error");
    }
  } catch (...) {
    auto [status, body] = error_of(s, job.get(), std::current_exception());
    if (status == 499) {
      t_served.outcome = 499;
      res.status = 499;  // never reaches the client: it is gone
      res.set_header("Connection", "close");
      return;
    }
    send_error(res, status, body);
    return;
  }
  // A stream: headers now, events as the request runs.
  stream_images(s, std::move(job), res);
}

}  // namespace flowkv::server
