#include "tensor/repack.h"

#include <algorithm>
#include <cstring>
#include <new>
#include <stdexcept>

#include "tensor/kernels.h"
#include "tensor/quants.h"

namespace step35::kernels {

namespace {

// The 4-bit quant of weight k (0..255) of a Q4_K block: sub-blocks 2j / 2j+1 are the low /
// high nibbles of bytes 32 j .. 32 j + 31.
int q4k_quant(const BlockQ4_K& b, int k) {
  const int s = k / 32, l = k % 32;
  const uint8_t byte = b.qs[32 * (s / 2) + l];
  return s % 2 == 0 ? (byte & 15) : (byte >> 4);
}

void repack_group(const BlockQ4_K* const* rows, int64_t n_blocks, uint8_t* dst) {
  for (int64_t i = 0; i < n_blocks; ++i) {
    uint8_t* out = dst + size_t(i) * kQ4kX16BlockBytes;
    std::memset(out, 0, kQ4kX16BlockBytes);
    for (int r = 0; r < kQ4kX16Rows; ++r) {
      const BlockQ4_K& b = rows[r][i];
      std::memcpy(out + 2 * r, &b.d, 2);
      std::memcpy(out + 32 + 2 * r, &b.dmin, 2);
      for (int s = 0; s < 8; ++s) {
        int sc, m;
        k4_scale_min(b.scales, s, &sc, &m);
        out[64 + 16 * s + r] = uint8_t(sc);
        out[192 + 32 * (s / 2) + 2 * r + s % 2] = uint8_t(m);
      }
      for (int s = 0; s < 8; ++s)
        for (int c = 0; c < 4; ++c)
          for (int k = 0; k < 4; ++k) {
            const int lo = q4k_quant(b, 32 * s + 4 * c + k),
                      hi = q4k_quant(b, 32 * s + 16 + 4 * c + k);
            out[320 + 64 * (4 * s + c) + 4 * r + k] = uint8_t(lo | hi << 4);
          }
    }
  }
}

}  // namespace

bool can_repack(const WeightMatrix& w) {
  return w.present() && w.type == DType::Q4_K && w.n_in % 256 == 0 && w.n_out % kQ4kX16Rows == 0 &&
         has_repacked_q4k();
}

size_t repacked_bytes(const WeightMatrix& w) {
  return size_t(w.n_in / 256) * kQ4kX16BlockBytes * size_t(w.n_out / kQ4kX16Rows) * size_t(w.n_mat);
}

void repack_q4k_x16(const WeightMatrix& w, uint8_t* dst) {
  if (w.type != DType::Q4_K || w.n_in % 256 != 0 || w.n_out % kQ4kX16Rows != 0)
    throw std::invalid_argument("repack_q4k_x16: needs Q4_K rows, a multiple of 16 of them");
  const int64_t nb = w.n_in / 256;
  const size_t group_bytes = size_t(nb) * kQ4kX16BlockBytes;
  for (int64_t m = 0; m < w.n_mat; ++m)
    for (int64_t g = 0; g < w.n_out / kQ4kX16Rows; ++g) {
      const BlockQ4_K* rows[kQ4kX16Rows];
      for (int r = 0; r < kQ4kX16Rows; ++r)
        rows[r] = reinterpret_cast<const BlockQ4_K*>(w.row(g * kQ4kX16Rows + r, m));
      repack_group(rows, nb,
                   dst + (size_t(m) * size_t(w.n_out / kQ4kX16Rows) + size_t(g)) * group_bytes);
    }
}

AlignedBytes::AlignedBytes(size_t n) {
  // 64-byte alignment keeps every vector load inside one cache line. (Transparent huge
  // pages via MADV_HUGEPAGE were tried: no faster at 2 threads, and one-thread decode,
  // which does not even read this buffer, became erratic: 184-232 t/s against 192-234.)
  const size_t rounded = std::max<size_t>(64, (n + 63) / 64 * 64);
  ptr.reset(static_cast<uint8_t*>(std::aligned_alloc(64, rounded)));
  if (!ptr) throw std::bad_alloc();
  std::memset(ptr.get(), 0, rounded);
}

AlignedBytes repack(WeightMatrix& w) {
  AlignedBytes buf(repacked_bytes(w));
  repack_into(w, buf.data());
  return buf;
}

void repack_into(WeightMatrix& w, uint8_t* dst) {
  repack_q4k_x16(w, dst);
  w.packed = dst;
  w.packed_mat_bytes = repacked_bytes(w) / size_t(w.n_mat);
}

}  // namespace step35::kernels
