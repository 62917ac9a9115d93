#include "cache/policy.h"

#include <cmath>
#include <cstdlib>
#include <sstream>

#include "flowkv/error.h"

namespace flowkv::cache {

int Streams::index_of(const std::string& name) const {
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i].name == name) return static_cast<int>(i);
  }
  return -1;
}

PolicyOptions PolicyOptions::parse(const std::string& spec) {
  PolicyOptions o;
  std::stringstream in(spec);
  std::string item;
  while (std::getline(in, item, ',')) {
    if (item.empty()) continue;
    const size_t eq = item.find('=');
    FLOWKV_CHECK(eq != std::string::npos && eq > 0, "cache option '", item, "' is not key=value");
    const bool fresh = o.values_.emplace(item.substr(0, eq), item.substr(eq + 1)).second;
    FLOWKV_CHECK(fresh, "cache option ", item.substr(0, eq), " is given twice");
  }
  return o;
}

namespace {
double parse_knob(const std::string& key, const std::string& text) {
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  FLOWKV_CHECK(!text.empty() && *end == 0 && std::isfinite(v), "cache option ", key, "=", text,
               " is not a finite number");
  return v;
}
}  // namespace

double PolicyOptions::num(const std::string& key, double def, KnobRange range) {
  auto it = values_.find(key);
  if (it == values_.end()) return def;
  used_[key] = true;
  const double v = parse_knob(key, it->second);
  FLOWKV_CHECK(v >= range.lo && v <= range.hi, "cache option ", key, "=", it->second,
               " is outside [", range.lo, ", ", range.hi, "]");
  return v;
}

int64_t PolicyOptions::integer(const std::string& key, int64_t def, KnobRange range) {
  const double v = num(key, static_cast<double>(def), range);
  FLOWKV_CHECK(v == std::floor(v), "cache option ", key, " must be an integer");
  return static_cast<int64_t>(v);
}

bool PolicyOptions::flag(const std::string& key, bool def) {
  auto it = values_.find(key);
  if (it == values_.end()) return def;
  used_[key] = true;
  if (it->second == "1" || it->second == "true" || it->second == "on") return true;
  if (it->second == "0" || it->second == "false" || it->second == "off") return false;
  fail("cache option ", key, "=", it->second, " is not true/false");
}

std::string PolicyOptions::str(const std::string& key, const std::string& def) {
  auto it = values_.find(key);
  if (it == values_.end()) return def;
  used_[key] = true;
  return it->second;
}

std::vector<double> PolicyOptions::list(const std::string& key, const std::vector<double>& def) {
  auto it = values_.find(key);
  if (it == values_.end()) return def;
  used_[key] = true;
  std::vector<double> out;
  std::stringstream in(it->second);
  std::string item;
  while (std::getline(in, item, '/')) {  // '/' separates values: ',' separates options
    out.push_back(parse_knob(key, item));
  }
  FLOWKV_CHECK(out.size() <= 100000, "cache option ", key, " lists too many values");
  return out;
}

void PolicyOptions::check_all_used(const std::string& policy) const {
  for (const auto& [k, v] : values_) {
    FLOWKV_CHECK(used_.count(k), "cache policy '", policy, "' has no option '", k, "'");
  }
}

void register_builtin_policies();  // policies/registry.cc: one line per policy

namespace {
std::vector<PolicyInfo>& registry() {
  static std::vector<PolicyInfo> r;
  return r;
}
}  // namespace

void register_policy(PolicyInfo info) {
  registry().push_back(std::move(info));
}

const std::vector<PolicyInfo>& registered_policies() {
  static const bool once = (register_builtin_policies(), true);
  (void)once;
  return registry();
}

std::vector<std::unique_ptr<Policy>> make_policies(const std::vector<std::string>& specs,
                                                   const Topology& topology) {
  std::vector<std::unique_ptr<Policy>> out;
  for (const std::string& spec : specs) {
    const size_t colon = spec.find(':');
    const std::string name = spec.substr(0, colon);
    const PolicyInfo* info = nullptr;
    for (const PolicyInfo& p : registered_policies()) {
      if (p.name == name) info = &p;
    }
    if (!info) {
      std::string names;
      for (const PolicyInfo& p : registered_policies())
        names += (names.empty() ? "" : ", ") + p.name;
      fail("unknown cache policy '", name, "' (known: kv, ", names, ")");
    }
    PolicyOptions o =
        PolicyOptions::parse(colon == std::string::npos ? "" : spec.substr(colon + 1));
    out.push_back(info->make(o, topology));
    o.check_all_used(name);
  }
  return out;
}

// ---------------------------------------------------------------- composite

Composite::Composite(std::vector<std::unique_ptr<Policy>> parts) : parts_(std::move(parts)) {}

void Composite::set_step(const StepContext& ctx) {
  Policy::set_step(ctx);
  for (auto& p : parts_) p->set_step(ctx);
}

std::string Composite::name() const {
  std::string n;
  for (const auto& p : parts_) n += (n.empty() ? "" : "+") + p->name();
  return n.empty() ? "none" : n;
}

std::string Composite::describe() const {
  std::string d;
  for (const auto& p : parts_) d += (d.empty() ? "" : "; ") + p->describe();
  return d;
}

std::string Composite::report() const {
  std::string r;
  for (const auto& p : parts_) r += p->report();
  return r;
}

std::vector<StepCacheSeries> Composite::measured() const {
  std::vector<StepCacheSeries> m;
  for (const auto& p : parts_) {
    std::vector<StepCacheSeries> part = p->measured();
    m.insert(m.end(), part.begin(), part.end());
  }
  return m;
}

void Composite::begin(const Streams& in, Mat probe) {
  reused_by_.clear();
  for (auto& p : parts_) p->begin(in, probe);
}

BlockAction Composite::before_block(int block, Streams& s) {
  BlockAction a = BlockAction::kRun;
  for (auto& p : parts_) {
    if (p->before_block(block, s) == BlockAction::kSkip) a = BlockAction::kSkip;
  }
  return a;
}

void Composite::after_block(int block, Streams& s) {
  for (auto& p : parts_) p->after_block(block, s);
}

bool Composite::reuse(int block, Sublayer which) {
  const size_t key = static_cast<size_t>(2 * block + (which == Sublayer::kMlp ? 1 : 0));
  if (reused_by_.size() <= key) reused_by_.resize(key + 1, -1);
  reused_by_[key] = -1;
  for (size_t i = 0; i < parts_.size(); ++i) {
    if (parts_[i]->reuse(block, which) && reused_by_[key] < 0)
      reused_by_[key] = static_cast<int>(i);
  }
  return reused_by_[key] >= 0;
}

void Composite::fetch(int block, Sublayer which, Streams& out) {
  const size_t key = static_cast<size_t>(2 * block + (which == Sublayer::kMlp ? 1 : 0));
  parts_[static_cast<size_t>(reused_by_.at(key))]->fetch(block, which, out);
}

void Composite::store(int block, Sublayer which, const Streams& out) {
  for (auto& p : parts_) p->store(block, which, out);
}

void Composite::end(Streams& s) {
  for (auto& p : parts_) p->end(s);
}

bool Composite::wants_probe() const {
  for (const auto& p : parts_) {
    if (p->wants_probe()) return true;
  }
  return false;
}

bool Composite::run_branch(const StepContext& ctx) {
  declined_by_ = -1;
  for (size_t i = 0; i < parts_.size(); ++i) {
    if (!parts_[i]->run_branch(ctx)) {
      declined_by_ = static_cast<int>(i);
      return false;
    }
  }
  return true;
}

void Composite::fill_branch(const StepContext& ctx, const float* cond, float* out, int64_t batch,
                            int64_t tokens, int64_t channels, int64_t h, int64_t w) {
  FLOWKV_CHECK(declined_by_ >= 0, "fill_branch without a skipped branch");
  parts_[static_cast<size_t>(declined_by_)]->fill_branch(ctx, cond, out, batch, tokens, channels, h,
                                                         w);
}

void Composite::observe_branches(const StepContext& ctx, const float* cond, const float* uncond,
                                 int64_t batch, int64_t tokens, int64_t channels, int64_t h,
                                 int64_t w) {
  for (auto& p : parts_) p->observe_branches(ctx, cond, uncond, batch, tokens, channels, h, w);
}

void Composite::observe_output(const StepContext& ctx, const float* v, int64_t count) {
  for (auto& p : parts_) p->observe_output(ctx, v, count);
}

bool Composite::run_step(const StepContext& ctx) {
  step_declined_by_ = -1;
  for (size_t i = 0; i < parts_.size(); ++i) {
    if (!parts_[i]->run_step(ctx) && step_declined_by_ < 0) step_declined_by_ = static_cast<int>(i);
  }
  return step_declined_by_ < 0;
}

void Composite::fill_velocity(const StepContext& ctx, const float* latents, float* v,
                              int64_t count) {
  FLOWKV_CHECK(step_declined_by_ >= 0, "fill_velocity without a skipped step");
  parts_[static_cast<size_t>(step_declined_by_)]->fill_velocity(ctx, latents, v, count);
}

void Composite::observe_step(const StepContext& ctx, const float* latents, const float* v,
                             int64_t count) {
  for (auto& p : parts_) p->observe_step(ctx, latents, v, count);
}

}  // namespace flowkv::cache
