// Where one forward's time went.
#pragma once

namespace flowkv {

struct ForwardProfile {
  double seconds = 0;            // the whole forward
  double linear_seconds = 0;     // every linear layer
  double linear_flops = 0;       // 2*M*N*K summed
  double attention_seconds = 0;  // every attention call
  double attention_flops = 0;    // 4*head_dim per allowed query-key pair, summed
};

}  // namespace flowkv
