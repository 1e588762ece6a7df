// Scalar reference kernels: one plain per-block dequantizer per type (layouts in
// docs/architecture.md, "Weight types and block layouts"), their row loops, and the type traits
// table (tensor/type_traits.h) that holds them with every other per-type fact. The float operation order inside each dequantizer is the natural one of the formula
// (scale·q, then ± offset) so the values match llama.cpp's own dequantization.
#include "tensor/quants.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "tensor/block32.h"
#include "tensor/fp16.h"
#include "tensor/iq_grids.h"
#include "tensor/quants_iq.h"
#include "tensor/quant_rounding.h"
#include "tensor/quants_kquant_encode.h"
#include "tensor/repack.h"
#include "tensor/type_traits.h"

namespace step35 {

namespace {

// ---- per-block dequantizers ----------------------------------------------------------
// The block structs are packed (alignment 1), so member reads are unaligned-safe; only the
// u32 view of qh needs memcpy.

// Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, MXFP4: the levels times the step, plus the min
// where the type has one.
template <typename Block>
void deq_block32(const Block& b, float* y) {
  int q[32];
  block_levels(b, q);
  const float d = block_step(b);
  if constexpr (kBlockHasMin<Block>) {
    const float m = fp16_to_fp32(b.m);
    for (int j = 0; j < 32; ++j) y[j] = float(q[j]) * d + m;
  } else {
    for (int j = 0; j < 32; ++j) y[j] = float(q[j]) * d;
  }
}

// Q4_K / Q5_K: four chunks of 64, each two sub-blocks (low then high nibbles) with a 6-bit
// scale and min; Q5_K's fifth bit of sub-block s comes from bit s of qh[l].
template <typename Block>
void deq_q4_q5_k(const Block& b, float* y) {
  const float d = fp16_to_fp32(b.d), dmin = fp16_to_fp32(b.dmin);
  for (int c = 0; c < 4; ++c) {
    int sc0, m0, sc1, m1;
    k4_scale_min(b.scales, 2 * c, &sc0, &m0);
    k4_scale_min(b.scales, 2 * c + 1, &sc1, &m1);
    const float d0 = d * float(sc0), o0 = dmin * float(m0);
    const float d1 = d * float(sc1), o1 = dmin * float(m1);
    const uint8_t* q = b.qs + 32 * c;
    for (int l = 0; l < 32; ++l) {
      int lo = q[l] & 15, hi = q[l] >> 4;
      if constexpr (std::is_same_v<Block, BlockQ5_K>) {
        lo += ((b.qh[l] >> (2 * c)) & 1) << 4;
        hi += ((b.qh[l] >> (2 * c + 1)) & 1) << 4;
      }
      y[64 * c + l] = d0 * float(lo) - o0;
      y[64 * c + 32 + l] = d1 * float(hi) - o1;
    }
  }
}

void deq_q6_k(const BlockQ6_K& b, float* y) {
  const float d = fp16_to_fp32(b.d);
  for (int n = 0; n < 2; ++n) {
    const uint8_t* ql = b.ql + 64 * n;
    const uint8_t* qh = b.qh + 32 * n;
    const int8_t* sc = b.scales + 8 * n;
    float* yh = y + 128 * n;
    for (int l = 0; l < 32; ++l) {
      const int s = l / 16;
      const int q1 = ((ql[l] & 15) | (((qh[l] >> 0) & 3) << 4)) - 32;
      const int q2 = ((ql[l + 32] & 15) | (((qh[l] >> 2) & 3) << 4)) - 32;
      const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
      const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
      yh[l] = d * float(sc[s]) * float(q1);
      yh[l + 32] = d * float(sc[s + 2]) * float(q2);
      yh[l + 64] = d * float(sc[s + 4]) * float(q3);
      yh[l + 96] = d * float(sc[s + 6]) * float(q4);
    }
  }
}

void deq_q3_k(const BlockQ3_K& b, float* y) {
  const float d = fp16_to_fp32(b.d);
  // Sixteen signed 6-bit scales: low nibbles from bytes 0..7 (low then high nibble),
  // the two top bits from bytes 8..11, two bits per scale.
  int S[16];
  for (int k = 0; k < 16; ++k) {
    const int low4 = k < 8 ? (b.scales[k] & 15) : (b.scales[k - 8] >> 4);
    const int high2 = (b.scales[8 + k % 4] >> (2 * (k / 4))) & 3;
    S[k] = (low4 | (high2 << 4)) - 32;
  }
  int k = 0;
  for (int n = 0; n < 2; ++n) {
    const uint8_t* q = b.qs + 32 * n;
    float* yh = y + 128 * n;
    for (int j = 0; j < 4; ++j) {
      const uint8_t hbit = uint8_t(1u << (4 * n + j));
      const float dl0 = d * float(S[k++]);
      for (int l = 0; l < 16; ++l) {
        const int v = ((q[l] >> (2 * j)) & 3) - ((b.hmask[l] & hbit) ? 0 : 4);
        yh[32 * j + l] = dl0 * float(v);
      }
      const float dl1 = d * float(S[k++]);
      for (int l = 0; l < 16; ++l) {
        const int v = ((q[l + 16] >> (2 * j)) & 3) - ((b.hmask[l + 16] & hbit) ? 0 : 4);
        yh[32 * j + 16 + l] = dl1 * float(v);
      }
    }
  }
}

void deq_q2_k(const BlockQ2_K& b, float* y) {
  const float d = fp16_to_fp32(b.d), dmin = fp16_to_fp32(b.dmin);
  int k = 0;
  for (int n = 0; n < 2; ++n) {
    const uint8_t* q = b.qs + 32 * n;
    float* yh = y + 128 * n;
    for (int j = 0; j < 4; ++j) {
      for (int g = 0; g < 2; ++g) {
        const uint8_t sc = b.scales[k++];
        const float dl = d * float(sc & 15), ml = dmin * float(sc >> 4);
        for (int l = 0; l < 16; ++l)
          yh[32 * j + 16 * g + l] = dl * float((q[16 * g + l] >> (2 * j)) & 3) - ml;
      }
    }
  }
}

// Float "blocks" of one element; packed so that a row at any byte address is legal.
#pragma pack(push, 1)
struct F16Elem { uint16_t v; };
struct BF16Elem { uint16_t v; };
#pragma pack(pop)
void deq_f16(const F16Elem& b, float* y) { *y = fp16_to_fp32(b.v); }
void deq_bf16(const BF16Elem& b, float* y) { *y = bf16_to_fp32(b.v); }
static_assert(sizeof(F16Elem) == 2 && sizeof(BF16Elem) == 2);

// ---- row loops -----------------------------------------------------------------------
// deq(i, out) writes the QK values of block i to out.

template <int QK, typename DeqBlock>
void dequant_row(const DeqBlock& deq, float* dst, int64_t n) {
  for (int64_t i = 0; i < n / QK; ++i) deq(i, dst + i * QK);
}

// Each block's products summed in float, the block sums in double.
template <int QK, typename DeqBlock>
float dot_row(const DeqBlock& deq, const float* x, int64_t n) {
  float tmp[QK];
  double sum = 0.0;
  for (int64_t i = 0; i < n / QK; ++i) {
    deq(i, tmp);
    const float* xb = x + i * QK;
    float acc = 0.0f;
    for (int j = 0; j < QK; ++j) acc += tmp[j] * xb[j];
    sum += double(acc);
  }
  return float(sum);
}

template <typename Block, int QK, void (*Deq)(const Block&, float*)>
void dequant_blocks(const void* src, float* dst, int64_t n) {
  const Block* b = static_cast<const Block*>(src);
  dequant_row<QK>([b](int64_t i, float* out) { Deq(b[i], out); }, dst, n);
}

template <typename Block, int QK, void (*Deq)(const Block&, float*)>
float dot_blocks(const void* w, const float* x, int64_t n) {
  const Block* b = static_cast<const Block*>(w);
  return dot_row<QK>([b](int64_t i, float* out) { Deq(b[i], out); }, x, n);
}

// The 256-element IQ / TQ types go through their integer decoders (tensor/quants_iq.h),
// with *scratch holding the decoded block.
auto iq_block_values(DType t, const void* src, iq::BlockInts* scratch) {
  const uint8_t* p = static_cast<const uint8_t*>(src);
  const size_t bb = dtype_info(t).block_bytes;
  return [t, p, bb, scratch](int64_t i, float* out) {
    iq::decode(t, p + size_t(i) * bb, scratch);
    iq::dequantize(*scratch, out);
  };
}

template <DType T>
void dequant_iq_row(const void* src, float* dst, int64_t n) {
  iq::BlockInts b;
  dequant_row<256>(iq_block_values(T, src, &b), dst, n);
}

template <DType T>
float dot_iq_row(const void* w, const float* x, int64_t n) {
  iq::BlockInts b;
  return dot_row<256>(iq_block_values(T, w, &b), x, n);
}

// Checks the caller's contract once per row (a violation is a programming error).
void check_row(DType t, int64_t n, const char* what) {
  const DTypeInfo* info = dtype_info(uint32_t(t));
  if (!info) throw std::invalid_argument(std::string(what) + ": unsupported type");
  if (n < 0 || n % info->block_elems != 0)
    throw std::invalid_argument(std::string(what) + ": " + std::to_string(n) +
                                " elements is not a multiple of the " + info->name + " block size");
}

// ---- quantizers (round-to-nearest, as ggml's reference encoders) -----------------------
// Note they scale by the reciprocal 1/d computed from the unrounded float d, and store d
// as f16 afterwards; this order is what makes the bytes identical to llama-quantize's.

// Truncating float -> int conversion of a value clamped to [0, hi] first, so that a NaN or
// out-of-range input cannot hit undefined behaviour; identical to (int)v for v in [0, hi].
int trunc_clamped(float v, int hi) {
  if (!(v > 0.0f)) return 0;
  if (v >= float(hi)) return hi;
  return int(v);
}

void quant_q8_0(const float* x, BlockQ8_0* y) {
  float amax = 0.0f;
  for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[j]));
  const float d = amax / 127.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  y->d = fp32_to_fp16(d);
  for (int j = 0; j < 32; ++j) {
    // |x·id| <= 127 up to rounding; clamp so an ulp over cannot wrap the int8.
    float v = std::round(x[j] * id);
    if (std::isnan(v)) v = 0.0f;  // a NaN input must not reach the (UB) float->int cast
    v = std::clamp(v, -127.0f, 127.0f);
    y->qs[j] = int8_t(v);
  }
}

template <typename Block>
inline constexpr bool kHasFifthBit = requires(Block b) { b.qh; };

// Q4_0, Q4_1, Q5_0, Q5_1: levels 0..15 (0..31 with the fifth bit) in the nibbles of qs and
// the bits of the little-endian 32-bit qh word.
template <typename Block>
void store_levels(const int* q, Block* y) {
  for (int j = 0; j < 16; ++j) y->qs[j] = uint8_t((q[j] & 15) | ((q[j + 16] & 15) << 4));
  if constexpr (kHasFifthBit<Block>) {
    uint32_t qh = 0;
    for (int j = 0; j < 32; ++j) qh |= uint32_t(q[j] >> 4) << j;
    std::memcpy(y->qh, &qh, 4);
  }
}

// Q4_0 / Q5_0: the value of largest magnitude maps to level 0 (d = max / -8, or -16).
// Q4_1 / Q5_1: the min to level 0 and the max to the top level.
template <typename Block>
void quant_block32(const float* x, Block* y) {
  constexpr int top = kHasFifthBit<Block> ? 31 : 15;
  int q[32];
  if constexpr (kBlockHasMin<Block>) {
    float mn = x[0], mx = x[0];
    for (int j = 1; j < 32; ++j) {
      mn = std::min(mn, x[j]);
      mx = std::max(mx, x[j]);
    }
    const float d = (mx - mn) / float(top);
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y->d = fp32_to_fp16(d);
    y->m = fp32_to_fp16(mn);
    for (int j = 0; j < 32; ++j) q[j] = trunc_clamped((x[j] - mn) * id + 0.5f, top);
  } else {
    constexpr float half = float((top + 1) / 2);
    const float d = signed_absmax(x, 32).value / -half;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y->d = fp32_to_fp16(d);
    for (int j = 0; j < 32; ++j) q[j] = trunc_clamped(x[j] * id + (half + 0.5f), top);
  }
  store_levels(q, y);
}

template <typename Block, void (*Quant)(const float*, Block*)>
void quant_blocks(const float* src, void* dst, int64_t n) {
  Block* b = static_cast<Block*>(dst);
  for (int64_t i = 0; i < n / 32; ++i) Quant(src + 32 * i, b + i);
}

// ---- the float types' rows and the IQ / TQ rows, as the table's columns take them ------

void deq_row_f32(const void* src, float* dst, int64_t n) { std::memcpy(dst, src, size_t(n) * 4); }

// The float types are blocks of one element: each product in float, summed in double.
// memcpy-based reads keep an unaligned F32 row legal.
float dot_row_f32(const void* w, const float* x, int64_t n) {
  const uint8_t* p = static_cast<const uint8_t*>(w);
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    float v;
    std::memcpy(&v, p + 4 * i, 4);
    sum += double(v * x[i]);
  }
  return float(sum);
}

void quant_row_f32(const float* src, void* dst, int64_t n) { std::memcpy(dst, src, size_t(n) * 4); }

template <uint16_t (*Round)(float)>
void quant_row_half(const float* src, void* dst, int64_t n) {
  uint8_t* out = static_cast<uint8_t*>(dst);
  for (int64_t i = 0; i < n; ++i) {
    const uint16_t h = Round(src[i]);
    std::memcpy(out + 2 * i, &h, 2);
  }
}
void quant_row_f16(const float* src, void* dst, int64_t n) { quant_row_half<fp32_to_fp16>(src, dst, n); }
void quant_row_bf16(const float* src, void* dst, int64_t n) { quant_row_half<fp32_to_bf16>(src, dst, n); }

}  // namespace

// Q4_K / Q5_K: 6-bit scale and min of sub-block b (0..7) from the 12 packed bytes. The
// first four sub-blocks use the low 6 bits of bytes 0..7; the last four take their low
// nibbles from bytes 8..11 and their top two bits from the spare bits 6..7 of bytes 0..7.
void k4_scale_min(const uint8_t* s, int b, int* sc, int* m) {
  if (b < 4) {
    *sc = s[b] & 63;
    *m = s[b + 4] & 63;
  } else {
    *sc = (s[b + 4] & 15) | ((s[b - 4] >> 6) << 4);
    *m = (s[b + 4] >> 4) | ((s[b] >> 6) << 4);
  }
}

void dequantize_row_ref(DType t, const void* src, float* dst, int64_t n) {
  check_row(t, n, "dequantize_row_ref");
  type_traits(t).dequantize(src, dst, n);
}

float dot_row_ref(DType t, const void* w, const float* x, int64_t n) {
  check_row(t, n, "dot_row_ref");
  return type_traits(t).dot(w, x, n);
}

bool quantize_row_ref(DType t, const float* src, void* dst, int64_t n) {
  const TypeTraits* tt = type_traits(uint32_t(t));
  if (!tt || !tt->quantize || n < 0 || n % tt->block_elems != 0) return false;
  tt->quantize(src, dst, n);
  return true;
}

// ---- the type traits table (tensor/type_traits.h) -------------------------------------

namespace {

using kernels::ActType;
using kernels::kIq1X16Values;
using kernels::kIq2X16Values;
using kernels::kIq3sX16Values;
using kernels::kIq3xxsX16Values;
using kernels::kIq4X16Values;
using kernels::kTqX16Values;
using kernels::iq_x16_block_bytes;
using kernels::kQ4kX16BlockBytes;
using kernels::kQ5kX16BlockBytes;
using kernels::kQ6kX16BlockBytes;
using F = TypeFamily;
using A = ActType;
using K = KvRole;

// One row per type, ordered by id. Block bytes of the IQ and TQ types: ggml's block_iq* /
// block_tq* structs (tensor/quants.h reproduces them and checks the sizes). Columns: type,
// name, block elements, block bytes; family, native activation format; reference dequantize,
// dot and encode rows, fast encoder; short-row type; IQ decoder, row factor; x16 block bytes,
// x16 scale part, x16 values; KV cache role.
constexpr TypeTraits kTypeTraits[] = {
    {{DType::F32, "f32", 1, 4}, F::Float, A::F32,
     deq_row_f32, dot_row_f32, quant_row_f32, nullptr,
     DType::F32, nullptr, 1.0f, 0, false, nullptr, K::Float},
    {{DType::F16, "f16", 1, 2}, F::Float, A::F16,
     dequant_blocks<F16Elem, 1, deq_f16>, dot_blocks<F16Elem, 1, deq_f16>, quant_row_f16, nullptr,
     DType::F16, nullptr, 1.0f, 0, false, nullptr, K::Float},
    {{DType::Q4_0, "q4_0", 32, 18}, F::Block32, A::Q8_0,
     dequant_blocks<BlockQ4_0, 32, deq_block32>, dot_blocks<BlockQ4_0, 32, deq_block32>, quant_blocks<BlockQ4_0, quant_block32>, nullptr,
     DType::Q4_0, nullptr, 1.0f, 0, false, nullptr, K::Int},
    {{DType::Q4_1, "q4_1", 32, 20}, F::Block32, A::Q8_1,
     dequant_blocks<BlockQ4_1, 32, deq_block32>, dot_blocks<BlockQ4_1, 32, deq_block32>, quant_blocks<BlockQ4_1, quant_block32>, nullptr,
     DType::Q4_1, nullptr, 1.0f, 0, false, nullptr, K::None},
    {{DType::Q5_0, "q5_0", 32, 22}, F::Block32, A::Q8_0,
     dequant_blocks<BlockQ5_0, 32, deq_block32>, dot_blocks<BlockQ5_0, 32, deq_block32>, quant_blocks<BlockQ5_0, quant_block32>, nullptr,
     DType::Q5_0, nullptr, 1.0f, 0, false, nullptr, K::None},
    {{DType::Q5_1, "q5_1", 32, 24}, F::Block32, A::Q8_1,
     dequant_blocks<BlockQ5_1, 32, deq_block32>, dot_blocks<BlockQ5_1, 32, deq_block32>, quant_blocks<BlockQ5_1, quant_block32>, nullptr,
     DType::Q5_1, nullptr, 1.0f, 0, false, nullptr, K::None},
    {{DType::Q8_0, "q8_0", 32, 34}, F::Block32, A::Q8_0,
     dequant_blocks<BlockQ8_0, 32, deq_block32>, dot_blocks<BlockQ8_0, 32, deq_block32>, quant_blocks<BlockQ8_0, quant_q8_0>, nullptr,
     DType::Q8_0, nullptr, 1.0f, 0, false, nullptr, K::Int},
    {{DType::Q2_K, "q2_K", 256, 84}, F::KQuant, A::Q8_K,
     dequant_blocks<BlockQ2_K, 256, deq_q2_k>, dot_blocks<BlockQ2_K, 256, deq_q2_k>, quantize_row_q2_k_ref, quantize_row_q2_k_fast,
     DType::Q4_0, nullptr, 1.0f, 0, false, nullptr, K::None},
    {{DType::Q3_K, "q3_K", 256, 110}, F::KQuant, A::Q8_K,
     dequant_blocks<BlockQ3_K, 256, deq_q3_k>, dot_blocks<BlockQ3_K, 256, deq_q3_k>, quantize_row_q3_k_ref, nullptr,
     DType::Q4_0, nullptr, 1.0f, 0, false, nullptr, K::None},
    {{DType::Q4_K, "q4_K", 256, 144}, F::KQuant, A::Q8_K,
     dequant_blocks<BlockQ4_K, 256, deq_q4_q5_k>, dot_blocks<BlockQ4_K, 256, deq_q4_q5_k>, quantize_row_q4_k_ref, quantize_row_q4_k_fast,
     DType::Q5_0, nullptr, 1.0f, kQ4kX16BlockBytes, false, nullptr, K::None},
    {{DType::Q5_K, "q5_K", 256, 176}, F::KQuant, A::Q8_K,
     dequant_blocks<BlockQ5_K, 256, deq_q4_q5_k>, dot_blocks<BlockQ5_K, 256, deq_q4_q5_k>, quantize_row_q5_k_ref, quantize_row_q5_k_fast,
     DType::Q5_1, nullptr, 1.0f, kQ5kX16BlockBytes, false, nullptr, K::None},
    {{DType::Q6_K, "q6_K", 256, 210}, F::KQuant, A::Q8_K,
     dequant_blocks<BlockQ6_K, 256, deq_q6_k>, dot_blocks<BlockQ6_K, 256, deq_q6_k>, quantize_row_q6_k_ref, quantize_row_q6_k_fast,
     DType::Q8_0, nullptr, 1.0f, kQ6kX16BlockBytes, true, nullptr, K::None},
    {{DType::IQ2_XXS, "iq2_xxs", 256, 66}, F::IQ, A::Q8_K,
     dequant_iq_row<DType::IQ2_XXS>, dot_iq_row<DType::IQ2_XXS>, nullptr, nullptr,
     DType::IQ2_XXS, iq::decode_iq2_xxs, 0.125f, iq_x16_block_bytes(DType::IQ2_XXS), true, kIq2X16Values, K::None},
    {{DType::IQ2_XS, "iq2_xs", 256, 74}, F::IQ, A::Q8_K,
     dequant_iq_row<DType::IQ2_XS>, dot_iq_row<DType::IQ2_XS>, nullptr, nullptr,
     DType::IQ2_XS, iq::decode_iq2_xs, 0.125f, iq_x16_block_bytes(DType::IQ2_XS), true, kIq2X16Values, K::None},
    {{DType::IQ3_XXS, "iq3_xxs", 256, 98}, F::IQ, A::Q8_K,
     dequant_iq_row<DType::IQ3_XXS>, dot_iq_row<DType::IQ3_XXS>, nullptr, nullptr,
     DType::IQ3_XXS, iq::decode_iq3_xxs, 0.25f, iq_x16_block_bytes(DType::IQ3_XXS), true, kIq3xxsX16Values, K::None},
    {{DType::IQ1_S, "iq1_s", 256, 50}, F::IQ, A::Q8_K,
     dequant_iq_row<DType::IQ1_S>, dot_iq_row<DType::IQ1_S>, nullptr, nullptr,
     DType::IQ1_S, iq::decode_iq1_s, 1.0f, iq_x16_block_bytes(DType::IQ1_S), true, kIq1X16Values, K::None},
    {{DType::IQ4_NL, "iq4_nl", 32, 18}, F::Block32, A::Q8_0,
     dequant_blocks<BlockIQ4_NL, 32, deq_block32>, dot_blocks<BlockIQ4_NL, 32, deq_block32>, iq::quantize_row_iq4_nl, iq::quantize_row_iq4_nl_fast,
     DType::IQ4_NL, nullptr, 1.0f, 0, false, nullptr, K::None},
    {{DType::IQ3_S, "iq3_s", 256, 110}, F::IQ, A::Q8_K,
     dequant_iq_row<DType::IQ3_S>, dot_iq_row<DType::IQ3_S>, nullptr, nullptr,
     DType::IQ3_S, iq::decode_iq3_s, 1.0f, iq_x16_block_bytes(DType::IQ3_S), true, kIq3sX16Values, K::None},
    {{DType::IQ2_S, "iq2_s", 256, 82}, F::IQ, A::Q8_K,
     dequant_iq_row<DType::IQ2_S>, dot_iq_row<DType::IQ2_S>, nullptr, nullptr,
     DType::IQ2_S, iq::decode_iq2_s, 0.125f, iq_x16_block_bytes(DType::IQ2_S), true, kIq2X16Values, K::None},
    {{DType::IQ4_XS, "iq4_xs", 256, 136}, F::IQ, A::Q8_K,
     dequant_iq_row<DType::IQ4_XS>, dot_iq_row<DType::IQ4_XS>, iq::quantize_row_iq4_xs, iq::quantize_row_iq4_xs_fast,
     DType::IQ4_NL, iq::decode_iq4_xs, 1.0f, iq_x16_block_bytes(DType::IQ4_XS), true, kIq4X16Values, K::None},
    {{DType::IQ1_M, "iq1_m", 256, 56}, F::IQ, A::Q8_K,
     dequant_iq_row<DType::IQ1_M>, dot_iq_row<DType::IQ1_M>, nullptr, nullptr,
     DType::IQ1_M, iq::decode_iq1_m, 1.0f, iq_x16_block_bytes(DType::IQ1_M), true, kIq1X16Values, K::None},
    {{DType::BF16, "bf16", 1, 2}, F::Float, A::BF16,
     dequant_blocks<BF16Elem, 1, deq_bf16>, dot_blocks<BF16Elem, 1, deq_bf16>, quant_row_bf16, nullptr,
     DType::BF16, nullptr, 1.0f, 0, false, nullptr, K::Float},
    {{DType::TQ1_0, "tq1_0", 256, 54}, F::TQ, A::Q8_K,
     dequant_iq_row<DType::TQ1_0>, dot_iq_row<DType::TQ1_0>, nullptr, nullptr,
     DType::TQ1_0, iq::decode_tq1_0, 1.0f, iq_x16_block_bytes(DType::TQ1_0), true, kTqX16Values, K::None},
    {{DType::TQ2_0, "tq2_0", 256, 66}, F::TQ, A::Q8_K,
     dequant_iq_row<DType::TQ2_0>, dot_iq_row<DType::TQ2_0>, nullptr, nullptr,
     DType::TQ2_0, iq::decode_tq2_0, 1.0f, iq_x16_block_bytes(DType::TQ2_0), true, kTqX16Values, K::None},
    {{DType::MXFP4, "mxfp4", 32, 17}, F::Block32, A::Q8_0,
     dequant_blocks<BlockMXFP4, 32, deq_block32>, dot_blocks<BlockMXFP4, 32, deq_block32>, nullptr, nullptr,
     DType::MXFP4, nullptr, 1.0f, 0, false, nullptr, K::None},
};

// Row index of every id below kIdLimit, -1 for the unsupported ones.
constexpr uint32_t kIdLimit = 64;
constexpr auto kRowOfId = [] {
  std::array<int8_t, kIdLimit> idx{};
  for (auto& i : idx) i = -1;
  for (size_t r = 0; r < std::size(kTypeTraits); ++r) idx[uint32_t(kTypeTraits[r].type)] = int8_t(r);
  return idx;
}();

constexpr bool ordered_by_id() {
  for (size_t r = 1; r < std::size(kTypeTraits); ++r)
    if (uint32_t(kTypeTraits[r - 1].type) >= uint32_t(kTypeTraits[r].type)) return false;
  return true;
}
static_assert(ordered_by_id(), "kTypeTraits: one row per type, in id order");

}  // namespace

const TypeTraits* type_traits(uint32_t ggml_type_id) {
  if (ggml_type_id >= kIdLimit || kRowOfId[ggml_type_id] < 0) return nullptr;
  return &kTypeTraits[kRowOfId[ggml_type_id]];
}

const TypeTraits& type_traits(DType t) {
  const TypeTraits* tt = type_traits(uint32_t(t));
  // A DType value outside the enum can only come from a cast of an unchecked id: a
  // programming error, not bad input (file ids go through the uint32_t overload).
  if (!tt) throw std::invalid_argument("unsupported ggml type id " + std::to_string(uint32_t(t)));
  return *tt;
}

std::span<const TypeTraits> all_type_traits() { return kTypeTraits; }

}  // namespace step35
