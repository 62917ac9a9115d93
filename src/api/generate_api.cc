// generate(): the pipeline folder's family runs it (families/family.h, Family::generate).
#include "families/family.h"
#include "flowkv/error.h"
#include "flowkv/generate.h"
#include "io/image.h"
#include "io/pipeline_folder.h"

namespace flowkv {

GenerateResult generate(const std::string& pipeline_dir, const GenerateRequest& request,
                        const GenerateProgress& progress) {
  const std::optional<PipelineFolder> p = find_pipeline_folder(pipeline_dir);
  FLOWKV_CHECK(p, pipeline_dir,
               ": not a diffusers pipeline folder (no model_index.json); generate needs the whole "
               "pipeline: transformer/, text_encoder/, tokenizer/ and vae/");
  std::string known;
  for (const families::Family& f : families::registry()) {
    if (!f.generate) continue;
    if (f.runs_pipeline(p->class_name)) return f.generate(*p, request, progress);
    known += (known.empty() ? "" : ", ") + f.info.title;
  }
  fail(p->path, "/model_index.json: flowkv does not generate with a ", p->class_name,
       " pipeline; it generates with ", known);
}

void save_png(const std::string& path, const GenerateResult& r) {
  Image image;
  image.width = r.width, image.height = r.height;
  image.channels = r.channels;
  image.pixels = r.pixels;
  save_png(path, image, r.parameters);
}

}  // namespace flowkv
