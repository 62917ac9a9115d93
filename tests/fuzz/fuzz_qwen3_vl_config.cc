// libFuzzer target: the Qwen3-VL text encoder's two JSON files as flowkv reads them, the
// preprocessor_config.json (ImageProcessorConfig) and the vision_config of config.json
// (VisionConfig), and Qwen2.5-VL's config.json (Qwen-Image's text encoder: qwen25_vl::Config and
// its VisionConfig). An accepted processor config gives token counts for a few image sizes, each
// consistent with its grid; an accepted vision config gives a weight table.
#include <cstddef>
#include <cstdint>
#include <string>

#include "fuzz_common.h"
#include "io/json.h"
#include "models/qwen25_vl/config.h"
#include "models/qwen25_vl/vision_config.h"
#include "models/qwen25_vl/vision_weights.h"
#include "models/qwen25_vl/weights.h"
#include "models/qwen3_vl/image_processor.h"
#include "models/qwen3_vl/vision_config.h"
#include "models/qwen3_vl/vision_weights.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  flowkv::Json j;
  bool parsed = false;
  flowkv::fuzz::expect_only_flowkv_errors([&] {
    j = flowkv::parse_json(text, "preprocessor_config.json");
    parsed = true;
  });
  if (!parsed) return 0;
  using flowkv::qwen3_vl::ImageProcessorConfig;
  flowkv::fuzz::expect_only_flowkv_errors([&] {
    const auto c = ImageProcessorConfig::from_json(j, "preprocessor_config.json");
    for (const auto& size : {std::pair<int64_t, int64_t>{1, 1}, {1248, 864}, {37, 4000}}) {
      // Not a structured binding: clang before 16 cannot capture one in a lambda.
      const int64_t w = size.first, h = size.second;
      flowkv::fuzz::expect_only_flowkv_errors([&] {
        const auto g = flowkv::qwen3_vl::image_grid(c, w, h);
        const int64_t n = flowkv::qwen3_vl::image_token_count(c, w, h);
        FUZZ_ASSERT(g[0] == 1 && g[1] >= 1 && g[2] >= 1, "empty grid for %lldx%lld",
                    static_cast<long long>(w), static_cast<long long>(h));
        FUZZ_ASSERT(n * c.merge_size * c.merge_size == g[1] * g[2], "token count %lld",
                    static_cast<long long>(n));
      });
    }
  });
  flowkv::fuzz::expect_only_flowkv_errors([&] {
    const auto v = flowkv::qwen3_vl::VisionConfig::from_model_config(j, "config.json");
    FUZZ_ASSERT(!flowkv::qwen3_vl::vision_weight_table(v, "model.visual.").empty(),
                "empty weight table");
    FUZZ_ASSERT(flowkv::qwen3_vl::vision_parameter_count(v) > 0, "no parameters");
  });
  flowkv::fuzz::expect_only_flowkv_errors([&] {
    const auto c = flowkv::qwen25_vl::Config::from_json(j, "config.json");
    FUZZ_ASSERT(!flowkv::qwen25_vl::text_weight_table(c).empty(), "empty text weight table");
  });
  flowkv::fuzz::expect_only_flowkv_errors([&] {
    const auto v = flowkv::qwen25_vl::VisionConfig::from_model_config(j, "config.json");
    FUZZ_ASSERT(!flowkv::qwen25_vl::vision_weight_table(v, "visual.").empty(),
                "empty weight table");
    FUZZ_ASSERT(flowkv::qwen25_vl::vision_parameter_count(v) > 0, "no parameters");
  });
  return 0;
}
