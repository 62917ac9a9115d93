// FLUX.2 weight names: the one table (diffusers names and shapes), and the original BFL
// single-file layout mapped onto it through a data table.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "io/checkpoint.h"
#include "models/flux2/config.h"

namespace flowkv::flux2 {

enum class GlobalW {
  kXEmbedder,
  kContextEmbedder,
  kTimeLinear1,
  kTimeLinear2,
  kGuidanceLinear1,
  kGuidanceLinear2,
  kModImg,
  kModTxt,
  kModSingle,
  kNormOut,
  kProjOut,
  kCount
};
enum class DoubleW {
  kToQ,
  kToK,
  kToV,
  kNormQ,
  kNormK,
  kToOut,
  kAddQ,
  kAddK,
  kAddV,
  kNormAddedQ,
  kNormAddedK,
  kToAddOut,
  kFfIn,
  kFfOut,
  kFfContextIn,
  kFfContextOut,
  kCount
};
enum class SingleW { kQkvMlp, kNormQ, kNormK, kToOut, kCount };

std::string weight_name(GlobalW w);
std::string weight_name(int64_t block, DoubleW w);
std::string weight_name(int64_t block, SingleW w);

// Every tensor a checkpoint of this config must hold, with its shape.
std::vector<ExpectedTensor> weight_table(const Config& c);
int64_t parameter_count(const Config& c);

// A checkpoint's tensors under diffusers names, whichever layout the files use.
class WeightSource {
 public:
  // Reads headers only (maps nothing); `bfl` tells whether the files use the BFL layout.
  explicit WeightSource(CheckpointScan scan);
  // Tensors already in memory, under diffusers names (built-in models, tests).
  explicit WeightSource(std::map<std::string, Tensor> tensors);
  const CheckpointScan& scan() const { return scan_; }
  bool bfl_layout() const { return bfl_; }
  // Tensors by diffusers name (shapes as diffusers has them: BFL fused qkv already split).
  const std::map<std::string, TensorInfo>& tensors() const { return tensors_; }
  // BFL keys the mapping table does not know.
  const std::vector<std::string>& unmapped() const { return unmapped_; }

  // Maps the files (first call) and returns the tensor, converting BFL layouts.
  Tensor get(const std::string& diffusers_name) const;

 private:
  struct Origin {
    std::string name;  // key in the files
    int part = -1;     // fused qkv: which third of the rows
    bool swap_halves = false;
  };
  CheckpointScan scan_;
  bool bfl_ = false;
  std::map<std::string, TensorInfo> tensors_;
  std::map<std::string, Origin> origin_;
  std::vector<std::string> unmapped_;
  mutable std::unique_ptr<CheckpointReader> reader_;
  std::map<std::string, Tensor> memory_;
};

}  // namespace flowkv::flux2
