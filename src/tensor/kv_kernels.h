// Kernels of attention over a typed KV cache: storing a key / value row into a cache
// block, and the three steps of one block of the streaming (online-softmax) attention:
// scores of query rows against the block's keys, exp of the shifted scores, and the
// weighted sum of the block's values. Each has a scalar reference (kv_kernels_ref.cpp)
// and SIMD twins (kv_kernels_x86.inc), chosen with the other kernels (kernels.h: active_isa).
//
// Cache types: F32, F16, BF16, Q8_0, Q4_0. A head's keys (or values) of one cache block of
// `bs` positions take bs * row_bytes(type, d) bytes, as in llama.cpp's cache, and the
// values each position holds are exactly llama.cpp's: F16 / BF16 rounded to nearest even,
// Q8_0 with the encoder ggml's CPU backend uses to write the cache (scale amax/127 in F16,
// x * 127/amax rounded half to even), Q4_0 with ggml's reference encoder. Only the order
// inside a block is this engine's own:
//  * keys of F32/F16/BF16: dimension-major ([d][bs]), so SIMD lanes run over positions and
//    a block's scores need no horizontal sums;
//  * keys of Q8_0/Q4_0: the F16 scales as [d/32][bs], then the integers as [d/4][bs][4]
//    (Q8_0: q + 128 as unsigned bytes) or [d/8][bs][4] bytes of two nibbles (Q4_0: low
//    nibbles dimensions 8i..8i+3, high nibbles 8i+4..8i+7), so one vector holds 4
//    dimensions of 16 positions for the 8-bit dot product instructions;
//  * values: position-major ([bs][d]) rows, Q8_0/Q4_0 rows as ggml blocks.
//
// How a query meets a key type (ggml's flash attention): F32 and F16 keys against the F32
// query (ggml's tiled path converts the keys to F32), BF16 keys against the query rounded
// to BF16, Q8_0 and Q4_0 keys against the query rounded to Q8_0 blocks (ggml's
// vec_dot_type for those types, with the same encoder). Values are summed in F32.
//
// Invariance: each (query row, key) score and each row's sums go through the same float
// steps whatever n_q, n_k and the other rows of a call, so grouping query rows never
// changes a result.
#pragma once

#include <cstddef>
#include <cstdint>

#include "tensor/dtype.h"

namespace step35::kernels {

// Whether t is a KV cache type.
bool kv_type_supported(DType t);
// Whether the cache stores t as integer blocks (Q8_0, Q4_0).
bool kv_type_quantized(DType t);

// Writes one head's key row x[0..d) at position `slot` of a head block of bs positions
// (bs * row_bytes(t, d) bytes). d must be a multiple of t's block size.
void kv_store_key(DType t, const float* x, int64_t d, uint8_t* block, int32_t bs, int32_t slot);
// Writes one head's value row x[0..d) at position `slot` of a head block.
void kv_store_value(DType t, const float* x, int64_t d, uint8_t* block, int32_t bs, int32_t slot);
// The stored rows back as F32 (tests, diagnostics).
void kv_load_key(DType t, const uint8_t* block, int32_t bs, int32_t slot, int64_t d, float* out);
void kv_load_value(DType t, const uint8_t* block, int32_t bs, int32_t slot, int64_t d, float* out);

// A query row converted for keys of type t: attn_query_bytes(t, d) bytes (a multiple of 8).
size_t attn_query_bytes(DType t, int64_t d);
void attn_convert_query(DType t, const float* q, int64_t d, uint8_t* dst);
// The values a converted query row multiplies the keys with, as F32 (the query as the key
// type rounds it): for references and tests, which need not know the row's layout.
void attn_query_values(DType t, const uint8_t* converted, int64_t d, float* out);

// s[r*s_stride + j] = scale * (q_r . k_j) for the n_q converted query rows q_r = q +
// r*q_stride and the keys j < n_k (<= bs) of one head block of type t.
// (AttnScoresFn: the signature each ISA level's kernel and the scalar reference share.)
using AttnScoresFn = void(DType t, const uint8_t* q, size_t q_stride, int64_t n_q, const uint8_t* block, int32_t bs,
                          int32_t n_k, int64_t d, float scale, float* s, int64_t s_stride);
AttnScoresFn attn_scores;

// s[j] = exp(s[j] - m) for j < n, and 0 where s[j] is -infinity (a masked key); returns
// the sum of the n results (summed in a fixed order for a given n).
float attn_exp_sum(float* s, int64_t n, float m);

// The largest of s[0..n) (-infinity for n = 0); NaNs are skipped.
float attn_row_max(const float* s, int64_t n);

// acc[r*acc_stride + c] += sum_j p[r*p_stride + j] * v_j[c] for the n_q rows, c < d and the
// values j < n_k of one head block of type t, summed over j in order for each (r, c).
// A zero weight adds nothing (the values of a block are always finite).
void attn_accumulate(DType t, const float* p, int64_t p_stride, int64_t n_q, const uint8_t* block, int32_t n_k,
                     int64_t d, float* acc, int64_t acc_stride);

// The other block kernels' signatures, for each ISA level's table and the scalar
// references (tensor/kernels_impl.h).
using AttnExpSumFn = decltype(attn_exp_sum);
using AttnRowMaxFn = decltype(attn_row_max);
using AttnAccumulateFn = decltype(attn_accumulate);

// In-place fast Walsh-Hadamard transform of each n-element chunk of x[0..len) (n a power of
// two dividing len), scaled by 1/sqrt(n): ggml's GGML_HINT_SRC0_IS_HADAMARD product, which
// llama.cpp applies to queries and keys (values and the attention output) around a
// quantized cache. The transform is its own inverse. Same bits on every ISA level.
void hadamard_rows(float* x, int64_t len, int64_t n);

}  // namespace step35::kernels
