// Placeholder definitions of MoELayer until the layer (moe.cc, branch wip/nucleus-moe) is
// merged: loading a checkpoint with an MoE block fails with an Error. Deleted by that merge.
#include "flowkv/error.h"
#include "models/nucleus/moe.h"

namespace flowkv::nucleus {

MoELayer MoELayer::from_tensors(const std::function<Tensor(const std::string&)>&, const MoEConfig&,
                                ExpertLayout, ops::Compute, bool) {
  fail("NucleusMoE-Image: the mixture-of-experts layer is not built into this flowkv yet");
}

const MoEConfig& MoELayer::config() const {
  fail("NucleusMoE-Image: no mixture-of-experts layer");
}

int64_t MoELayer::bytes() const {
  return 0;
}

void MoELayer::forward(const ExecContext&, int64_t, int64_t, const float*, const float*,
                       const float*, float*) const {
  fail("NucleusMoE-Image: the mixture-of-experts layer is not built into this flowkv yet");
}

MoELayer::Routing MoELayer::route(const ExecContext&, int64_t, int64_t, const float*,
                                  const float*) const {
  fail("NucleusMoE-Image: the mixture-of-experts layer is not built into this flowkv yet");
}

}  // namespace flowkv::nucleus
