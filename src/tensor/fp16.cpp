// IEEE binary16 / bfloat16 conversions done on the bit patterns, so the result is the same
// on every host (no reliance on F16C or on the compiler's _Float16 support).
#include "tensor/fp16.h"

namespace step35 {

namespace {
uint32_t f32_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float bits_f32(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
}  // namespace

float fp16_to_fp32(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  if (exp == 0x1f)  // inf / NaN: keep the payload (and thus quiet/signalling) bits
    return bits_f32(sign | 0x7f800000u | (mant << 13));
  if (exp != 0)  // normal: rebias 15 -> 127
    return bits_f32(sign | ((exp + 112u) << 23) | (mant << 13));
  if (mant == 0) return bits_f32(sign);
  // Subnormal half (mant · 2^-24) is a normal float: shift the leading one up to bit 10.
  int e = 113;  // biased float exponent of 2^-14, the subnormal range's top
  while ((mant & 0x400u) == 0) {
    mant <<= 1;
    --e;
  }
  return bits_f32(sign | (uint32_t(e) << 23) | ((mant & 0x3ffu) << 13));
}

uint16_t fp32_to_fp16(float f) {
  const uint32_t u = f32_bits(f);
  const uint16_t sign = uint16_t((u >> 16) & 0x8000u);
  const uint32_t x = u & 0x7fffffffu;
  if (x > 0x7f800000u)  // NaN: keep the top payload bits, force quiet (as F16C does)
    return uint16_t(sign | 0x7e00u | ((x >> 13) & 0x3ffu));
  if (x >= 0x47800000u)  // >= 2^16 (or inf): beyond anything that rounds to a finite half
    return uint16_t(sign | 0x7c00u);
  if (x >= 0x38800000u) {  // >= 2^-14: normal half
    const uint32_t m = x - 0x38000000u;  // rebias exponent 127 -> 15 (112 << 23)
    uint32_t h = m >> 13;
    const uint32_t rem = m & 0x1fffu;
    // Round to nearest even; a mantissa carry correctly bumps the exponent (to inf at 65520).
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;
    return uint16_t(sign | h);
  }
  if (x < 0x33000000u) return sign;  // < 2^-25: rounds to zero (2^-25 itself is a tie -> 0)
  // Subnormal half: value / 2^-24 = mant24 · 2^(e - 126), e = biased float exponent.
  const uint32_t e = x >> 23;  // 102 .. 112
  const uint32_t mant = (x & 0x7fffffu) | 0x800000u;
  const uint32_t shift = 126u - e;  // 14 .. 24
  uint32_t h = mant >> shift;
  const uint32_t rem = mant & ((1u << shift) - 1u);
  const uint32_t half = 1u << (shift - 1u);
  if (rem > half || (rem == half && (h & 1u))) ++h;  // may carry into the smallest normal
  return uint16_t(sign | h);
}

uint16_t fp32_to_bf16(float f) {
  const uint32_t u = f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u)  // NaN: truncating could make it inf; set quiet bit
    return uint16_t((u >> 16) | 0x40u);
  // Round to nearest even on the dropped 16 bits (overflow to inf is the correct rounding).
  return uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

}  // namespace step35
