// IEEE binary16 and bfloat16 <-> float32 conversions (scalar, exact, round-to-nearest-even).
#pragma once

#include <cstdint>
#include <cstring>

namespace step35 {

float fp16_to_fp32(uint16_t h);
uint16_t fp32_to_fp16(float f);

inline float bf16_to_fp32(uint16_t b) {
  uint32_t bits = uint32_t(b) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}
uint16_t fp32_to_bf16(float f);  // round-to-nearest-even, NaN kept quiet

}  // namespace step35
