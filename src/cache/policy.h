// Approximate step-cache policies: created by name from a registry ("fbcache:threshold=0.2"),
// composed through one composite, state kept per request (a policy object belongs to one
// request) and per CFG branch (StepContext::branch), every decision logged.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cache/hooks.h"
#include "flowkv/step_cache.h"

namespace flowkv::cache {

// "name:key=value,key=value" parsed; typed getters check ranges and report unknown keys.
// The values a knob may take. Every number is finite; NaN and infinity are refused.
struct KnobRange {
  double lo, hi;
};
inline constexpr double kKnobMax = 1e9;                // "no practical upper bound"
inline constexpr KnobRange kNonNegative{0, kKnobMax};  // thresholds
// Bounds of a timestep range (diffusers' timesteps lie in [0, 1000]; -1 or a bound past 1000
// leaves that side open).
inline constexpr KnobRange kTimestepBound{-1, kKnobMax};
inline constexpr KnobRange kFraction{0, 1};
inline constexpr KnobRange kCount{1, 100000};         // intervals, skip distances
inline constexpr KnobRange kCountOrNone{-1, 100000};  // -1: no limit

class PolicyOptions {
 public:
  // The spec after the name and ':' ("threshold=0.1,warmup=2"); a key given twice is refused.
  static PolicyOptions parse(const std::string& spec);
  double num(const std::string& key, double def, KnobRange range);
  int64_t integer(const std::string& key, int64_t def, KnobRange range);
  bool flag(const std::string& key, bool def);
  std::string str(const std::string& key, const std::string& def);
  std::vector<double> list(const std::string& key, const std::vector<double>& def);
  // Throws naming any key no getter asked for.
  void check_all_used(const std::string& policy) const;

 private:
  std::map<std::string, std::string> values_;
  std::map<std::string, bool> used_;
};

// What a policy did, for the benchmark's columns.
struct PolicyStats {
  int64_t blocks_run = 0, blocks_skipped = 0;
  int64_t sublayers_computed = 0, sublayers_reused = 0;
  int64_t calls_full = 0, calls_skipped = 0;  // model calls with every block skipped
  int64_t branches_skipped = 0;
  std::string decisions;  // one character per decision, as the spec's traces: C computed,
                          // s skipped, p predicted, r reused, a approximated
};

// What a policy's knobs alone say it will skip (Policy::expected).
struct ExpectedWork {
  double skipped_fraction = 0;       // of the transformer's work over the run (an upper bound when
  bool upper_bound = false;          // the policy decides from the data)
  std::string text;                  // the schedule in words
  std::string unit = "model calls";  // what the fraction counts
};

class Policy : public BlockHooks, public StepHooks {
 public:
  // Called by the pipeline before every model call (and step-level decision).
  virtual void set_step(const StepContext& ctx) { ctx_ = ctx; }
  virtual std::string name() const = 0;
  virtual std::string describe() const = 0;  // the knobs in effect
  // Anything the user asked the policy to measure (MagCache calibration), printed after a run.
  virtual std::string report() const { return ""; }
  // The same measurements as numbers (TeaCache's calibration pairs, MagCache's ratios), for a
  // tool that fits them (flowkv calibrate).
  virtual std::vector<StepCacheSeries> measured() const { return {}; }
  // What the policy will skip over `steps` steps with `branches` model calls each, where that
  // follows from its knobs alone (a schedule, a bound): flowkv predict prints it. nullopt:
  // decided from the model's activations at run time, so only a run measures it.
  virtual std::optional<ExpectedWork> expected(int steps, int branches) const {
    (void)steps, (void)branches;
    return std::nullopt;
  }
  const PolicyStats& stats() const { return stats_; }
  const StepContext& step() const { return ctx_; }

 protected:
  void log(char c) { stats_.decisions.push_back(c); }
  // A call that stores an exact cache always computes (the K/V of text cached under the named
  // approximation are stored from the computed blocks).
  bool must_compute() const { return ctx_.prefill; }
  StepContext ctx_;
  PolicyStats stats_;
};

using PolicyFactory = std::function<std::unique_ptr<Policy>(PolicyOptions&, const Topology&)>;

struct PolicyInfo {
  std::string name;
  std::string summary;  // what it skips, exact or approximate, knobs and defaults
  PolicyFactory make;
};

void register_policy(PolicyInfo info);
// The factory of a policy class constructed from (options, topology).
template <class P>
PolicyFactory factory_of() {
  return [](PolicyOptions& o, const Topology& t) { return std::unique_ptr<Policy>(new P(o, t)); };
}
const std::vector<PolicyInfo>& registered_policies();

// Policies for one request: each spec "name[:k=v,...]" becomes a fresh policy instance.
std::vector<std::unique_ptr<Policy>> make_policies(const std::vector<std::string>& specs,
                                                   const Topology& topology);

// Forwards to several policies (a block is skipped if any policy skips it; every policy is asked
// whether it reuses a sublayer, so call counters stay in step, and the first that does provides
// it; every policy observes computed outputs). A step is skipped if any policy skips it (every
// policy is asked), the first that does fills its velocity, and every policy observes every
// step's velocity.
class Composite final : public Policy {
 public:
  explicit Composite(std::vector<std::unique_ptr<Policy>> parts);
  void set_step(const StepContext& ctx) override;
  std::string name() const override;
  std::string describe() const override;
  std::string report() const override;
  std::vector<StepCacheSeries> measured() const override;
  bool empty() const { return parts_.empty(); }
  const std::vector<std::unique_ptr<Policy>>& parts() const { return parts_; }

  void begin(const Streams& in, Mat probe) override;
  BlockAction before_block(int block, Streams& s) override;
  void after_block(int block, Streams& s) override;
  bool reuse(int block, Sublayer which) override;
  void fetch(int block, Sublayer which, Streams& out) override;
  void store(int block, Sublayer which, const Streams& out) override;
  void end(Streams& s) override;
  bool wants_probe() const override;
  bool run_branch(const StepContext& ctx) override;
  void fill_branch(const StepContext& ctx, const float* cond, float* out, int64_t batch,
                   int64_t tokens, int64_t channels, int64_t h, int64_t w) override;
  void observe_branches(const StepContext& ctx, const float* cond, const float* uncond,
                        int64_t batch, int64_t tokens, int64_t channels, int64_t h,
                        int64_t w) override;
  void observe_output(const StepContext& ctx, const float* v, int64_t count) override;
  bool run_step(const StepContext& ctx) override;
  void fill_velocity(const StepContext& ctx, const float* latents, float* v,
                     int64_t count) override;
  void observe_step(const StepContext& ctx, const float* latents, const float* v,
                    int64_t count) override;

 private:
  std::vector<std::unique_ptr<Policy>> parts_;
  std::vector<int> reused_by_;  // per block x sublayer: which part reuses (-1 none)
  int declined_by_ = -1;        // which part skipped this step's branch
  int step_declined_by_ = -1;   // which part skipped this whole step
};

}  // namespace flowkv::cache
