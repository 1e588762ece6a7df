// Reference encoders for the K-quants (super-blocks of 256 elements): the same search over
// scales and mins as ggml's reference quantizers without an importance matrix, so the bytes
// equal what llama-quantize writes. Reached through quantize_row_ref (tensor/quants.h);
// declared here for the tests and for anyone who wants one type without the dispatch.
// Every function takes n = a multiple of 256 (not checked here: quantize_row_ref checks it).
#pragma once

#include <cstdint>

#include "tensor/dtype.h"

namespace step35 {

void quantize_row_q2_k_ref(const float* src, void* dst, int64_t n);
void quantize_row_q3_k_ref(const float* src, void* dst, int64_t n);
void quantize_row_q4_k_ref(const float* src, void* dst, int64_t n);
void quantize_row_q5_k_ref(const float* src, void* dst, int64_t n);
void quantize_row_q6_k_ref(const float* src, void* dst, int64_t n);

// The same bytes as the _ref encoders above, their sub-block searches run several sub-blocks
// side by side (the type traits table's quantize_fast column).
void quantize_row_q2_k_fast(const float* src, void* dst, int64_t n);
void quantize_row_q4_k_fast(const float* src, void* dst, int64_t n);
void quantize_row_q5_k_fast(const float* src, void* dst, int64_t n);
void quantize_row_q6_k_fast(const float* src, void* dst, int64_t n);

// Same bytes as quantize_row_ref for every type, faster for Q2_K, Q4_K, Q5_K and Q6_K: their
// sub-block searches run several sub-blocks side by side (vectorisable), each performing the
// scalar search's exact float operations; and for IQ4_NL and IQ4_XS, whose searches use the
// ISA level's twins (tensor/quants_iq.h). Other types and bad lengths go to quantize_row_ref.
bool quantize_row_fast(DType t, const float* src, void* dst, int64_t n);

}  // namespace step35
