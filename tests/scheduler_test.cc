// The flow-matching scheduler against diffusers 0.42.1 (tests/golden/scheduler/cases.json from
// python/ref/dump_scheduler.py): each case's scheduler_config.json read by
// scheduler_config_from_json, its sigmas and mu passed to set_timesteps, and the float32 sigmas
// and timesteps required bit for bit; the families' mu functions against the pipelines'. Then
// every refused field of a scheduler config, by the error that names it.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "golden_util.h"
#include "io/json.h"
#include "sched/flow_match.h"
#include "sched/scheduler_config.h"
#include "temp_files.h"

namespace flowkv {
namespace {

using test::expect_error;

uint32_t bits(float v) {
  uint32_t u;
  std::memcpy(&u, &v, 4);
  return u;
}

std::vector<uint32_t> hex_bits(const Json& list) {
  std::vector<uint32_t> out;
  for (const Json& h : list)
    out.push_back(static_cast<uint32_t>(std::stoul(h.get<std::string>(), nullptr, 16)));
  return out;
}

std::vector<uint32_t> float_bits(const std::vector<float>& v) {
  std::vector<uint32_t> out;
  for (float x : v) out.push_back(bits(x));
  return out;
}

const Json& golden_cases() {
  static const Json j = read_json_file(test::golden("scheduler/cases.json"));
  return j.at("cases");
}

// Each case's config read, its schedule computed, and compared bit for bit; returns how many
// schedules were compared (diffusers' NaN cases are instead refused by flowkv, by name).
int expect_cases_match(const Json& cases) {
  int compared = 0;
  for (const Json& c : cases) {
    const std::string name = c.at("name").get<std::string>();
    SCOPED_TRACE(name);
    const sched::FlowMatchConfig cfg = sched::scheduler_config_from_json(c.at("config"), name);
    const auto sigmas = c.at("sigmas_in").get<std::vector<double>>();
    std::optional<double> mu;
    if (!c.at("mu").is_null()) mu = c.at("mu").get<double>();
    if (c.contains("mu_from")) {
      // The family's mu function gives the pipeline's mu, to the bit.
      const Json& from = c.at("mu_from");
      const int64_t seq = from.at("image_seq_len").get<int64_t>();
      const double want = *mu;
      if (from.at("family") == "klein") {
        EXPECT_EQ(sched::empirical_mu(seq, static_cast<int>(sigmas.size())), want);
      } else {
        EXPECT_EQ(sched::linear_mu(seq, cfg), want);
      }
    }
    if (c.value("diffusers_nan", false)) {
      // diffusers' schedule is NaN here; flowkv says why instead.
      expect_error([&] { sched::set_timesteps(cfg, sigmas, mu); }, {"shift_terminal", "NaN"});
      continue;
    }
    const sched::Schedule s = sched::set_timesteps(cfg, sigmas, mu);
    EXPECT_EQ(float_bits(s.sigmas), hex_bits(c.at("sigmas")));
    EXPECT_EQ(float_bits(s.timesteps), hex_bits(c.at("timesteps")));
    ++compared;
  }
  return compared;
}

TEST(SchedulerGolden, MatchesDiffusersBitForBit) {
  EXPECT_GE(expect_cases_match(golden_cases()), 45);
}

// The random sweep of dump_scheduler.py --sweep (not committed: 1500 cases are 10 MB), when
// FLOWKV_SCHEDULER_SWEEP names its sweep.json.
TEST(SchedulerGolden, RandomSweepWhenGiven) {
  const char* path = std::getenv("FLOWKV_SCHEDULER_SWEEP");
  if (!path) GTEST_SKIP() << "FLOWKV_SCHEDULER_SWEEP is not set";
  EXPECT_GT(expect_cases_match(read_json_file(path).at("cases")), 0);
}

void expect_same(const sched::FlowMatchConfig& a, const sched::FlowMatchConfig& b) {
  EXPECT_EQ(a.num_train_timesteps, b.num_train_timesteps);
  EXPECT_EQ(a.shift, b.shift);
  EXPECT_EQ(a.use_dynamic_shifting, b.use_dynamic_shifting);
  EXPECT_EQ(a.exponential_shift, b.exponential_shift);
  EXPECT_EQ(a.base_shift, b.base_shift);
  EXPECT_EQ(a.max_shift, b.max_shift);
  EXPECT_EQ(a.base_image_seq_len, b.base_image_seq_len);
  EXPECT_EQ(a.max_image_seq_len, b.max_image_seq_len);
  EXPECT_EQ(a.shift_terminal, b.shift_terminal);
  EXPECT_EQ(a.invert_sigmas, b.invert_sigmas);
  EXPECT_EQ(a.spacing, b.spacing);
  EXPECT_EQ(a.sigma_min, b.sigma_min);
  EXPECT_EQ(a.sigma_max, b.sigma_max);
}

// The hard-coded defaults (models loaded outside a pipeline folder) are the released configs,
// as their JSON reads: the dump's copies, and the scheduler folders diffusers saved for the
// pipeline goldens (every field written out).
TEST(SchedulerConfig, DefaultsAreTheReleasedConfigs) {
  for (const Json& c : golden_cases()) {
    const std::string name = c.at("name").get<std::string>();
    SCOPED_TRACE(name);
    if (name == "klein_4_steps_seq4096") {
      expect_same(sched::scheduler_config_from_json(c.at("config"), name),
                  sched::flux2_scheduler_config());
    }
    if (name == "qwen21_28_steps_seq4096") {
      expect_same(sched::scheduler_config_from_json(c.at("config"), name),
                  sched::qwen_image_scheduler_config());
    }
  }
  for (const char* dir : {"klein_pipeline/base", "klein_pipeline/kv"}) {
    expect_same(sched::read_scheduler_config(test::golden(dir) + "/pipeline/scheduler"),
                sched::flux2_scheduler_config());
  }
  expect_same(sched::read_scheduler_config(test::golden("qwen21_pipeline/pipeline/scheduler")),
              sched::qwen_image_scheduler_config());
  // A config without fields is the class's defaults.
  expect_same(sched::scheduler_config_from_json(Json::object(), "empty"), sched::FlowMatchConfig{});
}

TEST(SchedulerConfig, ReadsTheFolderFile) {
  test::TempDir d;
  test::write_file(d.file("scheduler_config.json"),
                   R"({"_class_name": "FlowMatchEulerDiscreteScheduler",
                       "_diffusers_version": "0.36.0", "_something_private": [1, 2],
                       "shift": 3.0, "use_dynamic_shifting": true, "shift_terminal": 0.1,
                       "time_shift_type": "linear", "invert_sigmas": false,
                       "use_beta_sigmas": true, "sigma_min": null, "sigma_max": 0.8})");
  const sched::FlowMatchConfig c = sched::read_scheduler_config(d.path().string());
  EXPECT_EQ(c.shift, 3.0);
  EXPECT_TRUE(c.use_dynamic_shifting);
  EXPECT_EQ(c.shift_terminal, 0.1);
  EXPECT_FALSE(c.exponential_shift);
  EXPECT_EQ(c.spacing, sched::SigmaSpacing::kBeta);
  EXPECT_FALSE(c.sigma_min);
  EXPECT_EQ(c.sigma_max, 0.8);
  // null and 0 are both "no terminal stretch" (diffusers tests `if shift_terminal:`).
  EXPECT_EQ(
      sched::scheduler_config_from_json(Json{{"shift_terminal", nullptr}}, "x").shift_terminal, 0);
  expect_error([&] { sched::read_scheduler_config(d.file("missing")); },
               {"missing/scheduler_config.json"});
}

// One scheduler_config.json text, refused with an error holding every fragment.
void expect_refused(const std::string& json, std::initializer_list<std::string> fragments) {
  SCOPED_TRACE(json);
  expect_error([&] { sched::scheduler_config_from_json(parse_json(json, "test"), "cfg.json"); },
               fragments);
}

TEST(SchedulerConfig, RefusesByName) {
  expect_refused(R"({"stochastic_sampling": true})", {"cfg.json", "stochastic_sampling"});
  expect_refused(R"({"_class_name": "EulerDiscreteScheduler"})",
                 {"cfg.json", "_class_name", "EulerDiscreteScheduler"});
  expect_refused(R"({"_class_name": 3})", {"cfg.json", "_class_name"});
  expect_refused(R"({"prediction_type": "epsilon"})", {"cfg.json", "prediction_type"});
  expect_refused(R"({"use_flow_sigmas": true})", {"cfg.json", "use_flow_sigmas", "Klein"});
  expect_refused(R"({"time_shift_type": "cosine"})", {"cfg.json", "time_shift_type", "cosine"});
  expect_refused(R"({"time_shift_type": null})", {"cfg.json", "time_shift_type"});
  expect_refused(R"({"use_karras_sigmas": true, "use_beta_sigmas": true})",
                 {"cfg.json", "use_karras_sigmas", "use_beta_sigmas"});
  expect_refused(R"({"use_exponential_sigmas": 1})", {"cfg.json", "use_exponential_sigmas"});
  expect_refused(R"({"invert_sigmas": "yes"})", {"cfg.json", "invert_sigmas"});
  expect_refused(R"({"use_dynamic_shifting": 1})", {"cfg.json", "use_dynamic_shifting"});
  expect_refused(R"({"shift": "3"})", {"cfg.json", "shift"});
  expect_refused(R"({"shift": null})", {"cfg.json", "shift", "null"});
  expect_refused(R"({"shift": -1})", {"cfg.json", "shift"});
  expect_refused(R"({"shift_terminal": 1.0})", {"cfg.json", "shift_terminal"});
  expect_refused(R"({"shift_terminal": -0.1})", {"cfg.json", "shift_terminal"});
  expect_refused(R"({"num_train_timesteps": 0})", {"cfg.json", "num_train_timesteps"});
  expect_refused(R"({"num_train_timesteps": 999.5})", {"cfg.json", "num_train_timesteps"});
  expect_refused(R"({"num_train_timesteps": null})", {"cfg.json", "num_train_timesteps"});
  expect_refused(R"({"base_shift": null})", {"cfg.json", "base_shift"});
  expect_refused(R"({"max_shift": 1e9})", {"cfg.json", "max_shift"});
  expect_refused(R"({"base_image_seq_len": -1})", {"cfg.json", "base_image_seq_len"});
  expect_refused(R"({"max_image_seq_len": "4096"})", {"cfg.json", "max_image_seq_len"});
  expect_refused(R"({"sigma_min": -0.5})", {"cfg.json", "sigma_min"});
  expect_refused(R"({"sigma_max": "1"})", {"cfg.json", "sigma_max"});
  expect_refused(R"([1, 2])", {"cfg.json", "object"});
  // Defaults and falsy values of the refused settings are accepted.
  EXPECT_NO_THROW(sched::scheduler_config_from_json(
      Json{{"stochastic_sampling", false}, {"use_flow_sigmas", false}, {"_use_default_values", 1}},
      "cfg.json"));
}

TEST(SchedulerConfig, SetTimestepsRefusesWhatDiffusersCannotCompute) {
  sched::FlowMatchConfig c = sched::flux2_scheduler_config();
  expect_error(
      [&] {
        sched::set_timesteps(c, {1.0, 0.5}, std::nullopt);
      },
      {"use_dynamic_shifting", "mu"});
  c = sched::qwen_image_scheduler_config();
  expect_error([&] { sched::set_timesteps(c, {1.0}, 0.7); }, {"shift_terminal", "single step"});
  c = sched::FlowMatchConfig{};
  c.shift = 3;  // 1 + (3 - 1) * -0.5 = 0: an infinite sigma
  expect_error([&] { sched::set_timesteps(c, {1.0, -0.5}, std::nullopt); }, {"sigma 1", "inf"});
  c = sched::FlowMatchConfig{};
  c.spacing = sched::SigmaSpacing::kExponential;
  expect_error(
      [&] {
        sched::set_timesteps(c, {1.0, 0.5, 0.0}, std::nullopt);
      },
      {"use_exponential_sigmas", "log"});
  c = sched::qwen_image_scheduler_config();
  c.max_image_seq_len = c.base_image_seq_len;
  expect_error([&] { sched::linear_mu(4096, c); }, {"max_image_seq_len", "base_image_seq_len"});
}

// scipy.stats.beta.ppf values (scipy 1.17.1) beyond the schedules' a = b = 0.6.
TEST(SchedulerBeta, PpfMatchesScipy) {
  EXPECT_EQ(sched::beta_ppf(0, 0.6, 0.6), 0);
  EXPECT_EQ(sched::beta_ppf(1, 0.6, 0.6), 1);
  EXPECT_EQ(sched::beta_ppf(0.5, 0.6, 0.6), 0.5000000000000001);  // scipy's, one ulp above
  EXPECT_EQ(sched::beta_ppf(0.5, 0.7, 0.7), 0.5);
  for (double p : {1e-6, 0.01, 0.25, 0.5, 0.75, 0.99, 1 - 1e-6}) {
    // Symmetric: ppf(1 - p) = 1 - ppf(p) to double precision.
    EXPECT_NEAR(sched::beta_ppf(1 - p, 0.6, 0.6), 1 - sched::beta_ppf(p, 0.6, 0.6), 4e-16) << p;
  }
  struct Case {
    double p, a, b, want;
  };
  for (const Case& c :
       {Case{1e-6, 0.6, 0.6, 1.8558824624053043e-10}, Case{0.01, 0.6, 0.6, 0.0008612388215429059},
        Case{0.25, 0.6, 0.6, 0.17568037865269498}, Case{0.9, 0.6, 0.6, 0.9604155944112192},
        Case{0.3, 2.5, 0.7, 0.7097758912148804}, Case{0.001, 0.5, 3.0, 2.8444455232269607e-07}}) {
    EXPECT_NEAR(sched::beta_ppf(c.p, c.a, c.b), c.want, 4 * std::abs(c.want) * 0x1p-52) << c.p;
  }
  // Beta(1, 1) is uniform; Beta(2, 1) has ppf sqrt(p).
  EXPECT_NEAR(sched::beta_ppf(0.3, 1, 1), 0.3, 1e-16);
  EXPECT_NEAR(sched::beta_ppf(0.3, 2, 1), std::sqrt(0.3), 1e-16);
}

}  // namespace
}  // namespace flowkv
