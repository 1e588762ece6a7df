// The private layout of a head's keys in one KV cache block (kv_kernels.h) and the
// converted query row for integer keys, shared by the scalar and SIMD kernel files.
#pragma once

#include <cstddef>
#include <cstdint>

namespace step35::kernels {

// A query block of 32 dimensions rounded to Q8_0 (ggml's encoder): the F16 scale as F32,
// the sum of the integers (the integer keys are stored with an offset, see below) and the
// integers themselves.
struct QueryQ8 {
  float d;
  int32_t sum;
  int8_t qs[32];
};
static_assert(sizeof(QueryQ8) == 40);

// Q8_0 keys: stored integer + 128, so the 8-bit dot product instructions can take the
// key as the unsigned operand; Q4_0 keys: the nibble n (value n - 8). The true integer dot
// product of a 32-dimension block is then sum(u * q) - offset * sum(q).
constexpr int32_t kKeyOffsetQ8_0 = 128;
constexpr int32_t kKeyOffsetQ4_0 = 8;

// Byte offsets inside a head block of bs positions and d dimensions (d a multiple of 32):
// the scales [d/32][bs] (F16) come first, then the integers.
inline size_t key_scale_bytes(int64_t d, int32_t bs) { return size_t(d / 32) * size_t(bs) * 2; }
// Q8_0: the byte of dimension i of position j, in [d/4][bs][4].
inline size_t key_q8_index(int64_t i, int32_t j, int32_t bs) {
  return (size_t(i / 4) * size_t(bs) + size_t(j)) * 4 + size_t(i % 4);
}
// Q4_0: the byte holding dimension i of position j, in [d/8][bs][4]; dimensions 8g..8g+3
// are the low nibbles of the 4 bytes, 8g+4..8g+7 the high nibbles.
inline size_t key_q4_index(int64_t i, int32_t j, int32_t bs) {
  return (size_t(i / 8) * size_t(bs) + size_t(j)) * 4 + size_t(i % 4);
}
inline bool key_q4_high(int64_t i) { return (i % 8) >= 4; }

}  // namespace step35::kernels
