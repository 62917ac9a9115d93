// generate(): a Pipeline opened for one request (flowkv/pipeline.h).
#include "flowkv/error.h"
#include "flowkv/generate.h"
#include "flowkv/pipeline.h"
#include "io/image.h"

namespace flowkv {

// A one-off request: the folder opened staged (each stage loads its component and releases
// it), as the CLI runs on small machines.
GenerateResult generate(const std::string& pipeline_dir, const GenerateRequest& request,
                        const GenerateProgress& progress, const GenerateControl& control) {
  const Pipeline p =
      Pipeline::open(pipeline_dir, {.memory = MemoryPolicy::kStaged, .dtype = request.dtype});
  return p.generate(request, progress, control);
}

GenerateLayout generate_layout(const std::string& pipeline_dir, const GenerateRequest& request) {
  return Pipeline::open(pipeline_dir, {.memory = MemoryPolicy::kStaged, .dtype = request.dtype})
      .layout(request);
}

Image to_image(const GenerateResult& r) {
  FLOWKV_CHECK(r.channels == 3 || r.channels == 4, "a picture has 3 or 4 channels, not ",
               r.channels);
  FLOWKV_CHECK(r.width > 0 && r.height > 0 &&
                   static_cast<int64_t>(r.pixels.size()) == r.width * r.height * r.channels,
               "a picture of ", r.width, "x", r.height, "x", r.channels, " holds ", r.pixels.size(),
               " values");
  Image image;
  image.width = r.width, image.height = r.height;
  image.channels = r.channels;
  image.pixels = r.pixels;
  return image;
}

void save_png(const std::string& path, const GenerateResult& r) {
  save_png(path, to_image(r), r.parameters);
}

}  // namespace flowkv
