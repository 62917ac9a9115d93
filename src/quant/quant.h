// ggml's block-quantized formats (the types GGUF files store): conversion of one row to and
// from f32. A row is `n` consecutive elements, n a whole number of the type's blocks
// (dtype_block); rows of a tensor are independent, so a GEMM widens one weight panel at a time.
//
// The scalar reference follows ggml-quants.c operation by operation (same products, same order,
// no fused multiply-add), so its output is bit-identical to ggml's dequantize_row_* and to the
// gguf Python package's numpy dequantizers; quantize_row follows ggml's quantize_row_*_ref.
#pragma once

#include <cstdint>

#include "flowkv/dtype.h"

namespace flowkv::quant {

// Widens n elements of type t at src to f32. The fastest path this CPU has (AVX2/AVX-512 via
// Highway for every type but F32, which is a copy), bit-identical to dequantize_row_ref.
// src needs no alignment; rows of a [rows, cols] tensor are dtype_bytes(t, cols) bytes apart,
// and a part of a row starting at a block boundary (element k, k % dtype_block(t) == 0, at byte
// dtype_bytes(t, k)) dequantizes on its own, so a GEMM may widen a K-slice of a panel. Fails
// (flowkv::Error) when n is negative or not whole blocks.
void dequantize_row(DType t, const void* src, float* dst, int64_t n);

// The scalar reference of dequantize_row.
void dequantize_row_ref(DType t, const void* src, float* dst, int64_t n);

// Quantizes n f32 elements into dtype_bytes(t, n) bytes at dst, as ggml's reference quantizers
// (quantize_row_*_ref: round-to-nearest-even for F16/BF16; make_qkx2_quants for Q4_K/Q5_K,
// make_qx_quants for Q6_K). Fails when n is not whole blocks or a value is not finite (ggml's
// casts of NaN/inf are undefined behaviour).
void quantize_row(DType t, const float* src, void* dst, int64_t n);

// Name of the instruction set dequantize_row uses on this CPU ("AVX2", "AVX3", "SSE4", ...).
const char* dequantize_target_name();

}  // namespace flowkv::quant
