// libFuzzer target: a pipeline folder's model_index.json (io/pipeline_folder.h), as generate and
// the FLUX.2 loader read it; every component of an accepted index is a folder name inside it.
#include <cstddef>
#include <cstdint>
#include <string>

#include "fuzz_common.h"
#include "io/json.h"
#include "io/pipeline_folder.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  flowkv::fuzz::expect_only_flowkv_errors([&] {
    const flowkv::PipelineFolder p =
        flowkv::parse_pipeline_index(flowkv::parse_json(text, "model_index.json"), "pipe");
    for (const auto& [name, c] : p.components) {
      FUZZ_ASSERT(c.path == "pipe/" + name, "component '%s' escapes the folder: %s", name.c_str(),
                  c.path.c_str());
    }
  });
  return 0;
}
