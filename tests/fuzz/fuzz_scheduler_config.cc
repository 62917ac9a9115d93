// libFuzzer target: a pipeline folder's scheduler/scheduler_config.json as the loader reads it
// (parse_json, then sched::scheduler_config_from_json), and what the denoise loop does next with
// an accepted config: both families' mu and set_timesteps over a few step counts. A schedule that
// set_timesteps returns has steps + 1 sigmas ending at the terminal one (0, or 1 with
// invert_sigmas) and steps timesteps.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "fuzz_common.h"
#include "io/json.h"
#include "sched/flow_match.h"
#include "sched/scheduler_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace sched = flowkv::sched;
  const std::string text(reinterpret_cast<const char*>(data), size);
  flowkv::fuzz::expect_only_flowkv_errors([&] {
    const flowkv::Json j = flowkv::parse_json(text, "scheduler_config.json");
    const sched::FlowMatchConfig c = sched::scheduler_config_from_json(j, "scheduler_config.json");
    for (int steps : {1, 2, 7, 28}) {
      std::optional<double> mus[] = {sched::empirical_mu(4096, steps), std::nullopt};
      flowkv::fuzz::expect_only_flowkv_errors([&] { mus[1] = sched::linear_mu(4096, c); });
      for (const std::optional<double>& mu : mus) {
        flowkv::fuzz::expect_only_flowkv_errors([&] {
          const sched::Schedule s = sched::set_timesteps(c, sched::linspace_sigmas(steps), mu);
          FUZZ_ASSERT(s.sigmas.size() == static_cast<size_t>(steps) + 1 &&
                          s.timesteps.size() == static_cast<size_t>(steps),
                      "%zu sigmas, %zu timesteps for %d steps", s.sigmas.size(), s.timesteps.size(),
                      steps);
          FUZZ_ASSERT(s.sigmas.back() == (c.invert_sigmas ? 1.0f : 0.0f), "terminal sigma %g",
                      static_cast<double>(s.sigmas.back()));
        });
      }
    }
  });
  return 0;
}
