// The IQ and TQ quant types in integer form. One decoder per type turns a 256-element
// super-block into its signed codebook values and integer sub-block multipliers; the scalar
// dequantizer (tensor/quants.cpp) and the scalar dot products against Q8_K activations
// (tensor/kernels_ref.cpp) are both written on top of it, so they cannot disagree about what
// a block holds. SIMD twins of the dot products are tested against those.
//
// Block layouts and codebooks: ggml's (ggml-common.h, llama.cpp de3ff81); the float steps of
// the dequantizers are ggml's dequantize_row_<type> operation for operation (the fixtures'
// deqf32 goldens and tests/test_quants.cpp hold them to that bit for bit).
//
// IQ4_NL is the one 32-element type: it dequantizes and multiplies like Q4_0 with a
// non-uniform level table, so it goes through the 32-block code paths instead.
#pragma once

#include <cstdint>

#include "tensor/dtype.h"

namespace step35::iq {

// One super-block of 256 elements.
struct BlockInts {
  float d = 0.0f;         // the super-block scale (stored as F16)
  int group = 32;         // elements per sub-block scale: 16, 32, or 256 (TQ types: one scale)
  int16_t scale[16] = {};  // integer multiplier of each sub-block in the dot product
  float dl[16] = {};       // the float sub-block scale ggml's dequantizer computes from it
  bool has_delta = false;  // IQ1_S / IQ1_M: each 8 values are shifted by ±kIq1Delta
  int8_t delta[32] = {};   // ... by +1 or -1 times kIq1Delta (8 values each)
  int8_t q[256] = {};      // signed codebook value of every element
};

// IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M, IQ4_XS, TQ1_0, TQ2_0.
bool is_super_block_type(DType t);

// Decodes the block at `block` (type t, 256 elements, dtype_info(t).block_bytes bytes; any
// alignment). Every bit pattern is a valid block: grid indices are at most as wide as the
// grids, so no block, however corrupt, reads outside them.
void decode(DType t, const uint8_t* block, BlockInts* out);

// The decoders decode() picks through the type traits table (tensor/type_traits.h).
void decode_iq2_xxs(const uint8_t* block, BlockInts* out);
void decode_iq2_xs(const uint8_t* block, BlockInts* out);
void decode_iq2_s(const uint8_t* block, BlockInts* out);
void decode_iq3_xxs(const uint8_t* block, BlockInts* out);
void decode_iq3_s(const uint8_t* block, BlockInts* out);
void decode_iq1_s(const uint8_t* block, BlockInts* out);
void decode_iq1_m(const uint8_t* block, BlockInts* out);
void decode_iq4_xs(const uint8_t* block, BlockInts* out);
void decode_tq1_0(const uint8_t* block, BlockInts* out);
void decode_tq2_0(const uint8_t* block, BlockInts* out);

// Dequantizes a decoded block into y[256]: y = dl[g]·q, or dl[g]·(q ± kIq1Delta) for IQ1_*.
void dequantize(const BlockInts& b, float* y);

// The factor ggml applies once to a finished row sum (IQ2_*: 1/8, IQ3_XXS: 1/4, else 1):
// those types' integer multipliers are 2s+1 where the grid needs (2s+1)/8 or /4.
float dot_row_factor(DType t);

// IQ4_NL (blocks of 32) and IQ4_XS (256: eight 32-element sub-blocks with 6-bit scales under
// an F16 super-scale): ggml's search for the scale that best fits the non-uniform levels,
// weighted by x², 15 trial scales per block; the bytes llama-quantize writes without an
// importance matrix. n must be a multiple of 32 (IQ4_NL) or 256 (IQ4_XS).
void quantize_row_iq4_nl(const float* x, void* dst, int64_t n);
void quantize_row_iq4_xs(const float* x, void* dst, int64_t n);
// The encoders' two searches, scalar (their ISA twins: kernels::IsaKernels::iq4_scales and
// iq4_pack_levels): the best scale d[s] of each of n_sub 32-value sub-blocks (0 for one
// whose largest |x| is below kIq4ZeroGroupMax, as in ggml), and the level codes of 32
// values at inverse scale id (the nearest level, ties to the upper one), two per byte:
// value j in the low nibble of byte j, value 16 + j in its high nibble.
void iq4_scales_ref(const float* x, int64_t n_sub, float* d);
void iq4_pack_levels_ref(const float* x, float id, uint8_t* qs);
inline constexpr float kIq4ZeroGroupMax = 1e-15f;
// The same bytes, with the searches of the ISA level in use where it has them (16 trial
// scales side by side in one vector: ~7x faster under AVX-512); quantize_row_fast's.
void quantize_row_iq4_nl_fast(const float* x, void* dst, int64_t n);
void quantize_row_iq4_xs_fast(const float* x, void* dst, int64_t n);

}  // namespace step35::iq
