// Vectorised attention kernels (Highway), driven by ops/cpu/attention.cc.
#pragma once

#include <cstdint>

namespace flowkv::ops::cpu {

// One key source, packed for one (batch element, head): keys transposed in blocks of
// key_block() ([nblocks][hd][Bk], zero-padded), values as [nblocks*Bk][hd] (zero-padded).
struct PackedSource {
  const float* kt = nullptr;
  const float* v = nullptr;
  int64_t len = 0;
  bool causal = false;
  int64_t causal_offset = 0;
  const uint8_t* valid = nullptr;  // this batch element's [len] mask, or nullptr
};

struct AttnKernels {
  int64_t key_block;  // Bk for this instruction set
  int64_t lanes;      // floats per vector; head_dim must be a multiple
  // Packs rows [0, len) of one head's keys (stride in elements; bf16 if is_bf16) into kt / v.
  void (*pack)(const void* k, const void* v, bool is_bf16, int64_t len, int64_t k_stride,
               int64_t v_stride, int64_t hd, float* kt, float* vp);
  // Attention of nq query rows (q0 = index of the first, for causal sources) against the packed
  // sources, written to out. scratch: at least scratch_floats(nq, hd) floats.
  void (*block)(const float* q, int64_t q_stride, int64_t nq, int64_t q0, int64_t hd, float scale,
                const PackedSource* src, int nsrc, float* out, int64_t out_stride, float* scratch);
};

const AttnKernels& attn_kernels();
int64_t attn_scratch_floats(int64_t nq, int64_t hd, int64_t key_block);

}  // namespace flowkv::ops::cpu
