// Scalar reference implementations for every supported weight type: dequantize a row,
// dot a row with an F32 vector, and (where the writer needs it) quantize a row.
// These are the ground truth that every SIMD kernel is tested against.
// Block layouts: docs/architecture.md, "Weight types and block layouts".
#pragma once

#include <cstddef>
#include <cstdint>

#include "tensor/dtype.h"

namespace step35 {

// Block structs, packed exactly as stored in GGUF (little-endian fields).
#pragma pack(push, 1)
struct BlockQ8_0 { uint16_t d; int8_t qs[32]; };
struct BlockQ4_0 { uint16_t d; uint8_t qs[16]; };
struct BlockQ4_1 { uint16_t d; uint16_t m; uint8_t qs[16]; };
struct BlockQ5_0 { uint16_t d; uint8_t qh[4]; uint8_t qs[16]; };
struct BlockQ5_1 { uint16_t d; uint16_t m; uint8_t qh[4]; uint8_t qs[16]; };
struct BlockMXFP4 { uint8_t e; uint8_t qs[16]; };
struct BlockQ2_K { uint8_t scales[16]; uint8_t qs[64]; uint16_t d; uint16_t dmin; };
struct BlockQ3_K { uint8_t hmask[32]; uint8_t qs[64]; uint8_t scales[12]; uint16_t d; };
struct BlockQ4_K { uint16_t d; uint16_t dmin; uint8_t scales[12]; uint8_t qs[128]; };
struct BlockQ5_K { uint16_t d; uint16_t dmin; uint8_t scales[12]; uint8_t qh[32]; uint8_t qs[128]; };
struct BlockQ6_K { uint8_t ql[128]; uint8_t qh[64]; int8_t scales[16]; uint16_t d; };
// The IQ types: codebook indices into the grids of tensor/iq_grids.h, sign bits and
// sub-block scales (how each field is read: tensor/quants_iq.cpp). IQ1_M has no d field:
// its F16 super-scale is spread over the top nibbles of the four 16-bit words of scales.
struct BlockIQ2_XXS { uint16_t d; uint16_t qs[32]; };
struct BlockIQ2_XS { uint16_t d; uint16_t qs[32]; uint8_t scales[8]; };
struct BlockIQ2_S { uint16_t d; uint8_t qs[64]; uint8_t qh[8]; uint8_t scales[8]; };  // qs: 32 indices, 32 sign bytes
struct BlockIQ3_XXS { uint16_t d; uint8_t qs[96]; };  // 64 indices, then 8 words of signs + scale
struct BlockIQ3_S { uint16_t d; uint8_t qs[64]; uint8_t qh[8]; uint8_t signs[32]; uint8_t scales[4]; };
struct BlockIQ1_S { uint16_t d; uint8_t qs[32]; uint16_t qh[8]; };
struct BlockIQ1_M { uint8_t qs[32]; uint8_t qh[16]; uint8_t scales[8]; };
struct BlockIQ4_NL { uint16_t d; uint8_t qs[16]; };
struct BlockIQ4_XS { uint16_t d; uint16_t scales_h; uint8_t scales_l[4]; uint8_t qs[128]; };
// Ternary types: TQ1_0 packs 5 trits per byte (base 3, most significant first) in qs and
// 4 per byte in qh; TQ2_0 stores each value + 1 in 2 bits.
struct BlockTQ1_0 { uint8_t qs[48]; uint8_t qh[4]; uint16_t d; };
struct BlockTQ2_0 { uint8_t qs[64]; uint16_t d; };
#pragma pack(pop)
static_assert(sizeof(BlockQ8_0) == 34 && sizeof(BlockQ4_0) == 18 && sizeof(BlockQ4_1) == 20);
static_assert(sizeof(BlockQ5_0) == 22 && sizeof(BlockQ5_1) == 24 && sizeof(BlockMXFP4) == 17);
static_assert(sizeof(BlockQ2_K) == 84 && sizeof(BlockQ3_K) == 110 && sizeof(BlockQ4_K) == 144);
static_assert(sizeof(BlockQ5_K) == 176 && sizeof(BlockQ6_K) == 210);
static_assert(sizeof(BlockIQ2_XXS) == 66 && sizeof(BlockIQ2_XS) == 74 && sizeof(BlockIQ2_S) == 82);
static_assert(sizeof(BlockIQ3_XXS) == 98 && sizeof(BlockIQ3_S) == 110 && sizeof(BlockIQ1_S) == 50);
static_assert(sizeof(BlockIQ1_M) == 56 && sizeof(BlockIQ4_NL) == 18 && sizeof(BlockIQ4_XS) == 136);
static_assert(sizeof(BlockTQ1_0) == 54 && sizeof(BlockTQ2_0) == 66);

// Dequantizes n elements (n a multiple of the type's block size) starting at `src`.
// `src`/`w` need no alignment. A wrong n or an unsupported t throws std::invalid_argument
// (checked once per row).
void dequantize_row_ref(DType t, const void* src, float* dst, int64_t n);

// Σ_i w[i]·x[i] over n elements, w in type t, x in F32, accumulated in F32 per block and
// summed in double across blocks (the reference for "exact weights, F32 activations").
float dot_row_ref(DType t, const void* w, const float* x, int64_t n);

// Quantizes n F32 values into type t. Supported: F32, F16, BF16, Q8_0, Q4_0, Q4_1,
// Q5_0, Q5_1 (round-to-nearest encoders as ggml's reference ones), Q2_K..Q6_K
// (ggml's reference searches, tensor/quants_kquant_encode.h) and IQ4_NL / IQ4_XS (the
// non-linear level search, tensor/quants_iq.h); all bit-exact with llama-quantize without
// an importance matrix. Returns false for the types without an encoder (MXFP4, the other
// IQ types, which llama-quantize only writes with an importance matrix, and TQ1_0/TQ2_0).
bool quantize_row_ref(DType t, const float* src, void* dst, int64_t n);

// Q4_K / Q5_K: the 6-bit scale and min of sub-block b (0..7) from a block's 12 packed bytes.
void k4_scale_min(const uint8_t* s, int b, int* sc, int* m);

}  // namespace step35
