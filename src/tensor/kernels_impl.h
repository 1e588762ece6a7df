// Internals shared by the kernel files: the private activation block layouts, and the
// table of functions each ISA level provides (kernels.cpp picks one table at run time).
#pragma once

#include <cstddef>
#include <cstdint>

#include "tensor/dtype.h"
#include "tensor/kernels.h"
#include "tensor/kv_kernels.h"

namespace step35::kernels {

// Activation blocks (never stored in files). Q8_K: 256 values, F32 scale, and the sums of
// each 16 values (the K-quant dot products subtract min·Σq8 per sub-block with them).
#pragma pack(push, 1)
struct ActQ8_0 { uint16_t d; int8_t qs[32]; };               // d in F16
struct ActQ8_1 { uint16_t d; uint16_t s; int8_t qs[32]; };   // s = F16(d · Σqs)
struct ActQ8_K { float d; int8_t qs[256]; int16_t bsums[16]; };
#pragma pack(pop)
static_assert(sizeof(ActQ8_0) == 34 && sizeof(ActQ8_1) == 36 && sizeof(ActQ8_K) == 292);

// Σ_i W[i]·x[i] over one weight row of n elements and one converted activation row (its
// format fixed by the weight type, see act_type()).
using VecDotFn = float (*)(int64_t n, const uint8_t* w, const uint8_t* x);

// A tile of the matrix product: n_rows (1..4) weight rows w[r] against n_tok (1..the
// level's tile_tokens) activation rows x[t], y[t*ldy + r] = vec_dot(n, w[r], x[t]) bit for
// bit (each (row, token) value goes through the single-row kernel's float steps, in
// lanes), so tiling never changes a result (the invariance contract of kernels.h).
using TileDotFn = void (*)(int64_t n, const uint8_t* const* w, int n_rows, const uint8_t* const* x, int n_tok,
                           float* y, int64_t ldy);
// Rows repacked 16 at a time (tensor/repack.h): y[t*ldy + r] for the 16 rows of one group.
using X16DotFn = void (*)(int64_t n, const uint8_t* group, const uint8_t* end, const uint8_t* const* x, int n_tok,
                          float* y, int64_t ldy);
constexpr int kMaxTileRows = 4;
constexpr int kMaxTileTokens = 4;
// Tokens one repacked-group call takes: 1..4 or 8 (8 halves the share of the per-group
// unpacking in prefill; the registers of the 16-row kernels hold 8 tokens' sums).
constexpr int kMaxX16Tokens = 8;

// Everything an ISA level implements. A null vec_dot entry falls back to the scalar one.
struct IsaKernels {
  VecDotFn vec_dot[40] = {};  // indexed by DType id (all supported ids are < 40)
  TileDotFn tile_dot[40] = {};  // null: the driver calls vec_dot per (row, token)
  int tile_tokens = 1;          // most tokens one tile_dot call takes (<= kMaxTileTokens)
  // Rows repacked 16 at a time (tensor/repack.h), indexed by DType id: y[t*ldy + r] for
  // the 16 rows of one group and n_tok (1..4 or 8) tokens, bit-identical to vec_dot
  // on the original rows. Null where the level has none (the driver then uses the GGUF
  // rows). `end` bounds the software prefetch (the end of the caller's row range: bytes
  // past it belong to another thread's chunk or another matrix).
  X16DotFn x16_dot[40] = {};
  // Q8_K / Q8_0 / Q8_1 activation rounding, bit-identical to quantize_act_q8_K / _q8_0 / _q8_1
  // (every level sets them; the scalar table holds those references).
  void (*quantize_q8_K)(const float* x, ActQ8_K* y, int64_t n) = nullptr;
  void (*quantize_q8_0)(const float* x, ActQ8_0* y, int64_t n) = nullptr;
  void (*quantize_q8_1)(const float* x, ActQ8_1* y, int64_t n) = nullptr;
  float (*dot_f32)(const float* a, const float* b, int64_t n) = nullptr;
  void (*axpy_f32)(float a, const float* x, float* y, int64_t n) = nullptr;
  void (*scale_f32)(float a, float* y, int64_t n) = nullptr;
  float (*sum_squares_f32)(const float* x, int64_t n) = nullptr;
  void (*attn_scores)(const float* q, int64_t q_stride, int64_t n_q, const float* k, int64_t k_stride,
                      int64_t n_k, int64_t d, float scale, float* s, int64_t s_stride) = nullptr;
  float (*exp_shift_sum)(float* s, int64_t n, float m) = nullptr;
  void (*gemm_acc_f32)(int64_t m, int64_t n, int64_t k, const float* a, int64_t a_rs, int64_t a_cs, const float* b,
                       int64_t ldb, float* c, int64_t ldc) = nullptr;
  // out[i] = SiLU(gate[i]) * up[i], both clamped to `limit` when limit > 1e-6 (architecture.md
  // "Dense MLP and the SwiGLU clamp"), with exp_poly (kernels_exp.h): every level gives the same
  // bits.
  void (*swiglu_f32)(const float* gate, const float* up, float limit, float* out, int64_t n) = nullptr;
  // Attention over one KV cache block of one head (kv_kernels.h: attn_scores, attn_exp_sum,
  // attn_accumulate).
  AttnScoresFn* kv_scores = nullptr;
  AttnExpSumFn* kv_exp_sum = nullptr;
  AttnRowMaxFn* kv_max = nullptr;
  AttnAccumulateFn* kv_accumulate = nullptr;
  // hadamard_rows for chunks n >= 8, bit-identical to the scalar loop (null: the scalar loop).
  void (*hadamard_rows)(float* x, int64_t len, int64_t n) = nullptr;
  // The IQ4_NL / IQ4_XS encoders' two searches (quants_iq.cpp), bit-identical to its scalar
  // ones (null: those): the best scale d[s] of each of n_sub 32-value sub-blocks, and the
  // level codes of 32 values at inverse scale id, packed two per byte.
  void (*iq4_scales)(const float* x, int64_t n_sub, float* d) = nullptr;
  void (*iq4_pack_levels)(const float* x, float id, uint8_t* qs) = nullptr;
};

const IsaKernels& scalar_kernels();
// The table of the level in use (kernels.cpp).
const IsaKernels& active_table();
// The x86 levels' tables (kernels.h: Isa), one build of kernels_x86.inc each
// (src/tensor/kernels_level.cpp.in); each is only callable where the CPU has its level.
const IsaKernels& avx2_kernels();
const IsaKernels& avx2_vnni_kernels();
const IsaKernels& avx512_kernels();
const IsaKernels& avx512_vnni_kernels();
const IsaKernels& avx512_bf16_kernels();

// Scalar activation converters (bit-identical to ggml's; shared by every ISA level).
void quantize_act_q8_0(const float* x, ActQ8_0* y, int64_t n);
void quantize_act_q8_1(const float* x, ActQ8_1* y, int64_t n);
void quantize_act_q8_K(const float* x, ActQ8_K* y, int64_t n);

// Scalar references of the KV attention kernels (kv_kernels_ref.cpp).
AttnScoresFn ref_kv_scores;
AttnExpSumFn ref_kv_exp_sum;
AttnRowMaxFn ref_kv_max;
AttnAccumulateFn ref_kv_accumulate;

}  // namespace step35::kernels
