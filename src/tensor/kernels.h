// Compute kernels of the forward pass: activation conversion, matrix products over weights
// stored in any supported type, and the vector helpers attention uses. Each kernel has a
// scalar reference (kernels_ref.cpp) and SIMD versions at the x86 levels below (one build of
// kernels_x86.inc per level, each with the instructions of its level only), chosen once at
// run time from CPUID; docs/kernels.md has the table of levels, CPUs and instructions.
//
// Two precisions (the model picks one per run):
//  * Precision::Native — what llama.cpp's CPU backend computes: the activation row is
//    first rounded to the format the weight type's dot product consumes (act_type()):
//    Q8_K blocks for K-quants, Q8_0 blocks for Q4_0/Q5_0/Q8_0/MXFP4, Q8_1 blocks for
//    Q4_1/Q5_1, F16 for F16 weights, BF16 for BF16 weights, F32 for F32 weights. The
//    rounding reproduces ggml's bit for bit (same scale, same rounding), so the integer
//    dot products are exactly ggml's; only float summation order may differ.
//  * Precision::Exact — activations stay F32 and weights are dequantized on the fly:
//    the exact stored weights times F32 activations (what the fixtures' deqf32 goldens hold).
//
// Invariance contract (relied on by batching, MTP verification and the tests): the value
// written for one (weight row, token) pair is bitwise the same whatever o_begin/o_end,
// n_tok, the token index list, the other tokens in the call, the thread count, and the
// ISA level *within one build and CPU*. (Different ISA levels may differ in float
// summation order; each is tested against the scalar reference within tolerance.)
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "tensor/dtype.h"
#include "tensor/tensor.h"
#include "tensor/type_traits.h"

namespace step35 {

enum class Precision : uint8_t { Native, Exact };

namespace kernels {

// The levels, lowest first; each needs the features of the one before it, except that
// avx512 builds on avx2 (it does not need AVX-VNNI, which came to CPUs after AVX512-VNNI):
//   scalar       plain C++ (any x86-64, any other CPU)
//   avx2         AVX2 + FMA + F16C (Haswell, Zen 1-3)
//   avx2-vnni    + AVX-VNNI, the VEX-encoded 256-bit vpdpbusd (Alder Lake and later, Zen 5)
//   avx512       avx2 + AVX-512 F/BW/VL/DQ (Skylake-SP, Cascade Lake without VNNI use)
//   avx512-vnni  + AVX512-VNNI (Cascade Lake, Ice Lake, Tiger Lake)
//   avx512-bf16  + AVX512-BF16 (Cooper Lake, Sapphire Rapids, Zen 4/5)
// Integer dot products are exact at every level (vpdpbusd where the level has it, widening
// multiply-adds where it does not), so they give the same bits everywhere.
enum class Isa : uint8_t { Scalar = 0, Avx2 = 1, Avx2Vnni = 2, Avx512 = 3, Avx512Vnni = 4, Avx512Bf16 = 5 };
constexpr Isa kAllIsas[] = {Isa::Scalar, Isa::Avx2, Isa::Avx2Vnni, Isa::Avx512, Isa::Avx512Vnni, Isa::Avx512Bf16};
const char* isa_name(Isa isa);
// The level named `name` ("avx512-vnni"); throws std::invalid_argument listing the names.
Isa isa_from_name(const std::string& name);
// The CPU features `isa` needs that this CPU (or its OS) lacks, space-separated; "" when
// it can run it.
std::string missing_features(Isa isa);
// Every ISA level this CPU can run (Scalar always), lowest first.
std::vector<Isa> available_isas();
// The level in use: the best available, unless STEP35_ISA names one (read once; a level
// this CPU cannot run is an error naming the missing features, never a silent fallback) or
// force_isa() says otherwise.
Isa active_isa();
// For tests and benchmarks: switch every kernel to `isa` (must be available). Not
// thread-safe against concurrent kernel calls.
void force_isa(Isa isa);
// One line for logs: "avx512-bf16 (avx2 fma f16c avx-vnni avx512f avx512bw avx512vl ...)".
std::string cpu_summary();

// ---------------------------------------------------------------------------------------
// Activations

// Internal activation formats: ActType (tensor/type_traits.h, where each weight type's row
// names the one its native dot product consumes).
const char* act_type_name(ActType t);

// The activation format matrix products with `weight` consume at precision p
// (Exact: always F32).
ActType act_type(DType weight, Precision p);
// Bytes of one converted row of n elements (n a multiple of the format's block size:
// 32 for Q8_0/Q8_1, 256 for Q8_K, 1 otherwise). Rows are padded to 64 bytes.
size_t act_row_bytes(ActType t, int64_t n);

// Converts n_rows rows of n floats (row r at x + r*ld_x) into `t`, row r at
// dst + r*act_row_bytes(t, n). Bit-identical to ggml's conversion for that format.
void convert_activations(ActType t, const float* x, int64_t n_rows, int64_t n, int64_t ld_x,
                         uint8_t* dst);

// Fused producers (save a pass over the activations):
// RMS(x; w) per row (sum of squares in F32 per ggml's order is not required; the result
// equals rms_norm_row() followed by convert_activations), written as `t`.
void rms_norm_convert(ActType t, const float* x, const float* w, float eps, int64_t n_rows,
                      int64_t n, int64_t ld_x, uint8_t* dst, float* normed /* optional F32 copy */);
// SwiGLU with the step35 clamp (limit <= 1e-6: none) of gate/up rows, written as `t`
// (the input of the down projection).
void swiglu_convert(ActType t, const float* gate, const float* up, int64_t ld, float limit,
                    int64_t n_rows, int64_t n, uint8_t* dst);

// ---------------------------------------------------------------------------------------
// Matrix products

// A batch of activation rows in one format, all of length w.n_in.
struct ActRows {
  ActType type = ActType::F32;
  const uint8_t* data = nullptr;
  size_t stride = 0;            // bytes between rows (>= act_row_bytes(type, n_in))
  const int32_t* idx = nullptr; // optional: token t uses row idx[t]; else row t
  int64_t n_tok = 0;
};

// y[t*ldy + o] = Σ_i W[o][i] · x_t[i] for o in [o_begin, o_end), t < x.n_tok, where W is
// one 2-D matrix (use WeightMatrix::matrix(e) for an expert). x.type must be
// act_type(w.type, p) for the precision in use. Small n_tok runs the matrix-vector
// kernels, larger ones tiled kernels that read each weight row once per call.
// Throws std::invalid_argument for an unsupported (weight type, activation type) pair.
void matmul(const WeightMatrix& w, int64_t o_begin, int64_t o_end, const ActRows& x, float* y,
            int64_t ldy);

// The number of output rows a thread should take at a time so tiles stay whole (the
// model aligns its row splits to this; any split is still correct). 16 for repacked
// matrices, whose kernel takes whole 16-row groups.
int64_t row_granularity(const WeightMatrix& w);

// Whether the level in use has the kernel for rows of type t repacked 16 at a time
// (tensor/repack.h): Q4_K, Q6_K and the IQ / TQ types but IQ4_NL, at AVX-512 with VNNI.
bool has_repacked(DType t);

// ---------------------------------------------------------------------------------------
// Vector helpers (attention, norms)

float dot_f32(const float* a, const float* b, int64_t n);
// y += a * x
void axpy_f32(float a, const float* x, float* y, int64_t n);
// y *= a
void scale_f32(float a, float* y, int64_t n);
// Σ x[i]² (accumulated in double, returned as F32).
float sum_squares_f32(const float* x, int64_t n);

// Attention over the KV cache has kernels of its own (tensor/kv_kernels.h). These three
// serve attention over F32 rows held in full, as the training's forward and backward passes
// keep them (src/train):
// s[r*s_stride + j] = scale · (q_r · k_j) for the n_q query rows q_r = q + r*q_stride and
// the n_k key rows k_j = k + j*k_stride, all of length d. Each value is the same bits
// whatever n_q, n_k and the row's position in the call (within one ISA level).
void attn_scores(const float* q, int64_t q_stride, int64_t n_q, const float* k, int64_t k_stride, int64_t n_k,
                 int64_t d, float scale, float* s, int64_t s_stride);
// s[j] = exp(s[j] - m) for j < n (a polynomial exp, ~1 ulp for arguments <= 0); returns Σ s[j].
float exp_shift_sum(float* s, int64_t n, float m);

// C += A·B in F32: c[i*ldc + j] += Σ_p a[i*a_rs + p*a_cs] · b[p*ldb + j] for i < m,
// j < n, p < k. A is read through strides, so a transposed view costs nothing (the
// training's weight gradient reads dy column-wise). Each element takes one fused
// multiply-add per p, in ascending p: every ISA level gives the same bits, and a product
// split into consecutive p ranges (called once per range, in order) gives the bits of one
// call. The backward products of training (src/train/linear.h) run on it.
void gemm_acc_f32(int64_t m, int64_t n, int64_t k, const float* a, int64_t a_rs, int64_t a_cs, const float* b,
                  int64_t ldb, float* c, int64_t ldc);

}  // namespace kernels
}  // namespace step35
