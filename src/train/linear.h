// Matrix products of training on F32 activations: the forward product of any stored
// weight type (on the engine's kernels, or exactly on weights dequantized a block of rows
// at a time), the product with the transposed matrix that carries a gradient back to the
// input, and the outer-product sums that make the gradient of a trained F32 matrix (both
// on kernels::gemm_acc_f32; frozen weights are never dequantized as a whole matrix).
//
// Layout: a matrix W {n_in, n_out} is n_out rows of n_in values (GGUF order) and maps an
// input row x (n_in) to y[o] = W[o] · x. Activations are row-major, one row per token.
#pragma once

#include <cstdint>

#include "tensor/kernels.h"
#include "tensor/tensor.h"

namespace step35 {
class ThreadPool;
}

namespace step35::train {

// Below this many (roughly) multiply-adds a training loop runs on the calling thread:
// waking the pool costs more than it saves, and much more when other processes hold the
// cores.
constexpr double kMinParallelWork = 1 << 20;

// y[t*ldy + o] = W[o] · x[t*ldx + ...] for o < n_out, t < n_tok. At Precision::Exact
// every element is the same float kernels::matmul computes at Exact (the dequantized row
// dotted with the token row by kernels::dot_f32), so the training forward reproduces
// `step35 eval --exact` bit for bit wherever both multiply the same rows. At
// Precision::Native the token rows are first rounded to the weight type's activation
// format and the engine's integer kernels run (what `step35 eval` computes); F32 weights
// give the same floats either way. `pool` may be null (then single-threaded; use that
// inside a parallel section).
void linear_forward(const WeightMatrix& w, const float* x, int64_t ldx, int64_t n_tok, float* y, int64_t ldy,
                    ThreadPool* pool, Precision precision = Precision::Exact);

// dx[t*ldx + i] += Σ_o dy[t*ldy + o] · W[o][i]: the gradient of the input. Each dx row
// sums over o in ascending order whatever the thread split, so results do not depend on
// the thread count.
void linear_backward_input(const WeightMatrix& w, const float* dy, int64_t ldy, int64_t n_tok, float* dx,
                           int64_t ldx, ThreadPool* pool);

// g[o*n_in + i] += Σ_t dy[t*ldy + o] · x[t*ldx + i]: the gradient of a trained matrix,
// summed over tokens in order.
void linear_backward_weight(const float* x, int64_t ldx, const float* dy, int64_t ldy, int64_t n_tok, int64_t n_in,
                            int64_t n_out, float* g, ThreadPool* pool);

// A WeightMatrix view of an F32 buffer of n_out rows of n_in values (trained parameters
// go through the same products as the frozen weights).
WeightMatrix f32_matrix(const float* data, int64_t n_in, int64_t n_out);

}  // namespace step35::train
