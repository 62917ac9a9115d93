#include "sched/scheduler_config.h"

#include <cmath>
#include <string_view>

#include "core/boundary.h"
#include "flowkv/error.h"

namespace flowkv::sched {

namespace {

constexpr std::string_view kClass = "FlowMatchEulerDiscreteScheduler";

// Every key read below; any other key not starting with "_" is refused.
constexpr std::string_view kKnown[] = {"num_train_timesteps",
                                       "shift",
                                       "use_dynamic_shifting",
                                       "base_shift",
                                       "max_shift",
                                       "base_image_seq_len",
                                       "max_image_seq_len",
                                       "invert_sigmas",
                                       "shift_terminal",
                                       "use_karras_sigmas",
                                       "use_exponential_sigmas",
                                       "use_beta_sigmas",
                                       "time_shift_type",
                                       "stochastic_sampling",
                                       "sigma_min",
                                       "sigma_max"};

bool known(const std::string& key) {
  for (std::string_view k : kKnown) {
    if (k == key) return true;
  }
  return false;
}

std::string field(const std::string& path, const std::string& key) {
  return path + ": field \"" + key + "\"";
}

// A number that diffusers would use as is: null is refused (None breaks the arithmetic that
// reads it), a missing key takes the class default.
double number(const Json& j, const char* key, double def, double lo, double hi,
              const std::string& path) {
  if (!j.contains(key)) return def;
  FLOWKV_CHECK(!j[key].is_null(), field(path, key), " is null: flowkv needs a number (",
               "diffusers' default is ", def, ")");
  return json_number(j, key, def, lo, hi, path);
}

int64_t integer(const Json& j, const char* key, int64_t def, int64_t lo, int64_t hi,
                const std::string& path) {
  FLOWKV_CHECK(!j.contains(key) || !j[key].is_null(), field(path, key),
               " is null: flowkv needs an integer (diffusers' default is ", def, ")");
  return json_int(j, key, def, lo, hi, path);
}

std::optional<double> optional_number(const Json& j, const char* key, const std::string& path) {
  if (!j.contains(key) || j[key].is_null()) return std::nullopt;
  return json_number(j, key, 0, 0, 1e6, path);
}

void refuse_unknown_keys(const Json& j, const std::string& path) {
  for (const auto& [key, value] : j.items()) {
    if (key.empty() || key[0] == '_' || known(key)) continue;
    if (key == "use_flow_sigmas") {
      FLOWKV_CHECK(value.is_null() || value == false, field(path, key),
                   " is set: the FLUX.2 Klein pipelines then drop their sigma grid and use the "
                   "scheduler's own default timesteps, which flowkv does not implement");
      continue;
    }
    fail(field(path, key), " is not a ", kClass, " setting (diffusers ", "0.42.1",
         " would ignore it with a warning); remove it, or check the file is the right one");
  }
}

FlowMatchConfig from_json_unguarded(const Json& j, const std::string& path) {
  FLOWKV_CHECK(j.is_object(), path, ": a scheduler config must be a JSON object");
  if (j.contains("_class_name")) {
    const Json& cls = j["_class_name"];
    FLOWKV_CHECK(cls.is_string() && cls.get<std::string>() == kClass, field(path, "_class_name"),
                 " is ", cls.dump(), ": only ", kClass, " is supported");
  }
  refuse_unknown_keys(j, path);
  FlowMatchConfig c;  // the class defaults
  c.num_train_timesteps =
      integer(j, "num_train_timesteps", c.num_train_timesteps, 1, 1000000000, path);
  c.shift = number(j, "shift", c.shift, 1e-6, 1e6, path);
  c.use_dynamic_shifting = json_bool(j, "use_dynamic_shifting", c.use_dynamic_shifting, path);
  c.base_shift = number(j, "base_shift", c.base_shift, -80, 80, path);
  c.max_shift = number(j, "max_shift", c.max_shift, -80, 80, path);
  c.base_image_seq_len =
      integer(j, "base_image_seq_len", c.base_image_seq_len, 0, int64_t{1} << 40, path);
  c.max_image_seq_len =
      integer(j, "max_image_seq_len", c.max_image_seq_len, 0, int64_t{1} << 40, path);
  c.invert_sigmas = json_bool(j, "invert_sigmas", c.invert_sigmas, path);
  // diffusers tests `if shift_terminal:`, so null and 0 both mean none; 1 would divide by 0.
  c.shift_terminal = json_number(j, "shift_terminal", 0, 0, 0.999999, path);

  const bool karras = json_bool(j, "use_karras_sigmas", false, path);
  const bool exponential = json_bool(j, "use_exponential_sigmas", false, path);
  const bool beta = json_bool(j, "use_beta_sigmas", false, path);
  FLOWKV_CHECK(karras + exponential + beta <= 1, path,
               ": only one of use_karras_sigmas, use_exponential_sigmas, use_beta_sigmas can be "
               "true (diffusers raises the same)");
  c.spacing = karras        ? SigmaSpacing::kKarras
              : exponential ? SigmaSpacing::kExponential
              : beta        ? SigmaSpacing::kBeta
                            : SigmaSpacing::kShifted;
  c.sigma_min = optional_number(j, "sigma_min", path);
  c.sigma_max = optional_number(j, "sigma_max", path);

  if (j.contains("time_shift_type")) {
    const Json& t = j["time_shift_type"];
    FLOWKV_CHECK(t == "exponential" || t == "linear", field(path, "time_shift_type"), " is ",
                 t.dump(), ": it must be \"exponential\" or \"linear\"");
    c.exponential_shift = t == "exponential";
  }
  FLOWKV_CHECK(!json_bool(j, "stochastic_sampling", false, path),
               field(path, "stochastic_sampling"),
               " is true: stochastic sampling (x0 re-noised with a fresh draw at every step) is "
               "not implemented in flowkv; set it to false for the Euler step");
  return c;
}

}  // namespace

FlowMatchConfig scheduler_config_from_json(const Json& j, const std::string& path) {
  return at_input_boundary(path, [&] { return from_json_unguarded(j, path); });
}

FlowMatchConfig read_scheduler_config(const std::string& scheduler_dir) {
  const std::string path = scheduler_dir + "/scheduler_config.json";
  return scheduler_config_from_json(read_json_file(path), path);
}

}  // namespace flowkv::sched
