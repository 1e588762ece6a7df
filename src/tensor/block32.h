// The 32-element block types (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, MXFP4) as 32 integer
// levels and a float step, the one decoding that both the dequantizers (tensor/quants.cpp)
// and the scalar dot products (tensor/kernels_ref.cpp) build on. Element j of a nibble
// type is the low nibble of byte j, element j + 16 its high nibble; the fifth bit of Q5_0 /
// Q5_1 comes from bit j of the little-endian 32-bit qh word.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "tensor/fp16.h"
#include "tensor/iq_grids.h"
#include "tensor/quants.h"

namespace step35 {

// E2M1 values doubled (so they are integers); block_step halves the scale to compensate.
inline constexpr int8_t kMxfp4Doubled[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

// The 32 nibbles of qs[0..15], each mapped through level().
template <typename Level>
void unpack_nibbles(const uint8_t* qs, int* q, Level level) {
  for (int j = 0; j < 16; ++j) {
    q[j] = level(qs[j] & 15);
    q[j + 16] = level(qs[j] >> 4);
  }
}

// The 32 five-bit values of a Q5 block (nibble plus bit j of qh), minus offset.
inline void unpack_5bit(const uint8_t* qs, const uint8_t* qh_bytes, int offset, int* q) {
  uint32_t qh;
  std::memcpy(&qh, qh_bytes, 4);  // GGUF is little-endian and so are the hosts we build for
  for (int j = 0; j < 16; ++j) {
    q[j] = ((qs[j] & 15) | int(((qh >> j) & 1u) << 4)) - offset;
    q[j + 16] = ((qs[j] >> 4) | int(((qh >> (j + 16)) & 1u) << 4)) - offset;
  }
}

// Block b's 32 levels: signed for the symmetric types, unsigned (the min not applied) for
// Q4_1 / Q5_1.
template <typename Block>
void block_levels(const Block& b, int* q) {
  if constexpr (std::is_same_v<Block, BlockQ8_0>) {
    for (int j = 0; j < 32; ++j) q[j] = b.qs[j];
  } else if constexpr (std::is_same_v<Block, BlockQ4_0>) {
    unpack_nibbles(b.qs, q, [](int v) { return v - 8; });
  } else if constexpr (std::is_same_v<Block, BlockQ4_1>) {
    unpack_nibbles(b.qs, q, [](int v) { return v; });
  } else if constexpr (std::is_same_v<Block, BlockQ5_0>) {
    unpack_5bit(b.qs, b.qh, 16, q);
  } else if constexpr (std::is_same_v<Block, BlockQ5_1>) {
    unpack_5bit(b.qs, b.qh, 0, q);
  } else if constexpr (std::is_same_v<Block, BlockIQ4_NL>) {
    unpack_nibbles(b.qs, q, [](int v) { return int(iq::kIq4nlValues[v]); });
  } else {
    static_assert(std::is_same_v<Block, BlockMXFP4>);
    unpack_nibbles(b.qs, q, [](int v) { return int(kMxfp4Doubled[v]); });
  }
}

// The float value of one level step. MXFP4: 2^(e-128), halved for the doubled levels; every
// e in 0..255 is representable (e = 0, 1 are float denormals) and ldexp is exact for these.
template <typename Block>
float block_step(const Block& b) {
  if constexpr (std::is_same_v<Block, BlockMXFP4>)
    return std::ldexp(1.0f, int(b.e) - 128);
  else
    return fp16_to_fp32(b.d);
}

// Q4_1 / Q5_1 carry a min, added after scaling.
template <typename Block>
inline constexpr bool kBlockHasMin = std::is_same_v<Block, BlockQ4_1> || std::is_same_v<Block, BlockQ5_1>;

}  // namespace step35
