// The GEMM behind Linear's narrow weights: C[M, n0:n1] = A[M, K] · Bᵀ, where B's rows (the
// weight rows, [N, K]) come from a source that widens them to f32 block by block (bf16, f16,
// dequantized GGUF blocks). Blocked as BLIS does: a K block of B is widened and packed once per
// call into slivers the micro-kernel streams (cache-resident), and a
// 6-row register-tiled micro-kernel multiplies them, reading A in place, on the widest vectors the
// CPU has (detected at run time).
//
// Every output element is summed in a fixed order fixed by K alone (k blocks of kKBlock, each
// an FMA chain, added in order), so results do not depend on the thread count or the tile.
#pragma once

#include <cstdint>

namespace flowkv::ops {

// Widens weight rows [j0, j0 + count), columns [k0, k0 + kc), into out[count][kc].
struct RowSource {
  void (*widen)(const void* self, int64_t j0, int64_t count, int64_t k0, int64_t kc,
                float* out) = nullptr;
  const void* self = nullptr;
};

// K block: every weight type's block (32 or 256 values) divides it.
constexpr int64_t kGemmKBlock = 256;

// C[r][j] = sum_k A[r][k] * B[j][k] for rows [0, m) and columns [n0, n1); C points at column 0.
void gemm_rows_source(const float* a, int64_t lda, int64_t m, int64_t k, const RowSource& b,
                      int64_t n0, int64_t n1, float* c, int64_t ldc);

// The same product by plain loops in the same summation order (the scalar reference for tests).
void gemm_rows_source_reference(const float* a, int64_t lda, int64_t m, int64_t k,
                                const RowSource& b, int64_t n0, int64_t n1, float* c, int64_t ldc);

}  // namespace flowkv::ops
