// Q4_K, Q5_K, Q6_K and IQ / TQ weights repacked 16 rows at a time for the AVX-512 kernels.
//
// In the GGUF layout each row's blocks follow each other, so a one-token dot product
// multiplies 64 weights of ONE row per vpdpbusd and must then reduce and scale per row.
// Interleaving 16 rows puts one row in each 32-bit lane: a vpdpbusd multiplies 4 weights
// of each of the 16 rows by the same 4 activation bytes (broadcast), the per-row integer
// sums stay in their lanes, and scales, mins and the block's float step are applied to 16
// rows with one instruction each. About a third of the instructions per weight of the
// 4-row tile, which matters where the tile kernels are compute-bound: 2-thread decode and
// batches of 2-8 tokens (serving, prefill).
//
// Layout of one 16-row group, for each 256-weight block i in order (kQ4kX16BlockBytes):
//   [0, 32)      d of rows 0..15 (f16)
//   [32, 64)     dmin of rows 0..15 (f16)
//   [64, 192)    scales: sub-block s (0..7) at 64 + 16 s, one byte per row (6-bit value)
//   [192, 320)   mins in pairs: k (0..3) at 192 + 32 k, row r at bytes 2r, 2r+1 = the mins
//                of sub-blocks 2k and 2k+1 (one int16 pair per 32-bit lane once widened)
//   [320, 2368)  quants: 32 vectors of 64 bytes; vector 4 s + c holds, at bytes 4r..4r+3,
//                the 4-bit quants of row r for weights 32 s + 4 c + b (low nibbles) and
//                32 s + 16 + 4 c + b (high nibbles), b = 0..3
// The scales and mins are stored as whole bytes (not 6-bit packed): 2.8 % more bytes than
// the GGUF blocks, in exchange for one widening load per scale vector.
// Q5_K: the same 2368 bytes per block (its fifth bits left out of the nibbles), then
//   [2368, 2880) fifth bits: for quant vector v (0..31) 16 bytes at 2368 + 16 v, two 64-bit
//                masks: bit 4r + b of the first / second is bit 4 of the value in the low /
//                high nibble of byte 4r + b of vector v
// (2.9 % more bytes than the GGUF blocks).
// The integer sums and the float steps per block are the scalar reference's (dot_q4_k), so
// results are bit-identical to it.
//
// Q6_K, same idea, in two parts per group so that every vector load stays 64-byte aligned:
// first the blocks (kQ6kX16BlockBytes each), then the 16 rows' f16 d of every block (32
// bytes per block, padded to a multiple of 64). For each block:
//   [0, 256)     scales: group g (0..15, 16 weights each) at 16 g, one int8 per row
//   [256, 3328)  the quants: 3 vectors of 64 bytes per group g, at 256 + 192 g:
//                vector p (0, 1), low 4 bits: bytes 4r..4r+3 hold those of row r for
//                weights 16 g + 4 p + b (low nibbles) and 16 g + 8 + 4 p + b (high
//                nibbles), b = 0..3;
//                vector 2, high 2 bits: byte 4r + b holds the bits of row r's weights
//                16 g + 4 c + b at bits 2c, 2c + 1 (c = 0..3).
//                A group's quants are one run of 3 lines, so the kernel reads each block
//                front to back, one stream: the hardware prefetcher follows it. With the
//                high bits in a run of their own after all low bits, the kernel read two
//                interleaved streams per block, and one core streamed 13 GB/s without
//                software prefetch against 27 GB/s for one stream (docs/kernels.md).
// The kernel takes the 6-bit values unsigned (0..63) and starts each group's sum at
// -32 * (sum of its 16 activation bytes), so per group it is Σ (q - 32) y as dot_q6_k's.
// Same bytes as the GGUF rows except the padding of d (32 bytes for an odd block count).
//
// The IQ / TQ types (IQ4_XS, IQ3_S, IQ3_XXS, IQ2_S, IQ2_XS, IQ2_XXS, IQ1_M, IQ1_S, TQ2_0,
// TQ1_0), one layout for all: every weight becomes a 4-bit code into a 16-entry table of
// signed values of its type (iq_x16_values; IQ4_XS: its own 16 levels; IQ2/IQ3: the grid
// magnitudes with their sign, so no grid lookup is left for the kernel; IQ1: 8q + delta as
// the SIMD kernels use), which the kernel turns into bytes with one vpshufb per 128 codes.
// For each 256-weight block (iq_x16_block_bytes):
//   [0, S)       sub-block multipliers: sub-block g (G of them: 8 of 32 values, or 16 of 16
//                for IQ2_XS, IQ2_S, IQ1_M) at 16 g, one int8 per row (S = 16 G)
//   [S, S+2048)  codes: 32 vectors of 64 bytes; vector 4 k + c holds at bytes 4r..4r+3 the
//                codes of row r for weights 32 k + 4 c + b (low nibbles) and 32 k + 16 + 4 c
//                + b (high nibbles), b = 0..3 (for IQ4_XS simply its bytes, 4 rows apart)
// then, after the blocks, the 16 rows' f16 d of every block (32 bytes each, padded to a
// multiple of 64). The kernel sums Σ (v + 128)·y with vpdpbusd and subtracts 128·(the
// sub-block's activation sum): exactly the reference's integer sums, then its float steps.
// Bytes against the GGUF rows: IQ4_XS the same (but padding), IQ3_S 1.25x, IQ3_XXS 1.41x,
// IQ2_S 1.78x, IQ2_XS 1.97x, IQ2_XXS 2.09x, IQ1_M 2.46x, IQ1_S 2.76x.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>

#include "tensor/tensor.h"

namespace step35::kernels {

constexpr int kX16Rows = 16;  // rows per repacked group, every type
constexpr size_t kQ4kX16BlockBytes = 2368;
constexpr size_t kQ5kX16BlockBytes = 2880;  // the Q4_K layout + 512 bytes of fifth bits
constexpr size_t kQ6kX16BlockBytes = 3328;

// The signed value of each 4-bit code of the repacked IQ / TQ layout, per type (unused
// codes 0). IQ1_S / IQ1_M hold 8q + delta (q in {-1, 0, 1}, delta = ±1).
inline constexpr int8_t kIq4X16Values[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
inline constexpr int8_t kIq3sX16Values[16] = {1, 3, 5, 7, 9, 11, 13, 15, -1, -3, -5, -7, -9, -11, -13, -15};
inline constexpr int8_t kIq3xxsX16Values[16] = {4, 12, 20, 28, 36, 44, 52, 62, -4, -12, -20, -28, -36, -44, -52, -62};
inline constexpr int8_t kIq2X16Values[16] = {8, 25, 43, 0, 0, 0, 0, 0, -8, -25, -43, 0, 0, 0, 0, 0};
inline constexpr int8_t kIq1X16Values[16] = {-9, -7, -1, 1, 7, 9, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
// TQ2_0's 2-bit fields hold value + 1, so a field of 3 (never written by ggml) is 2.
inline constexpr int8_t kTqX16Values[16] = {-1, 0, 1, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
// The table of type t (one of the IQ / TQ types above), or null.
const int8_t* iq_x16_values(DType t);
// Sub-block multipliers per 256-block in the repacked IQ / TQ layout: 16 for IQ2_XS, IQ2_S
// and IQ1_M (16-value sub-blocks), else 8.
constexpr int iq_x16_groups(DType t) {
  return t == DType::IQ2_XS || t == DType::IQ2_S || t == DType::IQ1_M ? 16 : 8;
}
constexpr size_t iq_x16_block_bytes(DType t) { return size_t(16 * iq_x16_groups(t)) + 2048; }

// Bytes of one repacked 16-row group of n_in weights per row (Q4_K, Q5_K, Q6_K or an IQ / TQ
// type; 0 for other types).
size_t x16_group_bytes(DType t, int64_t n_in);

// Whether w can be repacked and the active kernel level has the repacked kernel for its
// type (the AVX-512 levels): Q4_K, Q5_K, Q6_K or an IQ / TQ type but IQ4_NL, rows a multiple
// of 16.
bool can_repack(const WeightMatrix& w);

// Bytes of the repacked copy of all w.n_mat matrices of w.
size_t repacked_bytes(const WeightMatrix& w);

// Writes the repacked copy of every matrix of w to dst (repacked_bytes(w) bytes; 64-byte
// alignment keeps every vector load inside one cache line). Matrix m starts at
// m * repacked_bytes(w) / w.n_mat.
void repack_x16(const WeightMatrix& w, uint8_t* dst);

// A 64-byte aligned, zero-initialised byte buffer for repacked weights.
struct AlignedBytes {
  struct Free {
    void operator()(uint8_t* p) const { std::free(p); }
  };
  std::unique_ptr<uint8_t, Free> ptr;
  explicit AlignedBytes(size_t n);
  uint8_t* data() const { return ptr.get(); }
};

// Address space for copies written later, a piece at a time (experts repacked on first
// use): zero pages that take memory only once written. Page aligned.
class ReservedBytes {
 public:
  explicit ReservedBytes(size_t n);
  ~ReservedBytes();
  ReservedBytes(const ReservedBytes&) = delete;
  ReservedBytes& operator=(const ReservedBytes&) = delete;
  uint8_t* data() const { return p_; }

 private:
  uint8_t* p_ = nullptr;
  size_t n_ = 0;
};

// Repacks w (which must satisfy can_repack) into a new buffer and points w.packed at it.
AlignedBytes repack(WeightMatrix& w);
// The same into dst (repacked_bytes(w) bytes, 64-byte aligned), e.g. a slice of one
// buffer shared by many matrices.
void repack_into(WeightMatrix& w, uint8_t* dst);

}  // namespace step35::kernels
