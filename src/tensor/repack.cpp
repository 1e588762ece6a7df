#include "tensor/repack.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstring>
#include <new>
#include <string>
#include <stdexcept>

#include "tensor/kernels.h"
#include "tensor/quants.h"
#include "tensor/quants_iq.h"
#include "tensor/type_traits.h"

namespace step35::kernels {

namespace {

// The 4-bit quant of weight k (0..255) of a Q4_K block: sub-blocks 2j / 2j+1 are the low /
// high nibbles of bytes 32 j .. 32 j + 31.
int q4k_quant(const BlockQ4_K& b, int k) {
  const int s = k / 32, l = k % 32;
  const uint8_t byte = b.qs[32 * (s / 2) + l];
  return s % 2 == 0 ? (byte & 15) : (byte >> 4);
}

// The 5-bit quant of weight k of a Q5_K block: the Q4_K nibble, bit 4 from bit k / 32 of
// qh[k % 32].
int q5k_quant(const BlockQ5_K& b, int k) {
  const int s = k / 32, l = k % 32;
  const uint8_t byte = b.qs[32 * (s / 2) + l];
  return (s % 2 == 0 ? (byte & 15) : (byte >> 4)) | (((b.qh[l] >> s) & 1) << 4);
}

// Q4_K, or Q5_K (rows_q5 set, rows unused): the Q5_K fields d, dmin, scales and qs sit where
// Q4_K's do, so the Q4_K part is written from them alike, then the fifth bits.
void repack_group(const BlockQ4_K* const* rows, int64_t n_blocks, uint8_t* dst,
                  const BlockQ5_K* const* rows_q5 = nullptr) {
  const size_t block_bytes = rows_q5 ? kQ5kX16BlockBytes : kQ4kX16BlockBytes;
  for (int64_t i = 0; i < n_blocks; ++i) {
    uint8_t* out = dst + size_t(i) * block_bytes;
    std::memset(out, 0, block_bytes);
    for (int r = 0; r < kX16Rows; ++r) {
      BlockQ4_K b;
      if (rows_q5) {
        const BlockQ5_K& q5 = rows_q5[r][i];
        b.d = q5.d;
        b.dmin = q5.dmin;
        std::memcpy(b.scales, q5.scales, sizeof b.scales);
        std::memcpy(b.qs, q5.qs, sizeof b.qs);
        for (int v = 0; v < 32; ++v)  // vector v = 4 s + c
          for (int k = 0; k < 4; ++k) {
            const int s = v / 4, c = v % 4;
            const int lo = q5k_quant(q5, 32 * s + 4 * c + k), hi = q5k_quant(q5, 32 * s + 16 + 4 * c + k);
            const int bit = 4 * r + k;
            out[kQ4kX16BlockBytes + 16 * v + bit / 8] |= uint8_t(((lo >> 4) & 1) << (bit % 8));
            out[kQ4kX16BlockBytes + 16 * v + 8 + bit / 8] |= uint8_t(((hi >> 4) & 1) << (bit % 8));
          }
      } else {
        b = rows[r][i];
      }
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

// The 6-bit quant (0..63) of weight k of a Q6_K block, as dot_q6_k unpacks it: in each
// 128-weight half h, weights l, l+32, l+64, l+96 take the low / high nibbles of ql bytes
// l and l+32 and bit pairs 0-1, 2-3, 4-5, 6-7 of qh byte l.
int q6k_quant(const BlockQ6_K& b, int k) {
  const int h = k / 128, j = k % 128, quarter = j / 32, l = j % 32;
  const uint8_t* ql = b.ql + 64 * h;
  const uint8_t* qh = b.qh + 32 * h;
  const int low = quarter == 0 ? (ql[l] & 15) : quarter == 1 ? (ql[l + 32] & 15) : quarter == 2 ? (ql[l] >> 4) : (ql[l + 32] >> 4);
  return low | (((qh[l] >> (2 * quarter)) & 3) << 4);
}

void repack_group_q6k(const BlockQ6_K* const* rows, int64_t n_blocks, uint8_t* dst) {
  std::memset(dst, 0, x16_group_bytes(DType::Q6_K, n_blocks * 256));
  uint8_t* d_part = dst + size_t(n_blocks) * kQ6kX16BlockBytes;
  for (int64_t i = 0; i < n_blocks; ++i) {
    uint8_t* out = dst + size_t(i) * kQ6kX16BlockBytes;
    for (int r = 0; r < kX16Rows; ++r) {
      const BlockQ6_K& b = rows[r][i];
      std::memcpy(d_part + 32 * i + 2 * r, &b.d, 2);
      for (int g = 0; g < 16; ++g) {
        out[16 * g + r] = uint8_t(b.scales[g]);
        for (int c = 0; c < 4; ++c)
          for (int k = 0; k < 4; ++k) {
            const int q = q6k_quant(b, 16 * g + 4 * c + k);
            // Low nibbles: c = 0, 1 in the group's vectors 0, 1 (low half of the byte),
            // c = 2, 3 in the same vectors' high halves; the high bits in its vector 2.
            uint8_t* vectors = out + 256 + 192 * g;
            vectors[64 * (c % 2) + 4 * r + k] |= uint8_t((q & 15) << (4 * (c / 2)));
            vectors[128 + 4 * r + k] |= uint8_t((q >> 4) << (2 * c));
          }
      }
    }
  }
}

// The F16 super-scale of an IQ / TQ block as stored (IQ1_M spreads it over the top nibbles
// of its four scale words).
uint16_t iq_d_bits(DType t, const uint8_t* block) {
  uint16_t v[4];
  switch (t) {
    case DType::TQ1_0: std::memcpy(v, block + offsetof(BlockTQ1_0, d), 2); return v[0];
    case DType::TQ2_0: std::memcpy(v, block + offsetof(BlockTQ2_0, d), 2); return v[0];
    case DType::IQ1_M:
      std::memcpy(v, block + offsetof(BlockIQ1_M, scales), 8);
      return uint16_t((v[0] >> 12) | ((v[1] >> 8) & 0x00f0u) | ((v[2] >> 4) & 0x0f00u) | (v[3] & 0xf000u));
    default: std::memcpy(v, block, 2); return v[0];
  }
}

// One 16-row group of an IQ / TQ type in the code layout (repack.h): each block decoded to
// its integer form (iq::decode), each value replaced by its code in the type's table.
// IQ4_XS's codes are its own nibbles in the same places, so its bytes are only moved.
void repack_group_iq(DType t, const uint8_t* const* rows, int64_t n_blocks, uint8_t* dst) {
  const int8_t* values = iq_x16_values(t);
  // The code of each int8 value (at value + 128), -1 for none. The zero entries of a table
  // are unused codes, except in the TQ types' (code 1 stands for 0).
  const bool zero_is_value = t == DType::TQ1_0 || t == DType::TQ2_0;
  int code_of[256];
  for (int& c : code_of) c = -1;
  for (int c = 0; c < 16; ++c)
    if (values[c] != 0 || (zero_is_value && c == 1)) code_of[values[c] + 128] = c;
  const int groups = iq_x16_groups(t);
  const size_t block_bytes = iq_x16_block_bytes(t);
  const size_t src_bytes = dtype_info(t).block_bytes;
  uint8_t* d_part = dst + size_t(n_blocks) * block_bytes;
  std::memset(d_part, 0, x16_group_bytes(t, n_blocks * 256) - size_t(n_blocks) * block_bytes);  // padding
  iq::BlockInts b;
  uint8_t code[256];
  for (int64_t i = 0; i < n_blocks; ++i) {
    uint8_t* out = dst + size_t(i) * block_bytes;
    uint8_t* codes = out + 16 * groups;
    for (int r = 0; r < kX16Rows; ++r) {
      const uint8_t* src = rows[r] + size_t(i) * src_bytes;
      const uint16_t d = iq_d_bits(t, src);
      std::memcpy(d_part + 32 * i + 2 * r, &d, 2);
      if (t == DType::IQ4_XS) {
        const auto& blk = *reinterpret_cast<const BlockIQ4_XS*>(src);
        for (int g = 0; g < 8; ++g) {
          const int ls = ((blk.scales_l[g / 2] >> (4 * (g % 2))) & 15) | (((blk.scales_h >> (2 * g)) & 3) << 4);
          out[16 * g + r] = uint8_t(int8_t(ls - 32));
          // Weights 32 g + 4 c + bb (low nibbles) and 32 g + 16 + 4 c + bb (high) are byte
          // 16 g + 4 c + bb of qs: four bytes per vector.
          for (int c = 0; c < 4; ++c) std::memcpy(codes + 64 * (4 * g + c) + 4 * r, blk.qs + 16 * g + 4 * c, 4);
        }
        continue;
      }
      iq::decode(t, src, &b);
      for (int g = 0; g < groups; ++g) out[16 * g + r] = uint8_t(int8_t(b.scale[g * 256 / groups / b.group]));
      for (int k = 0; k < 256; ++k) {
        const int v = b.has_delta ? 8 * b.q[k] + b.delta[k / 8] : b.q[k];
        const int c = code_of[v + 128];
        if (c < 0)
          throw std::logic_error(std::string("repack_x16: ") + dtype_name(t) + " value " + std::to_string(v) +
                                 " outside the code table");
        code[k] = uint8_t(c);
      }
      // Weights 32 kc + 4 c + bb (low nibble) and 32 kc + 16 + 4 c + bb (high): vector
      // 4 kc + c, byte 4 r + bb.
      for (int kc = 0; kc < 8; ++kc)
        for (int c = 0; c < 4; ++c)
          for (int bb = 0; bb < 4; ++bb)
            codes[64 * (4 * kc + c) + 4 * r + bb] =
                uint8_t(code[32 * kc + 4 * c + bb] | code[32 * kc + 16 + 4 * c + bb] << 4);
    }
  }
}

}  // namespace

const int8_t* iq_x16_values(DType t) {
  const TypeTraits* tt = type_traits(uint32_t(t));
  return tt ? tt->x16_values : nullptr;
}

size_t x16_group_bytes(DType t, int64_t n_in) {
  const TypeTraits* tt = type_traits(uint32_t(t));
  if (!tt || tt->x16_block_bytes == 0) return 0;
  const size_t nb = size_t(n_in / 256);
  return nb * tt->x16_block_bytes + (tt->x16_d_part ? (nb * 32 + 63) / 64 * 64 : 0);
}

bool can_repack(const WeightMatrix& w) {
  if (!w.present() || w.n_in % 256 != 0 || w.n_out % kX16Rows != 0) return false;
  return has_repacked(w.type);
}

size_t repacked_bytes(const WeightMatrix& w) {
  return x16_group_bytes(w.type, w.n_in) * size_t(w.n_out / kX16Rows) * size_t(w.n_mat);
}

void repack_x16(const WeightMatrix& w, uint8_t* dst) {
  if (x16_group_bytes(w.type, 256) == 0 || w.n_in % 256 != 0 || w.n_out % kX16Rows != 0)
    throw std::invalid_argument(std::string("repack_x16: needs Q4_K, Q5_K, Q6_K or IQ / TQ rows (not ") + dtype_name(w.type) +
                                "), a multiple of 16 of them");
  const int64_t nb = w.n_in / 256;
  const size_t group_bytes = x16_group_bytes(w.type, w.n_in);
  for (int64_t m = 0; m < w.n_mat; ++m)
    for (int64_t g = 0; g < w.n_out / kX16Rows; ++g) {
      const uint8_t* rows[kX16Rows];
      for (int r = 0; r < kX16Rows; ++r) rows[r] = w.row(g * kX16Rows + r, m);
      uint8_t* out = dst + (size_t(m) * size_t(w.n_out / kX16Rows) + size_t(g)) * group_bytes;
      if (w.type == DType::Q6_K)
        repack_group_q6k(reinterpret_cast<const BlockQ6_K* const*>(rows), nb, out);
      else if (w.type == DType::Q4_K)
        repack_group(reinterpret_cast<const BlockQ4_K* const*>(rows), nb, out);
      else if (w.type == DType::Q5_K)
        repack_group(nullptr, nb, out, reinterpret_cast<const BlockQ5_K* const*>(rows));
      else
        repack_group_iq(w.type, rows, nb, out);
    }
}

AlignedBytes::AlignedBytes(size_t n) {
  // 64-byte alignment keeps every vector load inside one cache line. (Transparent huge
  // pages via MADV_HUGEPAGE were tried: no faster at 2 threads, and one-thread decode,
  // which does not even read this buffer, became erratic: 184-232 t/s against 192-234.
  // On the real-proportion slice, where one-thread decode streams ~1 GB of repacked
  // weights per token, huge pages here and on the expert space measured 0.91x, paired.)
  const size_t rounded = std::max<size_t>(64, (n + 63) / 64 * 64);
  ptr.reset(static_cast<uint8_t*>(std::aligned_alloc(64, rounded)));
  if (!ptr) throw std::bad_alloc();
  std::memset(ptr.get(), 0, rounded);
}

ReservedBytes::ReservedBytes(size_t n) : n_(std::max<size_t>(n, 1)) {
  // MAP_NORESERVE: address space only; a page counts once a copy is written into it.
  void* p = mmap(nullptr, n_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) throw std::bad_alloc();
  p_ = static_cast<uint8_t*>(p);
}

ReservedBytes::~ReservedBytes() {
  if (p_) munmap(p_, n_);
}

AlignedBytes repack(WeightMatrix& w) {
  AlignedBytes buf(repacked_bytes(w));
  repack_into(w, buf.data());
  return buf;
}

void repack_into(WeightMatrix& w, uint8_t* dst) {
  repack_x16(w, dst);
  w.packed = dst;
  w.packed_mat_bytes = repacked_bytes(w) / size_t(w.n_mat);
}

}  // namespace step35::kernels
