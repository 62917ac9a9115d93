// generate(): the pipeline folder's family runs it (families/family.h, Family::generate).
#include "families/family.h"
#include "flowkv/error.h"
#include "flowkv/generate.h"
#include "io/image.h"
#include "io/pipeline_folder.h"

namespace flowkv {

namespace {

// The pipeline folder and the family that generates with its class.
std::pair<PipelineFolder, const families::Family*> pipeline_family(const std::string& dir) {
  std::optional<PipelineFolder> p = find_pipeline_folder(dir);
  FLOWKV_CHECK(p, dir,
               ": not a diffusers pipeline folder (no model_index.json); generate needs the whole "
               "pipeline: the transformer, text encoder, tokenizer or processor, and VAE");
  std::string known;
  for (const families::Family& f : families::registry()) {
    if (!f.generate) continue;
    if (f.runs_pipeline(p->class_name)) return {std::move(*p), &f};
    known += (known.empty() ? "" : ", ") + f.info.title;
  }
  fail(p->path, "/model_index.json: flowkv does not generate with a ", p->class_name,
       " pipeline; it generates with ", known);
}

}  // namespace

GenerateResult generate(const std::string& pipeline_dir, const GenerateRequest& request,
                        const GenerateProgress& progress, const GenerateControl& control) {
  const auto [p, family] = pipeline_family(pipeline_dir);
  return family->generate(p, request, progress, control);
}

GenerateLayout generate_layout(const std::string& pipeline_dir, const GenerateRequest& request) {
  const auto [p, family] = pipeline_family(pipeline_dir);
  return family->generate_layout(p, request);
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
