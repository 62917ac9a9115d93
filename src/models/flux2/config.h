// FLUX.2 transformer configuration (diffusers Flux2Transformer2DModel, config.json fields).
#pragma once

#include <map>
#include <string>
#include <vector>

#include "io/json.h"
#include "io/safetensors.h"

namespace flowkv::flux2 {

struct Config {
  int64_t patch_size = 1;
  int64_t in_channels = 128;
  int64_t out_channels = 0;  // 0: same as in_channels (config null)
  int64_t num_layers = 8;    // double-stream blocks
  int64_t num_single_layers = 48;
  int64_t attention_head_dim = 128;
  int64_t num_attention_heads = 48;
  int64_t joint_attention_dim = 15360;
  int64_t timestep_guidance_channels = 256;
  double mlp_ratio = 3.0;
  std::vector<int64_t> axes_dims_rope = {32, 32, 32, 32};
  double rope_theta = 2000;
  double eps = 1e-6;
  bool guidance_embeds = true;

  int64_t dim() const { return num_attention_heads * attention_head_dim; }
  int64_t mlp_hidden() const { return static_cast<int64_t>(dim() * mlp_ratio); }
  int64_t out_features() const {
    return patch_size * patch_size * (out_channels > 0 ? out_channels : in_channels);
  }
  int64_t num_blocks() const { return num_layers + num_single_layers; }

  // Reads config.json; missing fields take diffusers' defaults. Throws on wrong types or
  // values no model can have.
  static Config from_json(const Json& j, const std::string& source);
  Json to_json() const;
  void validate(const std::string& source) const;
};

// What the tensors themselves say (for single files without config.json, and to check a
// config.json against its weights). Fields the shapes cannot tell keep their defaults.
Config infer_config(const std::map<std::string, TensorInfo>& tensors);

// Fields on which `claimed` disagrees with what the tensors hold, one line each.
std::vector<std::string> config_disagreements(const Config& claimed, const Config& found,
                                              const std::map<std::string, TensorInfo>& tensors);

// "FLUX.2 Klein 9B (or Klein 9B KV: same architecture)" etc., from the config alone.
std::string variant_name(const Config& c);

// Named released shapes ("klein-4b", "klein-9b", "klein-9b-kv", "dev").
bool released_config(const std::string& name, Config* out);

}  // namespace flowkv::flux2
