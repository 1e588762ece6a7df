// The codebooks of the IQ quant types: data of the GGUF format, reproduced value for value
// from ggml's type definitions (ggml-common.h at llama.cpp de3ff81; tested entry by entry
// against checksums of those tables in tests/test_quants.cpp). A block stores indices into
// these grids plus sign bits and scales; tensor/quants_iq.h turns them into values.
#pragma once

#include <cstdint>

namespace step35::iq {

// Each entry packs 8 (uint64) or 4 (uint32) unsigned magnitudes, element 0 in the low byte;
// the signs are stored separately in the blocks.
extern const uint64_t kIq2xxsGrid[256];
extern const uint64_t kIq2xsGrid[512];
extern const uint64_t kIq2sGrid[1024];
extern const uint32_t kIq3xxsGrid[256];
extern const uint32_t kIq3sGrid[512];
// IQ1_S / IQ1_M: 8 signed values in {-1, 0, 1} per entry, as int8 bytes.
extern const uint64_t kIq1sGrid[2048];

// IQ4_NL / IQ4_XS: the 16 non-uniform levels a 4-bit code selects.
inline constexpr int8_t kIq4nlValues[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                            1,    13,   25,  38,  53,  69,  89,  113};

// IQ1_S / IQ1_M: every value of an 8-group is shifted by ±kIq1Delta (the sign is one bit
// per group).
inline constexpr float kIq1Delta = 0.125f;

// IQ2_XXS, IQ2_XS and IQ3_XXS store 7 sign bits per 8 values: the eighth sign is implied,
// chosen so that the number of minus signs is even. Bit j of the result is the sign of
// element j (1 = negative). (ggml keeps this as the 128-entry table ksigns_iq2xs.)
constexpr uint8_t expand_signs7(uint32_t seven_bits) {
  const uint32_t s = seven_bits & 127u;
  uint32_t parity = 0;
  for (int b = 0; b < 7; ++b) parity ^= (s >> b) & 1u;
  return uint8_t(s | (parity << 7));
}

// Byte `j` (0-based) of a packed grid entry.
constexpr uint8_t grid_byte(uint64_t entry, int j) { return uint8_t(entry >> (8 * j)); }

}  // namespace step35::iq
