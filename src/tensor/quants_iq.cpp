// IQ / TQ block decoders and the IQ4_NL / IQ4_XS encoders (see quants_iq.h). Each decoder
// states which bits of its block feed which element; the float sub-block scales follow
// ggml's dequantize_row_<type> expressions exactly (this file is built with
// -ffp-contract=off, as the other scalar references).
#include "tensor/quants_iq.h"

#include <cmath>
#include <cstddef>
#include <cstring>

#include "tensor/fp16.h"
#include "tensor/iq_grids.h"
#include "tensor/kernels_impl.h"
#include "tensor/quant_rounding.h"
#include "tensor/quants.h"
#include "tensor/type_traits.h"

namespace step35::iq {

namespace {

uint16_t load_u16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);  // GGUF and the hosts we build for are little-endian
  return v;
}
uint32_t load_u32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// Eight values of a uint64 magnitude grid entry with the signs of `sign_bits` (bit j set:
// element j negative), at q[0..7].
void put8(uint64_t entry, uint32_t sign_bits, int8_t* q) {
  for (int j = 0; j < 8; ++j) {
    const int m = grid_byte(entry, j);
    q[j] = int8_t(((sign_bits >> j) & 1u) ? -m : m);
  }
}
// Four values of a uint32 grid entry with sign bits first_bit..first_bit+3 of `sign_bits`.
void put4(uint32_t entry, uint32_t sign_bits, int first_bit, int8_t* q) {
  for (int j = 0; j < 4; ++j) {
    const int m = grid_byte(entry, j);
    q[j] = int8_t(((sign_bits >> (first_bit + j)) & 1u) ? -m : m);
  }
}

// IQ2_*: sub-block k's 4-bit scale s, as the integer 2s+1 and the float d·(s+½)/4.
void set_iq2_scale(BlockInts* b, int k, uint32_t s) {
  b->scale[k] = int16_t(2 * s + 1);
  b->dl[k] = b->d * (0.5f + float(s)) * 0.25f;
}

// TQ1_0 / TQ2_0: one F16 scale for all 256 values (each -1, 0 or 1).
void set_ternary_scale(BlockInts* b, uint16_t d16) {
  b->d = fp16_to_fp32(d16);
  b->group = 256;
  b->scale[0] = 1;
  b->dl[0] = b->d;
}

}  // namespace

// ---- decoders (the type traits table's iq_decode column) -------------------------------

// IQ2_XXS: per 32 values, 8 bytes: four grid indices, then a 32-bit word holding four 7-bit
// sign groups (bits 0..27) and the 4-bit scale s (bits 28..31); value = d·(s+½)/4 · grid.
void decode_iq2_xxs(const uint8_t* p, BlockInts* b) {
  b->d = fp16_to_fp32(load_u16(p));
  b->group = 32;
  const uint8_t* qs = p + offsetof(BlockIQ2_XXS, qs);
  for (int ib = 0; ib < 8; ++ib) {
    const uint8_t* g = qs + 8 * ib;
    const uint32_t aux = load_u32(g + 4);
    set_iq2_scale(b, ib, aux >> 28);
    for (int l = 0; l < 4; ++l)
      put8(kIq2xxsGrid[g[l]], expand_signs7(aux >> (7 * l)), b->q + 32 * ib + 8 * l);
  }
}

// IQ2_XS: per 8 values one 16-bit word, 9-bit grid index + 7 sign bits; per 32 values one
// byte with two 4-bit scales (low nibble: first 16 values).
void decode_iq2_xs(const uint8_t* p, BlockInts* b) {
  b->d = fp16_to_fp32(load_u16(p));
  b->group = 16;
  const uint8_t* qs = p + offsetof(BlockIQ2_XS, qs);
  const uint8_t* scales = p + offsetof(BlockIQ2_XS, scales);
  for (int ib = 0; ib < 8; ++ib) {
    for (int h = 0; h < 2; ++h) set_iq2_scale(b, 2 * ib + h, (scales[ib] >> (4 * h)) & 15u);
    for (int l = 0; l < 4; ++l) {
      const uint16_t w = load_u16(qs + 2 * (4 * ib + l));
      put8(kIq2xsGrid[w & 511u], expand_signs7(w >> 9), b->q + 32 * ib + 8 * l);
    }
  }
}

// IQ2_S: 10-bit grid indices (8 low bits in qs[0..31], 2 high bits per index in qh: two per
// index, four indices per byte), a full sign byte per 8 values (qs[32..63]), scales as IQ2_XS.
void decode_iq2_s(const uint8_t* p, BlockInts* b) {
  b->d = fp16_to_fp32(load_u16(p));
  b->group = 16;
  const uint8_t* qs = p + offsetof(BlockIQ2_S, qs);
  const uint8_t* signs = qs + 32;
  const uint8_t* qh = p + offsetof(BlockIQ2_S, qh);
  const uint8_t* scales = p + offsetof(BlockIQ2_S, scales);
  for (int ib = 0; ib < 8; ++ib) {
    for (int h = 0; h < 2; ++h) set_iq2_scale(b, 2 * ib + h, (scales[ib] >> (4 * h)) & 15u);
    for (int l = 0; l < 4; ++l) {
      const uint32_t idx = qs[4 * ib + l] | ((uint32_t(qh[ib]) << (8 - 2 * l)) & 0x300u);
      put8(kIq2sGrid[idx], signs[4 * ib + l], b->q + 32 * ib + 8 * l);
    }
  }
}

// IQ3_XXS: one 8-bit index per 4 values (qs[0..63]); per 32 values a 32-bit word (after the
// indices) with four 7-bit sign groups and the scale in bits 28..31: d·(s+½)/2 · grid.
void decode_iq3_xxs(const uint8_t* p, BlockInts* b) {
  b->d = fp16_to_fp32(load_u16(p));
  b->group = 32;
  const uint8_t* qs = p + offsetof(BlockIQ3_XXS, qs);
  const uint8_t* gas = qs + 64;
  for (int ib = 0; ib < 8; ++ib) {
    const uint32_t aux = load_u32(gas + 4 * ib);
    const uint32_t s = aux >> 28;
    b->scale[ib] = int16_t(2 * s + 1);
    b->dl[ib] = b->d * (0.5f + float(s)) * 0.5f;
    for (int l = 0; l < 4; ++l) {
      const uint32_t signs = expand_signs7(aux >> (7 * l));
      int8_t* q = b->q + 32 * ib + 8 * l;
      put4(kIq3xxsGrid[qs[8 * ib + 2 * l]], signs, 0, q);
      put4(kIq3xxsGrid[qs[8 * ib + 2 * l + 1]], signs, 4, q + 4);
    }
  }
}

// IQ3_S: 9-bit indices per 4 values (low bits in qs, the ninth from qh: one byte per 32
// values, bit k for the k-th index), a sign byte per 8 values, a 4-bit scale per 32 values
// (two per byte, low nibble first): d·(2s+1) · grid.
void decode_iq3_s(const uint8_t* p, BlockInts* b) {
  b->d = fp16_to_fp32(load_u16(p));
  b->group = 32;
  const uint8_t* qs = p + offsetof(BlockIQ3_S, qs);
  const uint8_t* qh = p + offsetof(BlockIQ3_S, qh);
  const uint8_t* signs = p + offsetof(BlockIQ3_S, signs);
  const uint8_t* scales = p + offsetof(BlockIQ3_S, scales);
  for (int ib = 0; ib < 8; ++ib) {
    const int s = (scales[ib / 2] >> (4 * (ib % 2))) & 15;
    b->scale[ib] = int16_t(2 * s + 1);
    b->dl[ib] = b->d * float(1 + 2 * s);
    const uint32_t h = qh[ib];
    for (int l = 0; l < 4; ++l) {
      const uint32_t idx1 = qs[8 * ib + 2 * l] | ((h << (8 - 2 * l)) & 256u);
      const uint32_t idx2 = qs[8 * ib + 2 * l + 1] | ((h << (7 - 2 * l)) & 256u);
      int8_t* q = b->q + 32 * ib + 8 * l;
      put4(kIq3sGrid[idx1], signs[4 * ib + l], 0, q);
      put4(kIq3sGrid[idx2], signs[4 * ib + l], 4, q + 4);
    }
  }
}

// Eight signed values of an IQ1 grid entry.
void put8_signed(uint64_t entry, int8_t* q) {
  for (int j = 0; j < 8; ++j) q[j] = int8_t(grid_byte(entry, j));
}

// IQ1_S: 11-bit indices per 8 values (8 bits in qs, 3 in the 16-bit word of their 32
// values, bits 3l..3l+2); the word's bits 12..14 are the scale s (d·(2s+1)) and bit 15 the
// sign of the ±1/8 shift of all 32 values.
void decode_iq1_s(const uint8_t* p, BlockInts* b) {
  b->d = fp16_to_fp32(load_u16(p));
  b->group = 32;
  b->has_delta = true;
  const uint8_t* qs = p + offsetof(BlockIQ1_S, qs);
  const uint8_t* qh = p + offsetof(BlockIQ1_S, qh);
  for (int ib = 0; ib < 8; ++ib) {
    const uint32_t h = load_u16(qh + 2 * ib);
    const int s = int((h >> 12) & 7u);
    b->scale[ib] = int16_t(2 * s + 1);
    b->dl[ib] = b->d * float(2 * s + 1);
    for (int l = 0; l < 4; ++l) {
      const uint32_t idx = qs[4 * ib + l] | (((h >> (3 * l)) & 7u) << 8);
      put8_signed(kIq1sGrid[idx], b->q + 32 * ib + 8 * l);
      b->delta[4 * ib + l] = int8_t((h & 0x8000u) ? -1 : 1);
    }
  }
}

// IQ1_M: indices as IQ1_S but their 3 high bits and the shift sign come from one nibble of
// qh per 8 values (bits 0..2 index, bit 3 sign); 3-bit scales per 16 values, four per 16-bit
// word of `scales` (bits 0..11), whose top nibbles together are the F16 super-scale.
void decode_iq1_m(const uint8_t* p, BlockInts* b) {
  const uint8_t* qs = p + offsetof(BlockIQ1_M, qs);
  const uint8_t* qh = p + offsetof(BlockIQ1_M, qh);
  const uint8_t* scales = p + offsetof(BlockIQ1_M, scales);
  uint32_t sc[4];
  for (int k = 0; k < 4; ++k) sc[k] = load_u16(scales + 2 * k);
  const uint16_t d16 = uint16_t((sc[0] >> 12) | ((sc[1] >> 8) & 0x00f0u) | ((sc[2] >> 4) & 0x0f00u) | (sc[3] & 0xf000u));
  b->d = fp16_to_fp32(d16);
  b->group = 16;
  b->has_delta = true;
  for (int ib = 0; ib < 8; ++ib) {
    for (int h = 0; h < 2; ++h) {
      const int s = int((sc[ib / 2] >> (6 * (ib % 2) + 3 * h)) & 7u);
      b->scale[2 * ib + h] = int16_t(2 * s + 1);
      b->dl[2 * ib + h] = b->d * float(2 * s + 1);
    }
    for (int l = 0; l < 4; ++l) {
      const uint32_t nib = (uint32_t(qh[2 * ib + l / 2]) >> (4 * (l % 2))) & 15u;
      const uint32_t idx = qs[4 * ib + l] | ((nib & 7u) << 8);
      put8_signed(kIq1sGrid[idx], b->q + 32 * ib + 8 * l);
      b->delta[4 * ib + l] = int8_t((nib & 8u) ? -1 : 1);
    }
  }
}

// IQ4_XS: per 32 values a 6-bit scale ls (low 4 bits from scales_l, two per byte, high 2 bits
// from scales_h, two per value) giving d·(ls-32); 4-bit level codes as IQ4_NL (low nibbles
// are values 0..15, high nibbles 16..31 of each 32).
void decode_iq4_xs(const uint8_t* p, BlockInts* b) {
  b->d = fp16_to_fp32(load_u16(p));
  b->group = 32;
  const uint32_t scales_h = load_u16(p + offsetof(BlockIQ4_XS, scales_h));
  const uint8_t* scales_l = p + offsetof(BlockIQ4_XS, scales_l);
  const uint8_t* qs = p + offsetof(BlockIQ4_XS, qs);
  for (int ib = 0; ib < 8; ++ib) {
    const int ls = int(((scales_l[ib / 2] >> (4 * (ib % 2))) & 15u) | (((scales_h >> (2 * ib)) & 3u) << 4));
    b->scale[ib] = int16_t(ls - 32);
    b->dl[ib] = b->d * float(ls - 32);
    for (int j = 0; j < 16; ++j) {
      b->q[32 * ib + j] = kIq4nlValues[qs[16 * ib + j] & 15];
      b->q[32 * ib + 16 + j] = kIq4nlValues[qs[16 * ib + j] >> 4];
    }
  }
}

// TQ1_0: trits t ∈ {0, 1, 2} meaning t - 1. A byte holds 5 (qs) or 4 (qh) of them as the
// fixed-point fraction byte/256 ≈ Σ t_k 3^-k: multiplying by 3^k and keeping the byte brings
// the k-th trit to the top, where (byte·3) >> 8 reads it. Element order: qs[0..31] five
// times (trit k of byte m is element 32k + m), qs[32..47] five times (160 + 16k + m), then
// qh[0..3] four times (240 + 4k + m).
int trit(uint8_t byte, int k) {
  static constexpr uint8_t kPow3[5] = {1, 3, 9, 27, 81};
  const uint8_t shifted = uint8_t(byte * kPow3[k]);  // mod 256, as ggml's uint8_t product
  return int((uint32_t(shifted) * 3u) >> 8) - 1;
}

void decode_tq1_0(const uint8_t* p, BlockInts* b) {
  set_ternary_scale(b, load_u16(p + offsetof(BlockTQ1_0, d)));
  const uint8_t* qs = p + offsetof(BlockTQ1_0, qs);
  const uint8_t* qh = p + offsetof(BlockTQ1_0, qh);
  int8_t* q = b->q;
  for (int k = 0; k < 5; ++k)
    for (int m = 0; m < 32; ++m) *q++ = int8_t(trit(qs[m], k));
  for (int k = 0; k < 5; ++k)
    for (int m = 0; m < 16; ++m) *q++ = int8_t(trit(qs[32 + m], k));
  for (int k = 0; k < 4; ++k)
    for (int m = 0; m < 4; ++m) *q++ = int8_t(trit(qh[m], k));
}

// TQ2_0: 2-bit fields holding value + 1; bits 2l..2l+1 of byte 32h + m are element 128h + 32l + m.
void decode_tq2_0(const uint8_t* p, BlockInts* b) {
  set_ternary_scale(b, load_u16(p + offsetof(BlockTQ2_0, d)));
  const uint8_t* qs = p + offsetof(BlockTQ2_0, qs);
  for (int h = 0; h < 2; ++h)
    for (int l = 0; l < 4; ++l)
      for (int m = 0; m < 32; ++m) b->q[128 * h + 32 * l + m] = int8_t(((qs[32 * h + m] >> (2 * l)) & 3) - 1);
}

// ---- IQ4 encoders ------------------------------------------------------------------------

namespace {

// For each integer f in [-128, 127]: the first level above f. The levels are integers, so
// for v[0] < x < v[15] the bracket v[hi-1] <= x < v[hi] that ggml's bisection
// (best_index_int8) finds depends on floor(x) alone; a table lookup replaces its four
// unpredictable branches (quantizing is ~2x faster, same bytes).
struct LevelAbove {
  uint8_t hi[256];
  constexpr LevelAbove() : hi{} {
    for (int f = -128; f < 128; ++f) {
      int k = 0;
      while (k < 15 && kIq4nlValues[k] <= f) ++k;
      hi[f + 128] = uint8_t(k);
    }
  }
};
constexpr LevelAbove kLevelAbove;

// The level closest to x (ties to the upper one), as ggml's best_index_int8.
int best_level(float x) {
  const int8_t* v = kIq4nlValues;
  if (x <= v[0]) return 0;
  if (x >= v[15]) return 15;
  if (x != x) return 15;  // where the bisection ends for NaN
  const int hi = kLevelAbove.hi[int(std::floor(x)) + 128];
  return x - v[hi - 1] < v[hi] - x ? hi - 1 : hi;
}

constexpr int kTries = 7;               // trial scales -7..7 around the first guess

// Best scale of one 32-value sub-block (ggml's quantize_row_iq4_nl_impl inner search, weights
// x², no importance matrix): starting from max/-127, the least-squares scale for the levels
// chosen at each of 15 trial scales, keeping the one that explains most of Σw·x².
float best_sub_block_scale(const float* x) {
  float weight[32];
  for (int j = 0; j < 32; ++j) weight[j] = x[j] * x[j];
  const SignedAbsMax peak = signed_absmax(x, 32);
  if (peak.abs < kIq4ZeroGroupMax) return 0.0f;
  const float max = peak.value;
  const float first = float(kIq4nlValues[0]);
  float d = -max / first;
  float id = 1.0f / d;
  float sumqx = 0.0f, sumq2 = 0.0f;
  for (int j = 0; j < 32; ++j) {
    const float q = float(kIq4nlValues[best_level(id * x[j])]);
    sumqx += weight[j] * q * x[j];
    sumq2 += weight[j] * q * q;
  }
  d = sumq2 > 0.0f ? sumqx / sumq2 : 0.0f;
  float best = d * sumqx;
  for (int itry = -kTries; itry <= kTries; ++itry) {
    id = float(itry + kIq4nlValues[0]) / max;
    sumqx = sumq2 = 0.0f;
    for (int j = 0; j < 32; ++j) {
      const float q = float(kIq4nlValues[best_level(id * x[j])]);
      sumqx += weight[j] * q * x[j];
      sumq2 += weight[j] * q * q;
    }
    if (sumq2 > 0.0f && sumqx * sumqx > best * sumq2) {
      d = sumqx / sumq2;
      best = d * sumqx;
    }
  }
  return d;
}

}  // namespace

void iq4_pack_levels_ref(const float* x, float id, uint8_t* qs) {
  uint8_t L[32];
  for (int j = 0; j < 32; ++j) L[j] = uint8_t(best_level(id * x[j]));
  for (int j = 0; j < 16; ++j) qs[j] = uint8_t(L[j] | (L[16 + j] << 4));
}

void iq4_scales_ref(const float* x, int64_t n_sub, float* d) {
  for (int64_t s = 0; s < n_sub; ++s) d[s] = best_sub_block_scale(x + 32 * s);
}

namespace {

// The two searches an encoder runs: the scalar ones above, or an ISA level's twins
// (kernels::IsaKernels::iq4_scales / iq4_pack_levels), which give the same bits.
struct Iq4Steps {
  void (*scales)(const float* x, int64_t n_sub, float* d);
  void (*pack)(const float* x, float id, uint8_t* qs);
};
constexpr Iq4Steps kScalarSteps{iq4_scales_ref, iq4_pack_levels_ref};

Iq4Steps active_steps() {
  const kernels::IsaKernels& k = kernels::active_table();
  return {k.iq4_scales ? k.iq4_scales : kScalarSteps.scales, k.iq4_pack_levels ? k.iq4_pack_levels : kScalarSteps.pack};
}

void encode_iq4_nl(const float* x, BlockIQ4_NL* y, const Iq4Steps& steps) {
  float d = 0.0f;
  steps.scales(x, 1, &d);
  y->d = fp32_to_fp16(d);
  uint8_t qs[16];
  steps.pack(x, d != 0.0f ? 1.0f / d : 0.0f, qs);
  std::memcpy(y->qs, qs, 16);
}

// IQ4_XS: each sub-block's best scale, then those eight scales as 6-bit multiples of an
// F16 super-scale d = -(the scale of largest magnitude)/32, and the levels chosen again
// against the rounded sub-block scales.
void encode_iq4_xs(const float* x, BlockIQ4_XS* y, const Iq4Steps& steps) {
  float scales[8];
  steps.scales(x, 8, scales);
  const float max_scale = signed_absmax(scales, 8).value;
  const float d = -max_scale / 32.0f;  // -0.0 when every sub-block is zero, stored as such
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  uint16_t scales_h = 0;
  uint8_t scales_l[4] = {};
  uint8_t qs[128];
  for (int ib = 0; ib < 8; ++ib) {
    int l = nearest_int(id * scales[ib]);
    l = l < -32 ? -32 : (l > 31 ? 31 : l);
    const float dl = d * float(l);
    steps.pack(x + 32 * ib, dl != 0.0f ? 1.0f / dl : 0.0f, qs + 16 * ib);
    const int biased = l + 32;
    scales_l[ib / 2] = uint8_t(scales_l[ib / 2] | ((biased & 15) << (4 * (ib % 2))));
    scales_h = uint16_t(scales_h | ((biased >> 4) << (2 * ib)));
  }
  y->d = fp32_to_fp16(d);
  y->scales_h = scales_h;
  std::memcpy(y->scales_l, scales_l, 4);
  std::memcpy(y->qs, qs, 128);
}

}  // namespace

bool is_super_block_type(DType t) {
  const TypeTraits* tt = type_traits(uint32_t(t));
  return tt && tt->iq_decode;
}

void decode(DType t, const uint8_t* block, BlockInts* out) {
  const TypeTraits* tt = type_traits(uint32_t(t));
  if (tt && tt->iq_decode) return tt->iq_decode(block, out);
  *out = BlockInts{};  // not a super-block type: callers check is_super_block_type first
}

void dequantize(const BlockInts& b, float* y) {
  for (int j = 0; j < 256; ++j) {
    const float dl = b.dl[j / b.group];
    if (b.has_delta) {
      y[j] = dl * (float(b.q[j]) + (b.delta[j / 8] < 0 ? -kIq1Delta : kIq1Delta));
    } else {
      y[j] = dl * float(b.q[j]);
    }
  }
}

float dot_row_factor(DType t) {
  const TypeTraits* tt = type_traits(uint32_t(t));
  return tt ? tt->dot_row_factor : 1.0f;
}

void quantize_row_iq4_nl(const float* x, void* dst, int64_t n) {
  auto* y = static_cast<BlockIQ4_NL*>(dst);
  for (int64_t b = 0; b < n / 32; ++b) encode_iq4_nl(x + 32 * b, y + b, kScalarSteps);
}

void quantize_row_iq4_xs(const float* x, void* dst, int64_t n) {
  auto* y = static_cast<BlockIQ4_XS*>(dst);
  for (int64_t b = 0; b < n / 256; ++b) encode_iq4_xs(x + 256 * b, y + b, kScalarSteps);
}

void quantize_row_iq4_nl_fast(const float* x, void* dst, int64_t n) {
  const Iq4Steps steps = active_steps();
  auto* y = static_cast<BlockIQ4_NL*>(dst);
  for (int64_t b = 0; b < n / 32; ++b) encode_iq4_nl(x + 32 * b, y + b, steps);
}

void quantize_row_iq4_xs_fast(const float* x, void* dst, int64_t n) {
  const Iq4Steps steps = active_steps();
  auto* y = static_cast<BlockIQ4_XS*>(dst);
  for (int64_t b = 0; b < n / 256; ++b) encode_iq4_xs(x + 256 * b, y + b, steps);
}

}  // namespace step35::iq
