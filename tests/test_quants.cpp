// Tests of the element types: the dtype table, half/bfloat16 conversions, and the scalar
// reference kernels (dequantize / dot / quantize) of every type in
// ../shared/docs/step35-model.md §7.
//
// Expected values are never taken from the code under test: hand-built blocks are written
// byte by byte at the offsets of §7, and each expected element is computed in this file
// from an element-wise statement of the formula (which sub-block, byte and bit element i
// uses), a different formulation from the block loops of quants.cpp. Real llama.cpp data
// (the tiny-* GGUF fixtures) checks the same code against what llama-quantize produced.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <iterator>
#include <limits>
#include <map>
#include <random>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "support.h"
#include "tensor/dtype.h"
#include "tensor/fp16.h"
#include "tensor/iq_grids.h"
#include "tensor/quants.h"
#include "tensor/quants_iq.h"

using namespace step35;

namespace {

// ---- small helpers -----------------------------------------------------------------------

// A block buffer filled at explicit byte offsets (little-endian), independent of the structs.
struct Bytes {
  std::vector<uint8_t> b;
  explicit Bytes(size_t n) : b(n, 0) {}
  void u8(size_t off, uint8_t v) { b.at(off) = v; }
  void u16(size_t off, uint16_t v) {
    b.at(off) = uint8_t(v & 0xff);
    b.at(off + 1) = uint8_t(v >> 8);
  }
  void u32(size_t off, uint32_t v) {
    for (int k = 0; k < 4; ++k) b.at(off + k) = uint8_t(v >> (8 * k));
  }
  uint16_t get16(size_t off) const { return uint16_t(b.at(off) | (b.at(off + 1) << 8)); }
  uint32_t get32(size_t off) const {
    return uint32_t(b.at(off)) | uint32_t(b.at(off + 1)) << 8 | uint32_t(b.at(off + 2)) << 16 |
           uint32_t(b.at(off + 3)) << 24;
  }
  void append(const Bytes& o) { b.insert(b.end(), o.b.begin(), o.b.end()); }
};

// Half bits of a test value chosen to be exactly representable (checked).
uint16_t H(float f) {
  const uint16_t h = fp32_to_fp16(f);
  EXPECT_EQ(fp16_to_fp32(h), f) << "test value not representable in f16: " << f;
  return h;
}

// Value of a half bit pattern from its definition (independent of fp16_to_fp32).
double half_value(uint16_t h) {
  const int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
  double v = e == 0 ? std::ldexp(double(m), -24) : std::ldexp(double(1024 + m), e - 25);
  return s ? -v : v;
}

// Dequantizes `bytes` (n elements) and also from a copy at an odd address, which must give
// the same floats: rows inside a GGUF blob have no alignment guarantee.
std::vector<float> deq(DType t, const std::vector<uint8_t>& bytes, int64_t n) {
  EXPECT_EQ(row_bytes(t, n).value_or(0), bytes.size());
  std::vector<float> y(size_t(n), -12345.0f);
  dequantize_row_ref(t, bytes.data(), y.data(), n);
  std::vector<uint8_t> shifted(bytes.size() + 1);
  std::memcpy(shifted.data() + 1, bytes.data(), bytes.size());
  std::vector<float> y2(size_t(n), -54321.0f);
  dequantize_row_ref(t, shifted.data() + 1, y2.data(), n);
  for (int64_t i = 0; i < n; ++i) {
    EXPECT_EQ(std::memcmp(&y[size_t(i)], &y2[size_t(i)], 4), 0) << "unaligned copy differs at " << i;
  }
  return y;
}

uint8_t pat1(int j) { return uint8_t(j | ((15 - j) << 4)); }  // every nibble in both halves
uint8_t pat2(int j) { return uint8_t(((j * 3) & 15) | (((j * 7 + 1) & 15) << 4)); }

// ---- element-wise reference decoders (formulas of §7, stated per element) ----------------
// blk points at one block; i is the element index inside it.

float ref_q8_0(const Bytes& B, size_t o, int i) {
  return float(half_value(B.get16(o)) * double(int8_t(B.b[o + 2 + i])));
}
int nib32(const Bytes& B, size_t qs, int i) {  // 32-element blocks: low nibbles first
  const uint8_t v = B.b[qs + (i % 16)];
  return i < 16 ? (v & 15) : (v >> 4);
}
float ref_q4_0(const Bytes& B, size_t o, int i) {
  return float(half_value(B.get16(o)) * (nib32(B, o + 2, i) - 8));
}
float ref_q4_1(const Bytes& B, size_t o, int i) {
  return float(half_value(B.get16(o)) * nib32(B, o + 4, i) + half_value(B.get16(o + 2)));
}
float ref_q5_0(const Bytes& B, size_t o, int i) {  // element i takes bit i of qh
  const int q = nib32(B, o + 6, i) + 16 * int((B.get32(o + 2) >> i) & 1);
  return float(half_value(B.get16(o)) * (q - 16));
}
float ref_q5_1(const Bytes& B, size_t o, int i) {
  const int q = nib32(B, o + 8, i) + 16 * int((B.get32(o + 4) >> i) & 1);
  return float(half_value(B.get16(o)) * q + half_value(B.get16(o + 2)));
}
const int kE2M1x2[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};
float ref_mxfp4(const Bytes& B, size_t o, int i) {
  return float(std::ldexp(double(kE2M1x2[nib32(B, o + 1, i)]), int(B.b[o]) - 128));
}

// Q4_K / Q5_K sub-block b's 6-bit (scale, min) read out of the 12 scale bytes at s.
void k4_decode(const Bytes& B, size_t s, int b, int* sc, int* m) {
  if (b < 4) {
    *sc = B.b[s + b] & 0x3f;
    *m = B.b[s + b + 4] & 0x3f;
  } else {
    *sc = (B.b[s + b + 4] & 0x0f) + 16 * (B.b[s + b - 4] >> 6);
    *m = (B.b[s + b + 4] >> 4) + 16 * (B.b[s + b] >> 6);
  }
}
// Element i of a Q4_K/Q5_K super-block: sub-block b = i/32, byte 32·(i/64) + i%32 of qs,
// low nibble for even b, high for odd; Q5_K's fifth bit is bit b of qh[i%32].
float ref_q45_k(const Bytes& B, size_t o, int i, bool five) {
  const size_t qs = o + (five ? 48 : 16);
  const int b = i / 32, l = i % 32;
  const uint8_t v = B.b[qs + 32 * (i / 64) + l];
  int q = (b % 2 == 0) ? (v & 15) : (v >> 4);
  if (five) q += 16 * ((B.b[o + 16 + l] >> b) & 1);
  int sc, m;
  k4_decode(B, o + 4, b, &sc, &m);
  return float(half_value(B.get16(o)) * sc * q - half_value(B.get16(o + 2)) * m);
}
float ref_q4_k(const Bytes& B, size_t o, int i) { return ref_q45_k(B, o, i, false); }
float ref_q5_k(const Bytes& B, size_t o, int i) { return ref_q45_k(B, o, i, true); }
// Element i of Q6_K: half n = i/128, group g = (i%128)/32 picks ql byte (+32 for odd g),
// nibble (high for g >= 2) and qh bit pair 2g; scale index is simply i/16.
float ref_q6_k(const Bytes& B, size_t o, int i) {
  const int n = i / 128, g = (i % 128) / 32, l = i % 32;
  const uint8_t v = B.b[o + 64 * n + l + 32 * (g & 1)];
  const int low = g >= 2 ? (v >> 4) : (v & 15);
  const int high = (B.b[o + 128 + 32 * n + l] >> (2 * g)) & 3;
  const int8_t sc = int8_t(B.b[o + 192 + i / 16]);
  return float(half_value(B.get16(o + 208)) * sc * (low + 16 * high - 32));
}
int q3_decode_scale(const Bytes& B, size_t s, int k) {
  const int low4 = k < 8 ? (B.b[s + k] & 15) : (B.b[s + k - 8] >> 4);
  const int high2 = (B.b[s + 8 + k % 4] >> (2 * (k / 4))) & 3;
  return low4 + 16 * high2 - 32;
}
// Element i of Q2_K/Q3_K: 2-bit field 2·((i/32)%4) of qs byte 32·(i/128) + i%32;
// Q3_K's hmask bit is bit i/32 of hmask[i%32]; scale index i/16.
int q2bits(const Bytes& B, size_t qs, int i) {
  return (B.b[qs + 32 * (i / 128) + i % 32] >> (2 * ((i / 32) % 4))) & 3;
}
float ref_q3_k(const Bytes& B, size_t o, int i) {
  const bool h = (B.b[o + i % 32] >> (i / 32)) & 1;
  const int q = q2bits(B, o + 32, i) - (h ? 0 : 4);
  return float(half_value(B.get16(o + 108)) * q3_decode_scale(B, o + 96, i / 16) * q);
}
float ref_q2_k(const Bytes& B, size_t o, int i) {
  const uint8_t sc = B.b[o + i / 16];
  return float(half_value(B.get16(o + 80)) * (sc & 15) * q2bits(B, o + 16, i) -
               half_value(B.get16(o + 82)) * (sc >> 4));
}

using RefFn = float (*)(const Bytes&, size_t, int);
struct QType {
  DType t;
  int qk;
  size_t bytes;
  RefFn ref;
  std::vector<size_t> f16_offsets;  // where the f16 scale fields are (for random blocks)
};
const std::vector<QType>& qtypes() {
  static const std::vector<QType> v = {
      {DType::Q8_0, 32, 34, ref_q8_0, {0}},       {DType::Q4_0, 32, 18, ref_q4_0, {0}},
      {DType::Q4_1, 32, 20, ref_q4_1, {0, 2}},    {DType::Q5_0, 32, 22, ref_q5_0, {0}},
      {DType::Q5_1, 32, 24, ref_q5_1, {0, 2}},    {DType::MXFP4, 32, 17, ref_mxfp4, {}},
      {DType::Q2_K, 256, 84, ref_q2_k, {80, 82}}, {DType::Q3_K, 256, 110, ref_q3_k, {108}},
      {DType::Q4_K, 256, 144, ref_q4_k, {0, 2}},  {DType::Q5_K, 256, 176, ref_q5_k, {0, 2}},
      {DType::Q6_K, 256, 210, ref_q6_k, {208}},
  };
  return v;
}

// Checks every element of a multi-block buffer against the element-wise reference.
void expect_matches_ref(const QType& q, const Bytes& B) {
  const int64_t nb = int64_t(B.b.size() / q.bytes);
  ASSERT_EQ(B.b.size(), size_t(nb) * q.bytes);
  auto y = deq(q.t, B.b, nb * q.qk);
  for (int64_t k = 0; k < nb; ++k)
    for (int i = 0; i < q.qk; ++i)
      ASSERT_EQ(y[size_t(k * q.qk + i)], q.ref(B, size_t(k) * q.bytes, i))
          << dtype_name(q.t) << " block " << k << " element " << i;
}

const QType& qtype(DType t) {
  for (const auto& q : qtypes())
    if (q.t == t) return q;
  throw std::logic_error("no qtype");
}

// Random block bytes with finite, moderate f16 scale fields (MXFP4's exponent stays random).
Bytes random_blocks(const QType& q, int nb, std::mt19937& rng) {
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_real_distribution<float> scale(-0.05f, 0.05f);
  Bytes B(q.bytes * size_t(nb));
  for (auto& v : B.b) v = uint8_t(byte(rng));
  for (int k = 0; k < nb; ++k) {
    for (size_t off : q.f16_offsets) B.u16(size_t(k) * q.bytes + off, fp32_to_fp16(scale(rng)));
    // Keep MXFP4 scales in a range where products stay finite and the test data sensible.
    if (q.t == DType::MXFP4) B.u8(size_t(k) * q.bytes, uint8_t(100 + byte(rng) % 40));
  }
  return B;
}

}  // namespace

// ==== dtype table ===========================================================================

TEST(DType, Table) {
  struct Row { uint32_t id; const char* name; int64_t elems; size_t bytes; };
  const Row rows[] = {{0, "f32", 1, 4},        {1, "f16", 1, 2},       {2, "q4_0", 32, 18},
                      {3, "q4_1", 32, 20},     {6, "q5_0", 32, 22},    {7, "q5_1", 32, 24},
                      {8, "q8_0", 32, 34},     {10, "q2_K", 256, 84},  {11, "q3_K", 256, 110},
                      {12, "q4_K", 256, 144},  {13, "q5_K", 256, 176}, {14, "q6_K", 256, 210},
                      {16, "iq2_xxs", 256, 66}, {17, "iq2_xs", 256, 74}, {18, "iq3_xxs", 256, 98},
                      {19, "iq1_s", 256, 50},  {20, "iq4_nl", 32, 18}, {21, "iq3_s", 256, 110},
                      {22, "iq2_s", 256, 82},  {23, "iq4_xs", 256, 136}, {29, "iq1_m", 256, 56},
                      {30, "bf16", 1, 2},      {34, "tq1_0", 256, 54}, {35, "tq2_0", 256, 66},
                      {39, "mxfp4", 32, 17}};
  for (const auto& r : rows) {
    const DTypeInfo* info = dtype_info(r.id);
    ASSERT_NE(info, nullptr) << r.id;
    EXPECT_EQ(uint32_t(info->type), r.id);
    EXPECT_STREQ(info->name, r.name);
    EXPECT_EQ(info->block_elems, r.elems) << r.name;
    EXPECT_EQ(info->block_bytes, r.bytes) << r.name;
    EXPECT_EQ(&dtype_info(info->type), info);
    EXPECT_STREQ(dtype_name(info->type), r.name);
  }
  // 4, 5: the removed Q4_2/Q4_3; 15: Q8_K (activations only); 24-28, 31-33, 36-38: removed
  // or never stored in files (Q4_0_4_4 ...); 40+: types this engine does not read (NVFP4 ...).
  for (uint32_t id : {4u, 5u, 9u, 15u, 24u, 25u, 26u, 27u, 28u, 31u, 32u, 33u, 36u, 37u, 38u, 40u, 41u, 1000u,
                      0xffffffffu})
    EXPECT_EQ(dtype_info(id), nullptr) << id;
}

TEST(DType, FromName) {
  EXPECT_EQ(dtype_from_name("q4_K"), DType::Q4_K);
  EXPECT_EQ(dtype_from_name("q4_k"), DType::Q4_K);
  EXPECT_EQ(dtype_from_name("Q4_K"), DType::Q4_K);
  EXPECT_EQ(dtype_from_name("Q8_0"), DType::Q8_0);
  EXPECT_EQ(dtype_from_name("BF16"), DType::BF16);
  EXPECT_EQ(dtype_from_name("F32"), DType::F32);
  EXPECT_EQ(dtype_from_name("MXFP4"), DType::MXFP4);
  EXPECT_EQ(dtype_from_name("q6_k"), DType::Q6_K);
  EXPECT_EQ(dtype_from_name("IQ4_XS"), DType::IQ4_XS);
  EXPECT_EQ(dtype_from_name("iq2_xxs"), DType::IQ2_XXS);
  EXPECT_EQ(dtype_from_name("TQ2_0"), DType::TQ2_0);
  EXPECT_FALSE(dtype_from_name("").has_value());
  EXPECT_FALSE(dtype_from_name("q4").has_value());
  EXPECT_FALSE(dtype_from_name("q4_k_m").has_value());  // a file type, not a tensor type
  EXPECT_FALSE(dtype_from_name("f64").has_value());
}

TEST(DType, RowBytes) {
  EXPECT_EQ(row_bytes(DType::F32, 7), 28u);
  EXPECT_EQ(row_bytes(DType::F16, 0), 0u);
  EXPECT_EQ(row_bytes(DType::Q8_0, 4096), 4096u / 32 * 34);
  EXPECT_EQ(row_bytes(DType::Q4_K, 4096), 16u * 144);
  EXPECT_EQ(row_bytes(DType::Q6_K, 256), 210u);
  EXPECT_EQ(row_bytes(DType::MXFP4, 64), 34u);
  EXPECT_FALSE(row_bytes(DType::Q4_K, 128).has_value());
  EXPECT_FALSE(row_bytes(DType::Q8_0, 33).has_value());
  EXPECT_FALSE(row_bytes(DType::F32, -1).has_value());
  EXPECT_FALSE(row_bytes(DType::Q4_0, -32).has_value());
  // Sizes that would wrap size_t must be refused, not wrapped.
  EXPECT_FALSE(row_bytes(DType::F32, std::numeric_limits<int64_t>::max()).has_value());
  EXPECT_EQ(row_bytes(DType::F16, std::numeric_limits<int64_t>::max()),  // 2^64 - 2: just fits
            size_t(std::numeric_limits<int64_t>::max()) * 2);
  // The largest K-quant row still fits (2^55 blocks · 210 bytes < 2^64).
  EXPECT_EQ(row_bytes(DType::Q6_K, std::numeric_limits<int64_t>::max() / 256 * 256),
            size_t(std::numeric_limits<int64_t>::max() / 256) * 210);
  EXPECT_EQ(row_bytes(DType::F32, int64_t(1) << 40), size_t(1) << 42);
  EXPECT_FALSE(row_bytes(DType(5), 32).has_value());  // unsupported id
}

// ==== fp16 / bf16 ===========================================================================

TEST(Fp16, ToFloatExhaustive) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = fp16_to_fp32(uint16_t(h));
    const int e = (h >> 10) & 31, m = h & 1023;
    uint32_t fb;
    std::memcpy(&fb, &f, 4);
    ASSERT_EQ(fb >> 31, h >> 15) << std::hex << h;
    if (e == 31) {
      if (m == 0) {
        ASSERT_TRUE(std::isinf(f)) << std::hex << h;
      } else {
        ASSERT_TRUE(std::isnan(f)) << std::hex << h;
        ASSERT_EQ((fb >> 13) & 1023, uint32_t(m)) << "payload kept " << std::hex << h;
      }
    } else {
      ASSERT_EQ(double(f), half_value(uint16_t(h))) << std::hex << h;
    }
  }
}

TEST(Fp16, RoundTripExhaustive) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const uint16_t back = fp32_to_fp16(fp16_to_fp32(uint16_t(h)));
    const bool nan = ((h >> 10) & 31) == 31 && (h & 1023) != 0;
    if (nan)  // NaNs come back quiet, sign and payload kept
      ASSERT_EQ(back, uint16_t(h | 0x0200)) << std::hex << h;
    else
      ASSERT_EQ(back, uint16_t(h)) << std::hex << h;
  }
}

// For every pair of adjacent finite halves (and the step from the largest one to inf), the
// float just below their midpoint rounds down, just above rounds up, and the midpoint
// itself (exact in float) goes to the even one. This pins round-to-nearest-even everywhere,
// including subnormals, the subnormal/normal boundary and overflow to inf.
TEST(Fp16, RoundingAtEveryMidpoint) {
  for (uint32_t h = 0; h < 0x7c00; ++h) {
    const double lo = half_value(uint16_t(h));
    const double hi = h + 1 == 0x7c00 ? 65536.0 : half_value(uint16_t(h + 1));
    const double mid = (lo + hi) / 2;
    const float m = float(mid);
    ASSERT_EQ(double(m), mid);
    for (int s = 0; s < 2; ++s) {
      const float sg = s ? -1.0f : 1.0f;
      const uint16_t sb = s ? 0x8000 : 0;
      const uint16_t even = (h & 1) ? uint16_t(h + 1) : uint16_t(h);
      ASSERT_EQ(fp32_to_fp16(sg * std::nextafter(m, 0.0f)), uint16_t(sb | h)) << std::hex << h;
      ASSERT_EQ(fp32_to_fp16(sg * m), uint16_t(sb | even)) << std::hex << h;
      ASSERT_EQ(fp32_to_fp16(sg * std::nextafter(m, 1e30f)), uint16_t(sb | (h + 1))) << std::hex << h;
      ASSERT_EQ(fp32_to_fp16(sg * float(lo)), uint16_t(sb | h));
    }
  }
}

TEST(Fp16, SpecialCases) {
  EXPECT_EQ(fp32_to_fp16(1.0f), 0x3c00);
  EXPECT_EQ(fp32_to_fp16(-2.0f), 0xc000);
  EXPECT_EQ(fp32_to_fp16(65504.0f), 0x7bff);
  EXPECT_EQ(fp32_to_fp16(65519.996f), 0x7bff);
  EXPECT_EQ(fp32_to_fp16(65520.0f), 0x7c00);  // tie between 65504 and "65536" -> inf
  EXPECT_EQ(fp32_to_fp16(1e10f), 0x7c00);
  EXPECT_EQ(fp32_to_fp16(-1e10f), 0xfc00);
  EXPECT_EQ(fp32_to_fp16(std::numeric_limits<float>::infinity()), 0x7c00);
  EXPECT_EQ(fp32_to_fp16(-std::numeric_limits<float>::infinity()), 0xfc00);
  EXPECT_EQ(fp32_to_fp16(0.0f), 0x0000);
  EXPECT_EQ(fp32_to_fp16(-0.0f), 0x8000);
  EXPECT_EQ(fp32_to_fp16(0x1p-24f), 0x0001);           // smallest subnormal
  EXPECT_EQ(fp32_to_fp16(0x1p-25f), 0x0000);           // tie -> even (zero)
  EXPECT_EQ(fp32_to_fp16(0x1.000002p-25f), 0x0001);    // just above the tie
  EXPECT_EQ(fp32_to_fp16(0x1.8p-24f), 0x0002);         // 1.5 ulp -> 2 (even)
  EXPECT_EQ(fp32_to_fp16(0x1.4p-23f), 0x0002);         // 2.5 ulp -> 2 (even)
  EXPECT_EQ(fp32_to_fp16(0x1p-14f), 0x0400);           // smallest normal
  EXPECT_EQ(fp32_to_fp16(0x1.ff8p-15f), 0x03ff);       // largest subnormal
  EXPECT_EQ(fp32_to_fp16(0x1.ffcp-15f), 0x0400);       // its tie with 2^-14 -> even, carries
  EXPECT_EQ(fp32_to_fp16(1e-30f), 0x0000);
  EXPECT_EQ(fp32_to_fp16(std::numeric_limits<float>::denorm_min()), 0x0000);
  EXPECT_EQ(fp32_to_fp16(1.0f + 0x1p-11f), 0x3c00);    // tie -> even
  EXPECT_EQ(fp32_to_fp16(1.0f + 0x1.8p-10f), 0x3c02);  // 1.5 ulp -> 2 ulp
  EXPECT_EQ(fp32_to_fp16(0.1f), 0x2e66);
  EXPECT_EQ(fp32_to_fp16(0.333333343f), 0x3555);
  const uint16_t qnan = fp32_to_fp16(std::numeric_limits<float>::quiet_NaN());
  EXPECT_EQ(qnan & 0x7e00, 0x7e00);
  // A signalling float NaN whose payload lies in the dropped bits must not become inf.
  uint32_t snan_bits = 0x7f800001u;
  float snan;
  std::memcpy(&snan, &snan_bits, 4);
  EXPECT_EQ(fp32_to_fp16(snan), 0x7e00);
  EXPECT_EQ(fp32_to_fp16(-snan), 0xfe00);
  EXPECT_EQ(fp16_to_fp32(0x3c00), 1.0f);
  EXPECT_EQ(fp16_to_fp32(0x0001), 0x1p-24f);
  EXPECT_EQ(fp16_to_fp32(0x03ff), 0x1.ff8p-15f);
  EXPECT_EQ(fp16_to_fp32(0x7bff), 65504.0f);
  EXPECT_TRUE(std::signbit(fp16_to_fp32(0x8000)));
}

#ifdef __FLT16_MANT_DIG__
// Cross-check against the compiler's _Float16 (libgcc/hardware conversion) on many floats.
TEST(Fp16, AgreesWithCompilerFloat16) {
  std::mt19937 rng(7);
  for (int k = 0; k < 2000000; ++k) {
    uint32_t u = rng();
    if (k % 2) u = (u & 0x807fffffu) | ((100u + (u >> 23) % 45u) << 23);  // bias to half range
    float f;
    std::memcpy(&f, &u, 4);
    if (std::isnan(f)) continue;
    const _Float16 c = static_cast<_Float16>(f);
    uint16_t cb;
    std::memcpy(&cb, &c, 2);
    ASSERT_EQ(fp32_to_fp16(f), cb) << std::hexfloat << f;
  }
}
#endif

TEST(Bf16, Conversions) {
  EXPECT_EQ(bf16_to_fp32(0x3f80), 1.0f);
  EXPECT_EQ(bf16_to_fp32(0xc040), -3.0f);
  EXPECT_EQ(bf16_to_fp32(0x4049), 3.140625f);
  EXPECT_EQ(bf16_to_fp32(0x0001), 0x1p-133f);
  EXPECT_EQ(fp32_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(fp32_to_bf16(3.14159265f), 0x4049);
  EXPECT_EQ(fp32_to_bf16(1.0f + 0x1p-8f), 0x3f80);      // tie -> even
  EXPECT_EQ(fp32_to_bf16(1.0f + 0x1.8p-7f), 0x3f82);    // 1.5 ulp -> 2 ulp
  EXPECT_EQ(fp32_to_bf16(1.0f + 0x1.02p-8f), 0x3f81);
  EXPECT_EQ(fp32_to_bf16(std::numeric_limits<float>::max()), 0x7f80);  // rounds to inf
  EXPECT_EQ(fp32_to_bf16(-std::numeric_limits<float>::infinity()), 0xff80);
  EXPECT_EQ(fp32_to_bf16(-0.0f), 0x8000);
  EXPECT_EQ(fp32_to_bf16(0x1p-133f), 0x0001);  // subnormals are kept, not flushed
  uint32_t snan_bits = 0x7f800001u;
  float snan;
  std::memcpy(&snan, &snan_bits, 4);
  EXPECT_EQ(fp32_to_bf16(snan), 0x7fc0);  // would truncate to inf: must stay a (quiet) NaN
  EXPECT_TRUE(std::isnan(bf16_to_fp32(fp32_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
}

// Same midpoint argument as for f16, for every pair of adjacent finite bf16 values.
TEST(Bf16, RoundingAtEveryMidpoint) {
  for (uint32_t b = 0; b < 0x7f80; ++b) {
    const double lo = double(bf16_to_fp32(uint16_t(b)));
    const double hi = b + 1 == 0x7f80 ? std::ldexp(1.0, 128) : double(bf16_to_fp32(uint16_t(b + 1)));
    const float m = float((lo + hi) / 2);
    ASSERT_EQ(double(m), (lo + hi) / 2);
    const uint16_t even = (b & 1) ? uint16_t(b + 1) : uint16_t(b);
    ASSERT_EQ(fp32_to_bf16(std::nextafter(m, 0.0f)), b) << std::hex << b;
    ASSERT_EQ(fp32_to_bf16(m), even) << std::hex << b;
    ASSERT_EQ(fp32_to_bf16(std::nextafter(m, std::numeric_limits<float>::infinity())), b + 1) << std::hex << b;
    ASSERT_EQ(fp32_to_bf16(-m), uint16_t(0x8000 | even)) << std::hex << b;
    ASSERT_EQ(fp32_to_bf16(float(lo)), b);
  }
}

// ==== hand-built blocks =====================================================================

TEST(Dequant, F32F16BF16) {
  const float f[5] = {1.5f, -2.0f, 0.0f, 1e-40f, 3.4e38f};
  Bytes B(20);
  std::memcpy(B.b.data(), f, 20);
  auto y = deq(DType::F32, B.b, 5);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(y[i], f[i]);

  Bytes H16(16);
  const uint16_t hv[8] = {0x3c00, 0xc000, 0x0001, 0x7bff, 0x3555, 0x8000, 0x7c00, 0x0400};
  for (int i = 0; i < 8; ++i) H16.u16(2 * i, hv[i]);
  y = deq(DType::F16, H16.b, 8);
  EXPECT_EQ(y[0], 1.0f);
  EXPECT_EQ(y[1], -2.0f);
  EXPECT_EQ(y[2], 0x1p-24f);
  EXPECT_EQ(y[3], 65504.0f);
  EXPECT_EQ(y[4], 0.333251953125f);
  EXPECT_TRUE(y[5] == 0.0f && std::signbit(y[5]));
  EXPECT_EQ(y[6], std::numeric_limits<float>::infinity());
  EXPECT_EQ(y[7], 0x1p-14f);

  Bytes BB(16);
  const uint16_t bv[8] = {0x3f80, 0xc040, 0x4049, 0x0001, 0x7f80, 0xff80, 0x3c00, 0x8000};
  for (int i = 0; i < 8; ++i) BB.u16(2 * i, bv[i]);
  y = deq(DType::BF16, BB.b, 8);
  EXPECT_EQ(y[0], 1.0f);
  EXPECT_EQ(y[1], -3.0f);
  EXPECT_EQ(y[2], 3.140625f);
  EXPECT_EQ(y[3], 0x1p-133f);
  EXPECT_EQ(y[4], std::numeric_limits<float>::infinity());
  EXPECT_EQ(y[5], -std::numeric_limits<float>::infinity());
  EXPECT_EQ(y[6], 0.0078125f);
  EXPECT_TRUE(y[7] == 0.0f && std::signbit(y[7]));
}

TEST(Dequant, Q8_0) {
  Bytes B(34), C(34);
  B.u16(0, H(0.25f));
  for (int j = 0; j < 32; ++j) B.u8(2 + j, uint8_t(int8_t(j == 31 ? 127 : j * 8 - 128)));
  C.u16(0, H(-1.5f));
  for (int j = 0; j < 32; ++j) C.u8(2 + j, uint8_t(int8_t(100 - 7 * j)));
  B.append(C);
  auto y = deq(DType::Q8_0, B.b, 64);
  EXPECT_EQ(y[0], -32.0f);   // 0.25 · -128
  EXPECT_EQ(y[1], -30.0f);   // 0.25 · -120
  EXPECT_EQ(y[16], 0.0f);    // 0.25 · 0
  EXPECT_EQ(y[31], 31.75f);  // 0.25 · 127
  EXPECT_EQ(y[32], -150.0f); // -1.5 · 100
  EXPECT_EQ(y[63], 175.5f);  // -1.5 · (100 - 217)
  expect_matches_ref(qtype(DType::Q8_0), B);
}

TEST(Dequant, Q4_0) {
  Bytes B(18), C(18);
  B.u16(0, H(0.5f));
  for (int j = 0; j < 16; ++j) B.u8(2 + j, pat1(j));
  C.u16(0, H(-2.0f));
  for (int j = 0; j < 16; ++j) C.u8(2 + j, pat2(j));
  B.append(C);
  auto y = deq(DType::Q4_0, B.b, 64);
  EXPECT_EQ(y[0], -4.0f);   // (0 - 8) · 0.5
  EXPECT_EQ(y[15], 3.5f);   // (15 - 8) · 0.5
  EXPECT_EQ(y[16], 3.5f);   // high nibble of qs[0] = 15
  EXPECT_EQ(y[31], -4.0f);  // high nibble of qs[15] = 0
  EXPECT_EQ(y[33], 10.0f);  // block 2, low nibble of qs[1] = 3: (3 - 8) · -2
  EXPECT_EQ(y[48], 14.0f);  // block 2, high nibble of qs[0] = 1: (1 - 8) · -2
  expect_matches_ref(qtype(DType::Q4_0), B);
}

TEST(Dequant, Q4_1) {
  Bytes B(20), C(20);
  B.u16(0, H(0.5f));
  B.u16(2, H(-1.0f));
  for (int j = 0; j < 16; ++j) B.u8(4 + j, pat1(j));
  C.u16(0, H(0.125f));
  C.u16(2, H(3.0f));
  for (int j = 0; j < 16; ++j) C.u8(4 + j, pat2(j));
  B.append(C);
  auto y = deq(DType::Q4_1, B.b, 64);
  EXPECT_EQ(y[0], -1.0f);   // 0 · 0.5 - 1
  EXPECT_EQ(y[15], 6.5f);   // 15 · 0.5 - 1
  EXPECT_EQ(y[16], 6.5f);
  EXPECT_EQ(y[31], -1.0f);
  EXPECT_EQ(y[48], 3.125f);  // 1 · 0.125 + 3
  expect_matches_ref(qtype(DType::Q4_1), B);
}

TEST(Dequant, Q5_0) {
  // qh = 0x80010003: bits 0, 1 (low half), 16 and 31 (high half) set.
  Bytes B(22), C(22);
  B.u16(0, H(0.25f));
  B.u32(2, 0x80010003u);
  for (int j = 0; j < 16; ++j) B.u8(6 + j, pat1(j));
  C.u16(0, H(-0.5f));
  C.u32(2, 0x9C3A5E71u);
  for (int j = 0; j < 16; ++j) C.u8(6 + j, pat2(j));
  B.append(C);
  auto y = deq(DType::Q5_0, B.b, 64);
  EXPECT_EQ(y[0], 0.0f);     // (0 | 16) - 16
  EXPECT_EQ(y[1], 0.25f);    // (1 | 16) - 16 = 1
  EXPECT_EQ(y[2], -3.5f);    // 2 - 16 = -14
  EXPECT_EQ(y[15], -0.25f);  // 15 - 16
  EXPECT_EQ(y[16], 3.75f);   // (15 | 16) - 16 = 15 (bit 16 = element j+16 of j=0)
  EXPECT_EQ(y[17], -0.5f);   // 14 - 16
  EXPECT_EQ(y[31], 0.0f);    // (0 | 16) - 16 (bit 31)
  expect_matches_ref(qtype(DType::Q5_0), B);
}

TEST(Dequant, Q5_1) {
  Bytes B(24), C(24);
  B.u16(0, H(0.5f));
  B.u16(2, H(2.0f));
  B.u32(4, 0x80010003u);
  for (int j = 0; j < 16; ++j) B.u8(8 + j, pat1(j));
  C.u16(0, H(0.25f));
  C.u16(2, H(-4.0f));
  C.u32(4, 0x9C3A5E71u);
  for (int j = 0; j < 16; ++j) C.u8(8 + j, pat2(j));
  B.append(C);
  auto y = deq(DType::Q5_1, B.b, 64);
  EXPECT_EQ(y[0], 10.0f);   // 16 · 0.5 + 2
  EXPECT_EQ(y[1], 10.5f);   // 17 · 0.5 + 2
  EXPECT_EQ(y[2], 3.0f);    // 2 · 0.5 + 2
  EXPECT_EQ(y[16], 17.5f);  // 31 · 0.5 + 2
  EXPECT_EQ(y[17], 9.0f);   // 14 · 0.5 + 2
  EXPECT_EQ(y[31], 10.0f);  // 16 · 0.5 + 2
  expect_matches_ref(qtype(DType::Q5_1), B);
}

TEST(Dequant, MXFP4) {
  const uint8_t es[] = {128, 0, 1, 130, 255, 127};
  Bytes B(0);
  for (size_t k = 0; k < std::size(es); ++k) {
    Bytes C(17);
    C.u8(0, es[k]);
    for (int j = 0; j < 16; ++j) C.u8(1 + j, k + 1 == std::size(es) ? pat2(j) : pat1(j));
    B.append(C);
  }
  auto y = deq(DType::MXFP4, B.b, 32 * int64_t(std::size(es)));
  // Block 0, e = 128: d = 1; low nibbles 0..15, high nibbles 15..0.
  const float t[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(y[j], t[j]);
    EXPECT_EQ(y[16 + j], t[15 - j]);
  }
  EXPECT_EQ(y[15], -12.0f);
  EXPECT_EQ(y[13], -6.0f);
  // Block 1, e = 0: d = 2^-128, a float denormal.
  EXPECT_EQ(y[32 + 1], 0x1p-128f);
  EXPECT_GT(y[32 + 1], 0.0f);
  EXPECT_EQ(y[32 + 9], -0x1p-128f);
  EXPECT_EQ(y[32 + 7], 0x1.8p-125f);  // 12 · 2^-128
  // Block 2, e = 1: d = 2^-127.
  EXPECT_EQ(y[64 + 1], 0x1p-127f);
  EXPECT_EQ(y[64 + 15], -0x1.8p-124f);  // -12 · 2^-127
  // Block 3, e = 130: d = 4. Block 4, e = 255: d = 2^127. Block 5, e = 127: d = 0.5.
  EXPECT_EQ(y[96 + 6], 32.0f);
  EXPECT_EQ(y[96 + 16], -48.0f);
  EXPECT_EQ(y[128 + 1], 0x1p127f);
  EXPECT_EQ(y[128 + 2], std::numeric_limits<float>::infinity());  // 2 · 2^127 overflows
  EXPECT_EQ(y[160 + 1], 1.5f);  // pat2(1): low nibble 3 -> 3 · 0.5
  expect_matches_ref(qtype(DType::MXFP4), B);
}

namespace {
// Q4_K/Q5_K scale packing, written as the inverse of the §7 unpacking rule.
void pack_k4_scales(const int sc[8], const int m[8], uint8_t out[12]) {
  for (int b = 0; b < 4; ++b) {
    out[b] = uint8_t(sc[b] | ((sc[b + 4] >> 4) << 6));
    out[b + 4] = uint8_t(m[b] | ((m[b + 4] >> 4) << 6));
    out[b + 8] = uint8_t((sc[b + 4] & 15) | ((m[b + 4] & 15) << 4));
  }
}
// Scales/mins chosen so the last four sub-blocks need their high bits.
const int kSc[8] = {1, 63, 17, 40, 33, 5, 62, 48};
const int kMn[8] = {0, 7, 63, 20, 50, 16, 1, 47};
const uint8_t kScBytes[12] = {0x81, 0x3F, 0xD1, 0xE8, 0xC0, 0x47, 0x3F, 0x94, 0x21, 0x05, 0x1E, 0xF0};
uint8_t k_qs(int k) { return uint8_t(((k * 7 + 3) & 15) | (((k * 5 + 1) & 15) << 4)); }
}  // namespace

TEST(Dequant, Q4_K_ScalePacking) {
  uint8_t packed[12];
  pack_k4_scales(kSc, kMn, packed);
  for (int i = 0; i < 12; ++i) EXPECT_EQ(packed[i], kScBytes[i]) << i;  // hand-packed bytes

  // d = 1, dmin = 0, every nibble 1: element value = sub-block scale.
  Bytes A(144);
  A.u16(0, H(1.0f));
  A.u16(2, H(0.0f));
  for (int i = 0; i < 12; ++i) A.u8(4 + i, kScBytes[i]);
  for (int k = 0; k < 128; ++k) A.u8(16 + k, 0x11);
  // d = 0, dmin = 1: element value = -min.
  Bytes M = A;
  M.u16(0, H(0.0f));
  M.u16(2, H(1.0f));
  A.append(M);
  auto y = deq(DType::Q4_K, A.b, 512);
  for (int b = 0; b < 8; ++b)
    for (int l = 0; l < 32; ++l) {
      ASSERT_EQ(y[32 * b + l], float(kSc[b])) << b;
      ASSERT_EQ(y[256 + 32 * b + l], -float(kMn[b])) << b;
    }
}

TEST(Dequant, Q4_K) {
  Bytes B(144);
  B.u16(0, H(0.5f));
  B.u16(2, H(0.25f));
  for (int i = 0; i < 12; ++i) B.u8(4 + i, kScBytes[i]);
  for (int k = 0; k < 128; ++k) B.u8(16 + k, k_qs(k));
  auto y = deq(DType::Q4_K, B.b, 256);
  EXPECT_EQ(y[0], 1.5f);       // sub-block 0: 0.5·1·3 - 0.25·0
  EXPECT_EQ(y[32], 29.75f);    // sub-block 1, high nibble of qs[0] = 1: 0.5·63·1 - 0.25·7
  EXPECT_EQ(y[100], 95.0f);    // sub-block 3
  EXPECT_EQ(y[200], 340.75f);  // sub-block 6: 0.5·62·11 - 0.25·1
  EXPECT_EQ(y[255], 276.25f);  // sub-block 7: 0.5·48·12 - 0.25·47
  // Every element against the chosen scales (not the decoder).
  for (int i = 0; i < 256; ++i) {
    const int b = i / 32;
    const uint8_t v = k_qs(32 * (i / 64) + i % 32);
    const int q = b % 2 ? v >> 4 : v & 15;
    ASSERT_EQ(y[i], 0.5f * kSc[b] * q - 0.25f * kMn[b]) << i;
  }
  expect_matches_ref(qtype(DType::Q4_K), B);
}

TEST(Dequant, Q5_K) {
  Bytes B(176);
  B.u16(0, H(0.25f));
  B.u16(2, H(0.5f));
  for (int i = 0; i < 12; ++i) B.u8(4 + i, kScBytes[i]);
  uint8_t qh[32];
  for (int l = 0; l < 32; ++l) qh[l] = uint8_t(l * 37 + 11);
  qh[0] = 0xFF, qh[1] = 0x00, qh[2] = 0x55, qh[3] = 0xAA;
  for (int l = 0; l < 32; ++l) B.u8(16 + l, qh[l]);
  for (int k = 0; k < 128; ++k) B.u8(48 + k, k_qs(k));
  // The data must exercise every qh bit (= every chunk's low and high half) both ways.
  for (int bit = 0; bit < 8; ++bit) {
    int set = 0;
    for (int l = 0; l < 32; ++l) set += (qh[l] >> bit) & 1;
    ASSERT_GT(set, 0);
    ASSERT_LT(set, 32);
  }
  auto y = deq(DType::Q5_K, B.b, 256);
  EXPECT_EQ(y[0], 4.75f);     // 0.25·1·(3+16) - 0
  EXPECT_EQ(y[33], 91.0f);    // qh[1] = 0: 0.25·63·6 - 0.5·7
  EXPECT_EQ(y[130], 115.25f);
  EXPECT_EQ(y[226], 108.5f);  // qh[2] bit 7 clear: 0.25·48·11 - 0.5·47
  EXPECT_EQ(y[227], 168.5f);  // qh[3] bit 7 set: 0.25·48·(0+16) - 0.5·47
  for (int i = 0; i < 256; ++i) {
    const int b = i / 32, l = i % 32;
    const uint8_t v = k_qs(32 * (i / 64) + l);
    const int q = (b % 2 ? v >> 4 : v & 15) + (((qh[l] >> b) & 1) ? 16 : 0);
    ASSERT_EQ(y[i], 0.25f * kSc[b] * q - 0.5f * kMn[b]) << i;
  }
  expect_matches_ref(qtype(DType::Q5_K), B);
}

TEST(Dequant, Q6_K) {
  const int8_t sc[16] = {1, -1, 2, -3, 5, -8, 13, -21, 34, -55, 89, -128, 127, -7, 9, -11};
  Bytes B(210);
  for (int k = 0; k < 128; ++k) B.u8(k, uint8_t(k * 11 + 5));
  for (int k = 0; k < 64; ++k) B.u8(128 + k, uint8_t(k * 29 + 7));
  for (int k = 0; k < 16; ++k) B.u8(192 + k, uint8_t(sc[k]));
  B.u16(208, H(0.125f));
  auto y = deq(DType::Q6_K, B.b, 256);
  EXPECT_EQ(y[0], 2.625f);     // half 0, q1: (5 | 3<<4) - 32 = 21, scale 1
  EXPECT_EQ(y[40], 7.25f);     // q2 group
  EXPECT_EQ(y[77], -14.375f);  // q3 group
  EXPECT_EQ(y[100], -11.375f); // q4 group
  EXPECT_EQ(y[128], 89.25f);   // half 1
  EXPECT_EQ(y[255], 34.375f);  // half 1, q4: (7 | 0<<4) - 32 = -25, scale -11
  // Every element (both halves, all four q groups, both scales of each group).
  for (int i = 0; i < 256; ++i) {
    const int n = i / 128, g = (i % 128) / 32, l = i % 32;
    const uint8_t ql = uint8_t((64 * n + l + 32 * (g & 1)) * 11 + 5);
    const uint8_t qh = uint8_t((32 * n + l) * 29 + 7);
    const int q = ((g >= 2 ? ql >> 4 : ql & 15) | (((qh >> (2 * g)) & 3) << 4)) - 32;
    ASSERT_EQ(y[i], 0.125f * sc[i / 16] * q) << i;
  }
  expect_matches_ref(qtype(DType::Q6_K), B);
}

namespace {
void pack_q3_scales(const int S[16], uint8_t out[12]) {  // inverse of the §7 rule
  std::memset(out, 0, 12);
  for (int k = 0; k < 16; ++k) {
    const int u = S[k] + 32;
    if (k < 8)
      out[k] |= uint8_t(u & 15);
    else
      out[k - 8] |= uint8_t((u & 15) << 4);
    out[8 + k % 4] |= uint8_t((u >> 4) << (2 * (k / 4)));
  }
}
}  // namespace

TEST(Dequant, Q3_K) {
  const int S[16] = {-32, 31, 0, -1, 1, 15, -16, 16, 7, -8, 30, -31, 2, -2, 20, -20};
  const uint8_t kBytes[12] = {0x70, 0x8f, 0xe0, 0x1f, 0x21, 0xef, 0x40, 0xc0, 0xa8, 0x5b, 0xf6, 0x0d};
  uint8_t packed[12];
  pack_q3_scales(S, packed);
  for (int i = 0; i < 12; ++i) EXPECT_EQ(packed[i], kBytes[i]) << i;
  uint8_t hm[32];
  for (int l = 0; l < 32; ++l) hm[l] = uint8_t(l * 53 + 9);
  hm[0] = 0xFF, hm[1] = 0x00;
  Bytes B(110);
  for (int l = 0; l < 32; ++l) B.u8(l, hm[l]);
  for (int k = 0; k < 64; ++k) B.u8(32 + k, uint8_t(k * 13 + 6));
  for (int i = 0; i < 12; ++i) B.u8(96 + i, kBytes[i]);
  B.u16(108, H(0.5f));
  for (int bit = 0; bit < 8; ++bit) {  // every hmask bit used both ways
    int set = 0;
    for (int l = 0; l < 32; ++l) set += (hm[l] >> bit) & 1;
    ASSERT_GT(set, 0);
    ASSERT_LT(set, 32);
  }
  auto y = deq(DType::Q3_K, B.b, 256);
  EXPECT_EQ(y[0], -32.0f);   // q = 6&3 = 2, hmask set: 0.5·-32·2
  EXPECT_EQ(y[1], 16.0f);    // q = 19&3 = 3, hmask clear: 0.5·-32·(3-4)
  EXPECT_EQ(y[17], -15.5f);  // scale 1 = 31
  EXPECT_EQ(y[50], 0.0f);
  EXPECT_EQ(y[129], -3.5f);  // second half
  EXPECT_EQ(y[255], 40.0f);  // scale 15 = -20
  for (int i = 0; i < 256; ++i) {
    const uint8_t q = uint8_t((32 * (i / 128) + i % 32) * 13 + 6);
    const int v = ((q >> (2 * ((i / 32) % 4))) & 3) - (((hm[i % 32] >> (i / 32)) & 1) ? 0 : 4);
    ASSERT_EQ(y[i], 0.5f * S[i / 16] * v) << i;
  }
  expect_matches_ref(qtype(DType::Q3_K), B);
}

TEST(Dequant, Q2_K) {
  uint8_t sc[16];
  for (int k = 0; k < 16; ++k) sc[k] = uint8_t(k | (((k * 7) & 15) << 4));  // all scales, all mins
  Bytes B(84);
  for (int k = 0; k < 16; ++k) B.u8(k, sc[k]);
  for (int k = 0; k < 64; ++k) B.u8(16 + k, uint8_t(k * 13 + 6));
  B.u16(80, H(0.5f));
  B.u16(82, H(0.25f));
  auto y = deq(DType::Q2_K, B.b, 256);
  EXPECT_EQ(y[0], 0.0f);     // scale 0, min 0
  EXPECT_EQ(y[20], -0.75f);  // scale byte 0x71: 0.5·1·2 - 0.25·7 (qs[20] = 10, bits 0-1 = 2)
  EXPECT_EQ(y[90], 1.75f);
  EXPECT_EQ(y[160], 3.5f);
  EXPECT_EQ(y[255], -2.25f);
  for (int i = 0; i < 256; ++i) {
    const uint8_t q = uint8_t((32 * (i / 128) + i % 32) * 13 + 6);
    const int v = (q >> (2 * ((i / 32) % 4))) & 3;
    ASSERT_EQ(y[i], 0.5f * (sc[i / 16] & 15) * v - 0.25f * (sc[i / 16] >> 4)) << i;
  }
  expect_matches_ref(qtype(DType::Q2_K), B);
}

// Random bytes in every field: decoding must equal the element-wise formulas everywhere.
TEST(Dequant, RandomBlocksAllTypes) {
  std::mt19937 rng(42);
  for (const auto& q : qtypes()) {
    SCOPED_TRACE(dtype_name(q.t));
    for (int rep = 0; rep < 20; ++rep) expect_matches_ref(q, random_blocks(q, 3, rng));
  }
}

TEST(Dequant, RejectsBadLength) {
  std::vector<uint8_t> buf(1024);
  std::vector<float> y(1024);
  EXPECT_THROW(dequantize_row_ref(DType::Q4_K, buf.data(), y.data(), 100), std::invalid_argument);
  EXPECT_THROW(dot_row_ref(DType::Q8_0, buf.data(), y.data(), 31), std::invalid_argument);
  EXPECT_FALSE(quantize_row_ref(DType::Q8_0, y.data(), buf.data(), 31));
  EXPECT_FALSE(quantize_row_ref(DType::Q4_K, y.data(), buf.data(), 100));  // not a multiple of 256
  EXPECT_FALSE(quantize_row_ref(DType::MXFP4, y.data(), buf.data(), 32));
}

// ==== dot ==================================================================================

TEST(Dot, EqualsSumOfDequantTimesX) {
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  auto check = [&](DType t, const std::vector<uint8_t>& w, int64_t n) {
    std::vector<float> x(static_cast<size_t>(n));
    for (auto& v : x) v = nd(rng);
    auto y = deq(t, w, n);
    double ref = 0.0, mag = 0.0;
    for (int64_t i = 0; i < n; ++i) {
      ref += double(y[size_t(i)]) * x[size_t(i)];
      mag += std::fabs(double(y[size_t(i)]) * x[size_t(i)]);
    }
    const float got = dot_row_ref(t, w.data(), x.data(), n);
    EXPECT_NEAR(got, ref, 1e-5 * mag + 1e-30) << dtype_name(t);
    // Same from an odd address.
    std::vector<uint8_t> shifted(w.size() + 1);
    std::memcpy(shifted.data() + 1, w.data(), w.size());
    EXPECT_EQ(dot_row_ref(t, shifted.data() + 1, x.data(), n), got) << dtype_name(t);
  };
  for (const auto& q : qtypes())
    for (int nb : {1, 2, 7}) check(q.t, random_blocks(q, nb, rng).b, int64_t(nb) * q.qk);
  for (int64_t n : {1, 5, 300}) {
    std::vector<float> f(static_cast<size_t>(n));
    for (auto& v : f) v = nd(rng);
    std::vector<uint8_t> w32(size_t(n) * 4), w16(size_t(n) * 2), wb(size_t(n) * 2);
    std::memcpy(w32.data(), f.data(), w32.size());
    ASSERT_TRUE(quantize_row_ref(DType::F16, f.data(), w16.data(), n));
    ASSERT_TRUE(quantize_row_ref(DType::BF16, f.data(), wb.data(), n));
    check(DType::F32, w32, n);
    check(DType::F16, w16, n);
    check(DType::BF16, wb, n);
  }
  float x0 = 1.0f;
  EXPECT_EQ(dot_row_ref(DType::Q4_K, nullptr, &x0, 0), 0.0f);
}

// ==== IQ / TQ types =========================================================================
// Codebooks against checksums of ggml's tables, dequantization against llama.cpp's own
// decoders (gguf-py, which the fixtures README found bit-identical to ggml's C decoders) on
// pseudo-random blocks of every type and on every IQ tensor of the shipped tiny-q files, and
// a few hand-built blocks that pin down the bit layouts.

namespace {

uint64_t fnv1a(const void* data, size_t n) {
  const auto* p = static_cast<const uint8_t*>(data);
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}

// Σ bits(y_i)·(2i+1) mod 2^64 over the F32 bit patterns: the checksum the expected values
// below were computed with (numpy over gguf-py's output).
uint64_t weighted_bits(const std::vector<float>& y) {
  uint64_t h = 0;
  for (size_t i = 0; i < y.size(); ++i) {
    uint32_t bits;
    std::memcpy(&bits, &y[i], 4);
    h += uint64_t(bits) * (2 * uint64_t(i) + 1);
  }
  return h;
}

// Pseudo-random blocks: a 64-bit LCG (Knuth's MMIX constants) seeded with 0x9E3779B97F4A7C15
// ^ type id, one byte (the top one) per step; then each F16 super-scale gets exponent bits
// 01011 (values of magnitude 1/16..1/8, either sign), IQ1_M's scattered one bits 0011 in its
// top nibble, so that every value stays finite. The expected checksums were computed from
// the same bytes.
std::vector<uint8_t> lcg_blocks(DType t, int nb) {
  const size_t bb = dtype_info(t).block_bytes;
  std::vector<uint8_t> out(bb * size_t(nb));
  uint64_t state = 0x9E3779B97F4A7C15ull ^ uint64_t(t);
  for (auto& b : out) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    b = uint8_t(state >> 56);
  }
  const int d_offset = t == DType::TQ1_0 ? 52 : t == DType::TQ2_0 ? 64 : 0;
  for (int k = 0; k < nb; ++k) {
    uint8_t* blk = out.data() + bb * size_t(k);
    if (t == DType::IQ1_M) {
      blk[55] = uint8_t((blk[55] & 0x0f) | 0x30);
    } else {
      const uint16_t h = uint16_t(0x2c00 | ((blk[d_offset] | (blk[d_offset + 1] << 8)) & 0x83ff));
      blk[d_offset] = uint8_t(h & 0xff);
      blk[d_offset + 1] = uint8_t(h >> 8);
    }
  }
  return out;
}

const DType kIqTypes[] = {DType::IQ2_XXS, DType::IQ2_XS, DType::IQ3_XXS, DType::IQ1_S,  DType::IQ4_NL, DType::IQ3_S,
                          DType::IQ2_S,   DType::IQ4_XS, DType::IQ1_M,   DType::TQ1_0, DType::TQ2_0};

}  // namespace

TEST(IqGrids, MatchGgmlTables) {
  // FNV-1a 64 of each table's little-endian bytes as ggml-common.h (llama.cpp de3ff81) lists
  // them, and entries 1, n/2 and n-1.
  EXPECT_EQ(fnv1a(iq::kIq2xxsGrid, sizeof iq::kIq2xxsGrid), 0xbb4ee025b5ac6e8eull);
  EXPECT_EQ(fnv1a(iq::kIq2xsGrid, sizeof iq::kIq2xsGrid), 0xc9b1ee61e79909bdull);
  EXPECT_EQ(fnv1a(iq::kIq2sGrid, sizeof iq::kIq2sGrid), 0x123edd38a3b62b90ull);
  EXPECT_EQ(fnv1a(iq::kIq3xxsGrid, sizeof iq::kIq3xxsGrid), 0xdfa5dc83d6a155d5ull);
  EXPECT_EQ(fnv1a(iq::kIq3sGrid, sizeof iq::kIq3sGrid), 0xfa37020c25b44829ull);
  EXPECT_EQ(fnv1a(iq::kIq1sGrid, sizeof iq::kIq1sGrid), 0x6703ed863501ae2eull);
  EXPECT_EQ(fnv1a(iq::kIq4nlValues, sizeof iq::kIq4nlValues), 0x055d06d2d8fa0f75ull);
  EXPECT_EQ(iq::kIq2xxsGrid[1], 0x080808080808082bull);
  EXPECT_EQ(iq::kIq2xxsGrid[128], 0x082b2b0808082b08ull);
  EXPECT_EQ(iq::kIq2xxsGrid[255], 0x2b2b2b1908081908ull);
  EXPECT_EQ(iq::kIq2xsGrid[256], 0x190808080808192bull);
  EXPECT_EQ(iq::kIq2xsGrid[511], 0x2b2b2b2b2b2b2b2bull);
  EXPECT_EQ(iq::kIq2sGrid[512], 0x19080819082b1919ull);
  EXPECT_EQ(iq::kIq2sGrid[1023], 0x2b2b2b2b2b2b2b2bull);
  EXPECT_EQ(iq::kIq3xxsGrid[1], 0x04040414u);
  EXPECT_EQ(iq::kIq3xxsGrid[128], 0x141c3e04u);
  EXPECT_EQ(iq::kIq3xxsGrid[255], 0x3e341c04u);
  EXPECT_EQ(iq::kIq3sGrid[1], 0x01010103u);
  EXPECT_EQ(iq::kIq3sGrid[256], 0x05090507u);
  EXPECT_EQ(iq::kIq3sGrid[511], 0x0f0f0101u);
  EXPECT_EQ(iq::kIq1sGrid[1], 0xffffffffffffff01ull);
  EXPECT_EQ(iq::kIq1sGrid[1024], 0x0000000000ff0100ull);
  EXPECT_EQ(iq::kIq1sGrid[2047], 0x0101010101010101ull);
  // ggml's 128-entry ksigns_iq2xs table is the 7 stored sign bits plus an even-parity eighth.
  uint8_t signs[128];
  for (uint32_t i = 0; i < 128; ++i) signs[i] = iq::expand_signs7(i);
  EXPECT_EQ(fnv1a(signs, sizeof signs), 0xf19ba8f8c3292ba5ull);
  EXPECT_EQ(signs[1], 129);
  EXPECT_EQ(signs[64], 192);
  EXPECT_EQ(signs[127], 255);
  // Every byte of every grid is one of the format's magnitudes.
  const std::set<int> m2 = {8, 25, 43}, m3xxs = {4, 12, 20, 28, 36, 44, 52, 62}, m3s = {1, 3, 5, 7, 9, 11, 13, 15};
  for (uint64_t e : iq::kIq2sGrid)
    for (int j = 0; j < 8; ++j) ASSERT_TRUE(m2.count(iq::grid_byte(e, j)));
  for (uint32_t e : iq::kIq3xxsGrid)
    for (int j = 0; j < 4; ++j) ASSERT_TRUE(m3xxs.count(iq::grid_byte(e, j)));
  for (uint32_t e : iq::kIq3sGrid)
    for (int j = 0; j < 4; ++j) ASSERT_TRUE(m3s.count(iq::grid_byte(e, j)));
  for (uint64_t e : iq::kIq1sGrid)
    for (int j = 0; j < 8; ++j) ASSERT_LE(std::abs(int(int8_t(iq::grid_byte(e, j)))), 1);
}

TEST(Dequant, IqTypesMatchLlamaCppOnPseudoRandomBlocks) {
  // Checksum of gguf-py's dequantization of lcg_blocks(type, n / block size) (n = 16384 values),
  // and two of its values.
  struct Expect {
    DType t;
    uint64_t sum;
    float y1, y_last5;
  };
  const Expect expects[] = {
      {DType::IQ2_XXS, 0x08015d0aa94f98b0ull, 5.079414367675781f, 2.117431640625f},
      {DType::IQ2_XS, 0x07fdd4dca9186308ull, 1.14447021484375f, 0.45305633544921875f},
      {DType::IQ3_XXS, 0x081bef7705a97e78ull, 2.25439453125f, -1.57196044921875f},
      {DType::IQ1_S, 0x08036c280a224be0ull, -0.6015625f, 0.4762725830078125f},
      {DType::IQ4_NL, 0x080b99dba2801f00ull, -2.8411865234375f, 1.1273193359375f},
      {DType::IQ3_S, 0x07f47c25dda3c390ull, 1.4075927734375f, 1.67779541015625f},
      {DType::IQ2_S, 0x080faa27517129f8ull, -3.11126708984375f, -13.847579956054688f},
      {DType::IQ4_XS, 0x0805f57228d76078ull, -53.79638671875f, -155.822265625f},
      {DType::IQ1_M, 0x07facb09e938afc0ull, -0.052703857421875f, 6.35870361328125f},
      {DType::TQ1_0, 0x0690c30b17d66000ull, 0.0f, 0.11395263671875f},
      {DType::TQ2_0, 0x06f9a8ccd460a000ull, -0.1129150390625f, -0.1995849609375f},
  };
  const int64_t n = 16384;
  for (const Expect& e : expects) {
    const std::vector<uint8_t> blocks = lcg_blocks(e.t, int(n / dtype_info(e.t).block_elems));
    const std::vector<float> y = deq(e.t, blocks, n);
    EXPECT_EQ(weighted_bits(y), e.sum) << dtype_name(e.t);
    EXPECT_EQ(y[1], e.y1) << dtype_name(e.t);
    EXPECT_EQ(y[size_t(n - 5)], e.y_last5) << dtype_name(e.t);
  }
}

// IQ2_XXS: 8 bytes per 32 values (four grid indices, then scale and four 7-bit sign groups
// whose eighth sign makes the count of minus signs even); value = d·(s+½)/4 · magnitude.
TEST(Dequant, Iq2xxsHandBuilt) {
  Bytes B(66);
  B.u16(0, H(1.0f));
  B.u8(2, 1);    // grid 1: magnitudes 43, 8, 8, 8, 8, 8, 8, 8
  B.u8(3, 0);    // grid 0: all 8
  B.u8(4, 255);  // grid 255: 8, 25, 8, 8, 25, 43, 43, 43
  B.u8(5, 0);
  // s = 3; sign groups: 0000001 (odd: the eighth is set too), 0000011, none, 1111111 (odd).
  B.u32(6, (3u << 28) | 1u | (3u << 7) | (127u << 21));
  const auto y = deq(DType::IQ2_XXS, B.b, 256);
  const float db = 0.875f;  // 1.0 · 3.5 / 4
  const float want[32] = {-43 * db, 8 * db,  8 * db,  8 * db,  8 * db,  8 * db,  8 * db,  -8 * db,
                          -8 * db,  -8 * db, 8 * db,  8 * db,  8 * db,  8 * db,  8 * db,  8 * db,
                          8 * db,   25 * db, 8 * db,  8 * db,  25 * db, 43 * db, 43 * db, 43 * db,
                          -8 * db,  -8 * db, -8 * db, -8 * db, -8 * db, -8 * db, -8 * db, -8 * db};
  for (int i = 0; i < 32; ++i) EXPECT_EQ(y[size_t(i)], want[i]) << i;
  for (int i = 32; i < 256; ++i) EXPECT_EQ(y[size_t(i)], 1.0f) << i;  // grid 0, s = 0: 8 · 0.5/4
}

// IQ4_XS: sub-block b's 6-bit scale = nibble b%2 of scales_l[b/2] + 16 · bits 2b..2b+1 of scales_h.
TEST(Dequant, Iq4xsScaleBits) {
  Bytes B(136);
  B.u16(0, H(0.5f));
  B.u16(2, uint16_t(2u << 10));  // sub-block 5: high bits 2
  B.u8(4 + 2, 0x70);             // sub-block 5: low bits 7 -> ls = 39, dl = 0.5 · 7
  B.u8(8 + 16 * 5, 0xf0);        // value 160: level 0 (-127), value 176: level 15 (113)
  const auto y = deq(DType::IQ4_XS, B.b, 256);
  EXPECT_EQ(y[160], -127 * 3.5f);
  EXPECT_EQ(y[176], 113 * 3.5f);
  EXPECT_EQ(y[161], -127 * 3.5f);
  EXPECT_EQ(y[0], -127 * -16.0f);  // ls = 0: dl = 0.5 · -32
}

// IQ1_M: the F16 super-scale is the top nibbles of the four 16-bit scale words (word 0 holds
// its lowest bits); 3-bit scales per 16 values below them; one qh nibble per 8 values gives
// 3 index bits and the sign of the ±1/8 shift.
TEST(Dequant, Iq1mScaleAssemblyAndShift) {
  Bytes B(56);
  const uint16_t d = H(0.25f);  // 0x3400
  const uint16_t low12 = uint16_t(5 | (2 << 3));  // values 0..15: s = 5, values 16..31: s = 2
  B.u16(48, uint16_t(low12 | ((d & 0xf) << 12)));
  B.u16(50, uint16_t(((d >> 4) & 0xf) << 12));
  B.u16(52, uint16_t(((d >> 8) & 0xf) << 12));
  B.u16(54, uint16_t(((d >> 12) & 0xf) << 12));
  B.u8(32, 0x08);  // values 0..7: index 0 (all -1), shift -1/8; values 8..15: index 0, +1/8
  const auto y = deq(DType::IQ1_M, B.b, 256);
  for (int i = 0; i < 8; ++i) EXPECT_EQ(y[size_t(i)], 2.75f * (-1.0f - 0.125f)) << i;
  for (int i = 8; i < 16; ++i) EXPECT_EQ(y[size_t(i)], 2.75f * (-1.0f + 0.125f)) << i;
  for (int i = 16; i < 32; ++i) EXPECT_EQ(y[size_t(i)], 1.25f * (-1.0f + 0.125f)) << i;
  for (int i = 32; i < 256; ++i) EXPECT_EQ(y[size_t(i)], 0.25f * (-1.0f + 0.125f)) << i;
}

// TQ1_0: a byte is 5 trits (value + 1) as a base-3 fraction, most significant first; trit k
// of qs byte m is value 32k + m, of qs byte 32 + m value 160 + 16k + m, of qh byte m value
// 240 + 4k + m. 188 encodes trits 2, 0, 1, 2, 1 (ggml's encoder: ceil(178 · 256 / 243)).
TEST(Dequant, Tq1TritOrder) {
  Bytes B(54);
  B.u8(0, 188);
  B.u8(40, 188);
  B.u8(49, 188);
  B.u16(52, H(1.0f));
  const auto y = deq(DType::TQ1_0, B.b, 256);
  const int idx_qs0[5] = {0, 32, 64, 96, 128}, idx_qs40[5] = {168, 184, 200, 216, 232};
  const int idx_qh1[4] = {241, 245, 249, 253};
  const float trits[5] = {1, -1, 0, 1, 0};
  for (int k = 0; k < 5; ++k) {
    EXPECT_EQ(y[size_t(idx_qs0[k])], trits[k]) << k;
    EXPECT_EQ(y[size_t(idx_qs40[k])], trits[k]) << k;
  }
  for (int k = 0; k < 4; ++k) EXPECT_EQ(y[size_t(idx_qh1[k])], trits[k]) << k;
  EXPECT_EQ(y[1], -1.0f);  // a zero byte holds five zero trits: value -1
}

TEST(Dot, IqTypesEqualSumOfDequantTimesX) {
  std::mt19937 rng(17);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (DType t : kIqTypes) {
    const int64_t n = 1024;
    const auto w = lcg_blocks(t, int(n / dtype_info(t).block_elems));
    std::vector<float> x(static_cast<size_t>(n));
    for (auto& v : x) v = nd(rng);
    const auto y = deq(t, w, n);
    double ref = 0.0, mag = 0.0;
    for (int64_t i = 0; i < n; ++i) {
      ref += double(y[size_t(i)]) * x[size_t(i)];
      mag += std::fabs(double(y[size_t(i)]) * x[size_t(i)]);
    }
    EXPECT_NEAR(dot_row_ref(t, w.data(), x.data(), n), ref, 1e-5 * mag) << dtype_name(t);
  }
}

// Every bit pattern is a block: all-ones bytes (the largest grid index of every type, every
// scale at its maximum) decode to finite values within the format's range.
TEST(Dequant, IqAllOnesBlocksStayInRange) {
  for (DType t : kIqTypes) {
    const size_t bb = dtype_info(t).block_bytes;
    const int64_t qk = dtype_info(t).block_elems;
    std::vector<uint8_t> w(bb * 4, 0xff);
    for (size_t k = 0; k < 4; ++k) {  // keep the F16 scale finite: 1.0
      const size_t off = k * bb + (t == DType::TQ1_0 ? 52 : t == DType::TQ2_0 ? 64 : 0);
      if (t != DType::IQ1_M) {
        w[off] = 0x00;
        w[off + 1] = 0x3c;
      }
    }
    if (t == DType::IQ1_M)
      for (size_t k = 0; k < 4; ++k) w[k * bb + 55] = 0x3f;  // super-scale 0x3fff: 1.999
    const auto y = deq(t, w, 4 * qk);
    for (float v : y) {
      ASSERT_TRUE(std::isfinite(v)) << dtype_name(t);
      ASSERT_LE(std::fabs(v), 2.0f * 64 * 31) << dtype_name(t);
    }
  }
}

// ==== quantize ==============================================================================

TEST(Quantize, Q8_0HandCase) {
  // amax = 127 -> d = 1: q = round(x), halves away from zero.
  float x[32];
  for (int j = 0; j < 32; ++j) x[j] = float(j - 16);
  const float head[8] = {127.0f, -63.5f, 0.5f, -0.5f, 2.5f, 1.49f, -126.6f, 0.0f};
  std::memcpy(x, head, sizeof head);
  const int8_t q_head[8] = {127, -64, 1, -1, 3, 1, -127, 0};
  BlockQ8_0 blk;
  ASSERT_TRUE(quantize_row_ref(DType::Q8_0, x, &blk, 32));
  uint8_t raw[34];
  std::memcpy(raw, &blk, 34);
  EXPECT_EQ(raw[0], 0x00);
  EXPECT_EQ(raw[1], 0x3C);
  for (int j = 0; j < 8; ++j) EXPECT_EQ(int8_t(raw[2 + j]), q_head[j]) << j;
  for (int j = 8; j < 32; ++j) EXPECT_EQ(int8_t(raw[2 + j]), j - 16) << j;
  // All zeros: d = 0, all q = 0 (no division by zero).
  float z[32] = {};
  ASSERT_TRUE(quantize_row_ref(DType::Q8_0, z, &blk, 32));
  std::memcpy(raw, &blk, 34);
  for (int j = 0; j < 34; ++j) EXPECT_EQ(raw[j], 0) << j;
}

TEST(Quantize, Q4_0HandCase) {
  float x[32] = {};
  x[0] = 0.5f, x[1] = -0.5f, x[2] = 7.0f, x[3] = 7.6f, x[4] = -7.9f, x[5] = -8.0f, x[6] = 1.49f;
  x[16] = 3.0f, x[17] = -3.0f;
  // The signed value of largest magnitude is -8: d = -8 / -8 = 1, q = min(15, (int)(x + 8.5)).
  const uint8_t want[16] = {0xB9, 0x58, 0x8F, 0x8F, 0x80, 0x80, 0x89, 0x88,
                            0x88, 0x88, 0x88, 0x88, 0x88, 0x88, 0x88, 0x88};
  uint8_t raw[36];
  ASSERT_TRUE(quantize_row_ref(DType::Q4_0, x, raw, 32));
  EXPECT_EQ(raw[0], 0x00);
  EXPECT_EQ(raw[1], 0x3C);
  for (int j = 0; j < 16; ++j) EXPECT_EQ(raw[2 + j], want[j]) << j;
  // Negated input: max = +8, d = -1, the same codes.
  float xn[64];
  for (int j = 0; j < 32; ++j) xn[j] = x[j], xn[32 + j] = -x[j];
  ASSERT_TRUE(quantize_row_ref(DType::Q4_0, xn, raw, 64));
  EXPECT_EQ(raw[18], 0x00);
  EXPECT_EQ(raw[19], 0xBC);
  for (int j = 0; j < 16; ++j) EXPECT_EQ(raw[20 + j], want[j]) << j;
}

TEST(Quantize, Q4_1HandCase) {
  float x[32] = {};
  x[0] = -1.0f, x[1] = 14.0f, x[2] = 2.4f, x[3] = 2.5f, x[16] = 13.6f, x[17] = 5.0f;
  // min -1, max 14: d = 1, m = -1, q = min(15, (int)(x + 1 + 0.5)).
  const uint8_t want[16] = {0xF0, 0x6F, 0x13, 0x14, 0x11, 0x11, 0x11, 0x11,
                            0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x11};
  uint8_t raw[20];
  ASSERT_TRUE(quantize_row_ref(DType::Q4_1, x, raw, 32));
  EXPECT_EQ(raw[0], 0x00);
  EXPECT_EQ(raw[1], 0x3C);
  EXPECT_EQ(raw[2], 0x00);
  EXPECT_EQ(raw[3], 0xBC);
  for (int j = 0; j < 16; ++j) EXPECT_EQ(raw[4 + j], want[j]) << j;
}

TEST(Quantize, Q5_0HandCase) {
  float x[32] = {};
  x[0] = 0.5f, x[1] = -0.5f, x[2] = 15.0f, x[3] = -15.6f, x[16] = 1.0f, x[20] = -16.0f, x[21] = 15.9f;
  // max -16 (at j = 20): d = 1, q = min(31, (int)(x + 16.5)); codes 17,16,31,0,16.. | 17,16,16,16,0,31,16..
  uint8_t raw[22];
  ASSERT_TRUE(quantize_row_ref(DType::Q5_0, x, raw, 32));
  EXPECT_EQ(raw[0], 0x00);
  EXPECT_EQ(raw[1], 0x3C);
  // qh: every code but those of j = 3 and j = 20 has its fifth bit set.
  const uint32_t qh = uint32_t(raw[2]) | uint32_t(raw[3]) << 8 | uint32_t(raw[4]) << 16 | uint32_t(raw[5]) << 24;
  EXPECT_EQ(qh, 0xFFEFFFF7u);
  const uint8_t want[16] = {0x11, 0x00, 0x0F, 0x00, 0x00, 0xF0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
  for (int j = 0; j < 16; ++j) EXPECT_EQ(raw[6 + j], want[j]) << j;
}

TEST(Quantize, Q5_1HandCase) {
  float x[32];
  for (auto& v : x) v = 8.0f;
  x[0] = 0.0f, x[1] = 31.0f, x[2] = 16.5f, x[3] = 15.49f, x[17] = 30.7f;
  // min 0, max 31: d = 1, m = 0, q = (int)(x + 0.5): codes 0,31,17,15,8.. | 8,31,8..
  uint8_t raw[24];
  ASSERT_TRUE(quantize_row_ref(DType::Q5_1, x, raw, 32));
  EXPECT_EQ(raw[0], 0x00);
  EXPECT_EQ(raw[1], 0x3C);
  EXPECT_EQ(raw[2], 0x00);
  EXPECT_EQ(raw[3], 0x00);
  const uint32_t qh = uint32_t(raw[4]) | uint32_t(raw[5]) << 8 | uint32_t(raw[6]) << 16 | uint32_t(raw[7]) << 24;
  EXPECT_EQ(qh, 0x00020006u);
  const uint8_t want[4] = {0x80, 0xFF, 0x81, 0x8F};
  for (int j = 0; j < 4; ++j) EXPECT_EQ(raw[8 + j], want[j]) << j;
  for (int j = 4; j < 16; ++j) EXPECT_EQ(raw[8 + j], 0x88) << j;
}

TEST(Quantize, FloatTypes) {
  const float x[6] = {1.0f, -0.1f, 65520.0f, 1e-30f, 3.14159265f, -0.0f};
  uint16_t h[6], b[6];
  float f[6];
  ASSERT_TRUE(quantize_row_ref(DType::F16, x, h, 6));
  ASSERT_TRUE(quantize_row_ref(DType::BF16, x, b, 6));
  ASSERT_TRUE(quantize_row_ref(DType::F32, x, f, 6));
  for (int i = 0; i < 6; ++i) {
    EXPECT_EQ(h[i], fp32_to_fp16(x[i]));
    EXPECT_EQ(b[i], fp32_to_bf16(x[i]));
    EXPECT_EQ(std::memcmp(&f[i], &x[i], 4), 0);
  }
}

// quantize -> dequantize stays within each type's rounding bound, block by block.
TEST(Quantize, RoundTripBounds) {
  std::mt19937 rng(11);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const int nb = 96;
  std::vector<float> x(32 * nb);
  const float scales[3] = {0.05f, 1.0f, 30.0f};
  for (int k = 0; k < nb; ++k) {
    for (int j = 0; j < 32; ++j) x[32 * k + j] = nd(rng) * scales[k % 3] + (k % 5 == 0 ? 2.0f : 0.0f);
    if (k % 7 == 3) x[32 * k + 5] *= 8.0f;  // an outlier
  }
  for (int j = 0; j < 32; ++j) x[32 * 10 + j] = 0.0f;   // all-zero block
  for (int j = 0; j < 32; ++j) x[32 * 11 + j] = 0.75f;  // constant block
  const double f16_rel = std::ldexp(1.0, -11);          // half a half-ulp, relative
  const double tiny = std::ldexp(1.0, -25);             // half the f16 subnormal spacing
  for (DType t : {DType::Q8_0, DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q5_1, DType::F16,
                  DType::BF16, DType::F32}) {
    SCOPED_TRACE(dtype_name(t));
    std::vector<uint8_t> buf(*row_bytes(t, int64_t(x.size())));
    ASSERT_TRUE(quantize_row_ref(t, x.data(), buf.data(), int64_t(x.size())));
    auto y = deq(t, buf, int64_t(x.size()));
    for (int k = 0; k < nb; ++k) {
      const float* xb = &x[32 * k];
      double amax = 0, mn = xb[0], mx = xb[0];
      for (int j = 0; j < 32; ++j) {
        amax = std::max(amax, std::fabs(double(xb[j])));
        mn = std::min(mn, double(xb[j]));
        mx = std::max(mx, double(xb[j]));
      }
      for (int j = 0; j < 32; ++j) {
        const double xv = xb[j], err = std::fabs(double(y[32 * k + j]) - xv);
        double bound = 0;
        switch (t) {
          case DType::F32: bound = 0; break;
          case DType::F16: bound = std::fabs(xv) * f16_rel + tiny; break;  // tiny: subnormals
          case DType::BF16: bound = std::fabs(xv) * std::ldexp(1.0, -8); break;
          // Half a step, plus the f16 rounding of d times the largest code.
          case DType::Q8_0: bound = amax / 127 * (0.5 + 127 * f16_rel); break;
          // The code opposite the signed maximum can clamp (8 -> 7): up to a full step.
          case DType::Q4_0: bound = amax / 8 * (1.0 + 8 * f16_rel); break;
          case DType::Q5_0: bound = amax / 16 * (1.0 + 16 * f16_rel); break;
          case DType::Q4_1: bound = (mx - mn) / 15 * (0.5 + 15 * f16_rel) + std::fabs(mn) * f16_rel + tiny; break;
          case DType::Q5_1: bound = (mx - mn) / 31 * (0.5 + 31 * f16_rel) + std::fabs(mn) * f16_rel + tiny; break;
          default: FAIL();
        }
        // Slack for the float rounding of x·(1/d) itself (well below 1e-4 of a step).
        ASSERT_LE(err, bound * (1 + 1e-4) + 1e-30) << "block " << k << " elem " << j << " x " << xv;
      }
      if (k == 10) {
        for (int j = 0; j < 32; ++j) ASSERT_EQ(y[32 * k + j], 0.0f);
      }
      if (k == 11 && t != DType::Q8_0) {  // 0.75/127 is not an f16: Q8_0 is only within bound
        for (int j = 0; j < 32; ++j) ASSERT_EQ(y[32 * k + j], 0.75f);
      }
    }
  }
}

// ==== real llama.cpp data ===================================================================

namespace {

// Just enough GGUF (§4.1) to find tensors: header, KVs skipped by type (keeping
// general.alignment), tensor infos, aligned data start. Bounds-checked throughout.
struct MiniTensor {
  std::string name;
  uint32_t type = 0;
  std::vector<int64_t> ne;
  uint64_t offset = 0;
  int64_t nelem() const {
    int64_t n = 1;
    for (auto v : ne) n *= v;
    return n;
  }
};

struct MiniGguf {
  std::vector<uint8_t> bytes;
  std::vector<MiniTensor> tensors;
  size_t data_start = 0;
  const MiniTensor* find(const std::string& name) const {
    for (const auto& t : tensors)
      if (t.name == name) return &t;
    return nullptr;
  }
  const uint8_t* data(const MiniTensor& t, size_t size) const {
    if (data_start + t.offset + size > bytes.size()) throw std::runtime_error("tensor out of file: " + t.name);
    return bytes.data() + data_start + t.offset;
  }
};

class Cursor {
 public:
  explicit Cursor(const std::vector<uint8_t>& b) : b_(b) {}
  template <typename T>
  T get() {
    need(sizeof(T));
    T v;
    std::memcpy(&v, b_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  std::string str() {
    const uint64_t n = get<uint64_t>();
    need(n);
    std::string s(reinterpret_cast<const char*>(b_.data() + pos_), size_t(n));
    pos_ += size_t(n);
    return s;
  }
  void skip(uint64_t n) {
    need(n);
    pos_ += size_t(n);
  }
  size_t pos() const { return pos_; }

 private:
  void need(uint64_t n) const {
    if (n > b_.size() - pos_) throw std::runtime_error("truncated GGUF");
  }
  const std::vector<uint8_t>& b_;
  size_t pos_ = 0;
};

void skip_value(Cursor& c, uint32_t type, int depth = 0) {
  static const std::map<uint32_t, size_t> fixed = {{0, 1}, {1, 1}, {2, 2}, {3, 2}, {4, 4}, {5, 4}, {6, 4},
                                                   {7, 1}, {10, 8}, {11, 8}, {12, 8}};
  if (type == 8) {
    c.str();
  } else if (type == 9) {
    if (depth > 2) throw std::runtime_error("nested arrays too deep");
    const uint32_t et = c.get<uint32_t>();
    const uint64_t n = c.get<uint64_t>();
    auto it = fixed.find(et);
    if (it != fixed.end()) {
      if (n > (uint64_t(1) << 40)) throw std::runtime_error("array too long");
      c.skip(n * it->second);
    } else {
      for (uint64_t i = 0; i < n; ++i) skip_value(c, et, depth + 1);
    }
  } else {
    auto it = fixed.find(type);
    if (it == fixed.end()) throw std::runtime_error("bad KV type " + std::to_string(type));
    c.skip(it->second);
  }
}

MiniGguf read_gguf(const std::string& path) {
  MiniGguf g;
  g.bytes = step35::testing::read_bytes(path);
  Cursor c(g.bytes);
  if (c.get<uint32_t>() != 0x46554747u) throw std::runtime_error("not GGUF: " + path);  // "GGUF"
  if (c.get<uint32_t>() != 3) throw std::runtime_error("not GGUF v3: " + path);
  const int64_t n_tensors = c.get<int64_t>(), n_kv = c.get<int64_t>();
  uint64_t alignment = 32;
  for (int64_t i = 0; i < n_kv; ++i) {
    const std::string key = c.str();
    const uint32_t type = c.get<uint32_t>();
    if (key == "general.alignment" && type == 4)
      alignment = c.get<uint32_t>();
    else
      skip_value(c, type);
  }
  for (int64_t i = 0; i < n_tensors; ++i) {
    MiniTensor t;
    t.name = c.str();
    const uint32_t nd = c.get<uint32_t>();
    if (nd > 4) throw std::runtime_error("bad n_dims");
    for (uint32_t d = 0; d < nd; ++d) t.ne.push_back(c.get<int64_t>());
    t.type = c.get<uint32_t>();
    t.offset = c.get<uint64_t>();
    g.tensors.push_back(std::move(t));
  }
  if (alignment == 0) throw std::runtime_error("bad alignment");
  g.data_start = size_t((c.pos() + alignment - 1) / alignment * alignment);
  return g;
}

// Tensor as F32 values (the f32 file), checked to be F32.
std::vector<float> f32_tensor(const MiniGguf& g, const MiniTensor& t) {
  EXPECT_EQ(t.type, 0u) << t.name;
  std::vector<float> v(size_t(t.nelem()));
  std::memcpy(v.data(), g.data(t, v.size() * 4), v.size() * 4);
  return v;
}

// Re-encodes every tensor of `ref` (F32) as `want` and compares bytes with the same tensor of
// `quant` (the llama.cpp / generator output). Returns the number of tensors compared as `want`.
int expect_same_encoding(const MiniGguf& ref, const MiniGguf& quant, DType want) {
  int n_want = 0;
  for (const auto& qt : quant.tensors) {
    const MiniTensor* rt = ref.find(qt.name);
    if (!rt) {
      ADD_FAILURE() << "missing in f32 file: " << qt.name;
      continue;
    }
    EXPECT_EQ(rt->ne, qt.ne) << qt.name;
    const DTypeInfo* info = dtype_info(qt.type);
    if (!info) {
      ADD_FAILURE() << qt.name << ": unsupported type " << qt.type;
      continue;
    }
    if (info->type != want && info->type != DType::F32) {
      ADD_FAILURE() << qt.name << " has type " << info->name;
      continue;
    }
    const int64_t ne0 = qt.ne.at(0), rows = qt.nelem() / ne0;
    const size_t rb = *row_bytes(info->type, ne0);
    const std::vector<float> src = f32_tensor(ref, *rt);
    std::vector<uint8_t> mine(rb * size_t(rows));
    bool ok = true;
    for (int64_t r = 0; r < rows; ++r)
      ok = ok && quantize_row_ref(info->type, src.data() + r * ne0, mine.data() + size_t(r) * rb, ne0);
    EXPECT_TRUE(ok) << qt.name;
    const uint8_t* theirs = quant.data(qt, mine.size());
    size_t first_diff = mine.size();
    for (size_t i = 0; i < mine.size() && first_diff == mine.size(); ++i)
      if (mine[i] != theirs[i]) first_diff = i;
    EXPECT_EQ(first_diff, mine.size()) << qt.name << " (" << info->name << "): first differing byte "
                                       << first_diff << " of " << mine.size();
    if (info->type == want) ++n_want;
  }
  return n_want;
}

// Dequantizes every tensor of `quant` and compares with the F32 original: all finite,
// relative rms error below max_rel. Returns the set of types seen.
std::set<std::string> expect_close_dequant(const MiniGguf& ref, const MiniGguf& quant, double max_rel) {
  std::set<std::string> seen;
  for (const auto& qt : quant.tensors) {
    const MiniTensor* rt = ref.find(qt.name);
    if (!rt) {
      ADD_FAILURE() << "missing in f32 file: " << qt.name;
      continue;
    }
    EXPECT_EQ(rt->ne, qt.ne) << qt.name;
    const DTypeInfo* info = dtype_info(qt.type);
    if (!info) {
      ADD_FAILURE() << qt.name << ": unsupported type " << qt.type;
      continue;
    }
    seen.insert(info->name);
    const int64_t ne0 = qt.ne.at(0), rows = qt.nelem() / ne0;
    const size_t rb = *row_bytes(info->type, ne0);
    const uint8_t* q = quant.data(qt, rb * size_t(rows));
    const std::vector<float> want = f32_tensor(ref, *rt);
    std::vector<float> got(want.size());
    for (int64_t r = 0; r < rows; ++r)
      dequantize_row_ref(info->type, q + size_t(r) * rb, got.data() + r * ne0, ne0);
    double se = 0, ss = 0;
    bool finite = true;
    for (size_t i = 0; i < got.size(); ++i) {
      finite = finite && std::isfinite(got[i]);
      se += (double(got[i]) - want[i]) * (double(got[i]) - want[i]);
      ss += double(want[i]) * want[i];
    }
    EXPECT_TRUE(finite) << qt.name;
    const double rel = ss > 0 ? std::sqrt(se / ss) : std::sqrt(se);
    if (info->type == DType::F32)
      EXPECT_EQ(se, 0.0) << qt.name;
    else
      EXPECT_LT(rel, max_rel) << qt.name << " (" << info->name << ")";
  }
  return seen;
}

std::string model_or_skip(const std::string& file) {
  const std::string p = step35::testing::fixture_model(file);
  return step35::testing::file_exists(p) ? p : "";
}

}  // namespace

TEST(Fixtures, Q8_0BytesMatchLlamaQuantize) {
  const std::string f32 = model_or_skip("tiny-a-f32.gguf"), q8 = model_or_skip("tiny-a-q8_0.gguf");
  if (f32.empty() || q8.empty()) GTEST_SKIP() << "tiny-a fixtures not found in " << step35::testing::fixtures_dir();
  const MiniGguf ref = read_gguf(f32), quant = read_gguf(q8);
  for (const char* name : {"blk.0.attn_q.weight", "output.weight"}) {
    const MiniTensor* t = quant.find(name);
    ASSERT_NE(t, nullptr) << name;
    EXPECT_EQ(t->type, uint32_t(DType::Q8_0)) << name;
  }
  EXPECT_GT(expect_same_encoding(ref, quant, DType::Q8_0), 50);
}

TEST(Fixtures, F16BytesMatchFixture) {
  const std::string f32 = model_or_skip("tiny-a-f32.gguf"), f16 = model_or_skip("tiny-a-f16.gguf");
  if (f32.empty() || f16.empty()) GTEST_SKIP() << "tiny-a fixtures not found in " << step35::testing::fixtures_dir();
  const MiniGguf ref = read_gguf(f32), quant = read_gguf(f16);
  EXPECT_GT(expect_same_encoding(ref, quant, DType::F16), 50);
}

TEST(Fixtures, DequantTinyAQ4_K_M) {
  const std::string f32 = model_or_skip("tiny-a-f32.gguf"), qk = model_or_skip("tiny-a-q4_k_m.gguf");
  if (f32.empty() || qk.empty()) GTEST_SKIP() << "tiny-a fixtures not found in " << step35::testing::fixtures_dir();
  const auto seen = expect_close_dequant(read_gguf(f32), read_gguf(qk), 0.15);
  for (const char* t : {"q4_K", "q5_0", "q6_K", "q8_0", "f32"}) EXPECT_TRUE(seen.count(t)) << t;
}

TEST(Fixtures, DequantTinyKQ4_K_M) {
  const std::string qk = model_or_skip("tiny-k-q4_k_m.gguf");
  if (qk.empty()) GTEST_SKIP() << "tiny-k-q4_k_m.gguf not found in " << step35::testing::fixtures_dir();
  std::string why;
  const std::string f32 = step35::testing::regenerated_fixture("tiny-k-f32.gguf", &why);
  if (f32.empty()) GTEST_SKIP() << "cannot regenerate tiny-k-f32.gguf: " << why;
  const auto seen = expect_close_dequant(read_gguf(f32), read_gguf(qk), 0.15);
  for (const char* t : {"q4_K", "q6_K", "f32"}) EXPECT_TRUE(seen.count(t)) << t;
}

// Every IQ tensor of the shipped tiny-q files (made by llama-quantize with an importance
// matrix) dequantizes to exactly what llama.cpp's gguf-py decoders give: checksums of the
// F32 bits as weighted_bits() computes them.
TEST(Fixtures, DequantTinyQIqTensorsMatchLlamaCpp) {
  struct Expect {
    const char* file;
    const char* tensor;
    uint64_t sum;
  };
  const Expect expects[] = {
      {"tiny-q-iq1_m.gguf", "blk.0.attn_gate.weight", 0x0007d6796c14a240ull},
      {"tiny-q-iq1_m.gguf", "blk.0.attn_q.weight", 0x7c821bdd63de54e0ull},
      {"tiny-q-iq1_m.gguf", "blk.0.ffn_down.weight", 0xf19167f14587edc0ull},
      {"tiny-q-iq1_m.gguf", "blk.0.ffn_gate.weight", 0xf45349cdc33dffc0ull},
      {"tiny-q-iq1_m.gguf", "blk.0.ffn_up.weight", 0xf3ebe30b361fec60ull},
      {"tiny-q-iq1_m.gguf", "blk.1.attn_gate.weight", 0x001f80a9f0ab3700ull},
      {"tiny-q-iq1_m.gguf", "blk.1.attn_q.weight", 0xf3e819ea41705c40ull},
      {"tiny-q-iq1_m.gguf", "blk.1.ffn_down_exps.weight", 0x278a2070ba531f20ull},
      {"tiny-q-iq1_m.gguf", "blk.1.ffn_down_shexp.weight", 0x7c0c946990118be0ull},
      {"tiny-q-iq1_m.gguf", "blk.1.ffn_gate_exps.weight", 0x33b746b740606620ull},
      {"tiny-q-iq1_m.gguf", "blk.1.ffn_gate_shexp.weight", 0x7e34a0a79473b240ull},
      {"tiny-q-iq1_m.gguf", "blk.1.ffn_up_exps.weight", 0x3b76fb68b8d29be0ull},
      {"tiny-q-iq1_m.gguf", "blk.1.ffn_up_shexp.weight", 0x7ccd4cbb6799f920ull},
      {"tiny-q-iq2_xxs.gguf", "blk.0.attn_gate.weight", 0x0007d7bd3e3f2fd4ull},
      {"tiny-q-iq2_xxs.gguf", "blk.0.attn_q.weight", 0x7cd03baa07e353d0ull},
      {"tiny-q-iq2_xxs.gguf", "blk.0.ffn_down.weight", 0xf1d751df4b60ff48ull},
      {"tiny-q-iq2_xxs.gguf", "blk.0.ffn_gate.weight", 0xf4c6cf6999243120ull},
      {"tiny-q-iq2_xxs.gguf", "blk.0.ffn_up.weight", 0xf378f16415c05698ull},
      {"tiny-q-iq2_xxs.gguf", "blk.1.attn_gate.weight", 0x001f9ba2c60252f0ull},
      {"tiny-q-iq2_xxs.gguf", "blk.1.attn_q.weight", 0xf47a4ed99e104174ull},
      {"tiny-q-iq2_xxs.gguf", "blk.1.ffn_down_exps.weight", 0x3411fd6ab1198194ull},
      {"tiny-q-iq2_xxs.gguf", "blk.1.ffn_down_shexp.weight", 0x7c487016cc650c90ull},
      {"tiny-q-iq2_xxs.gguf", "blk.1.ffn_gate_exps.weight", 0x3e5b83864a20e724ull},
      {"tiny-q-iq2_xxs.gguf", "blk.1.ffn_gate_shexp.weight", 0x7d71e5331bd26634ull},
      {"tiny-q-iq2_xxs.gguf", "blk.1.ffn_up_exps.weight", 0x47d35efc03fd4f54ull},
      {"tiny-q-iq2_xxs.gguf", "blk.1.ffn_up_shexp.weight", 0x7d128f1ec6ffa454ull},
      {"tiny-q-iq3_s.gguf", "token_embd.weight", 0xfe31948f7a290e40ull},
      {"tiny-q-iq3_s.gguf", "blk.0.attn_gate.weight", 0x0007cb50ab1d2bd0ull},
      {"tiny-q-iq3_s.gguf", "blk.0.attn_q.weight", 0x7cdae8b7e29ef720ull},
      {"tiny-q-iq3_s.gguf", "blk.0.ffn_down.weight", 0xf0f8410221b8ab40ull},
      {"tiny-q-iq3_s.gguf", "blk.0.ffn_gate.weight", 0xf371de28af8861d0ull},
      {"tiny-q-iq3_s.gguf", "blk.0.ffn_up.weight", 0xf40c38a12c56cdb0ull},
      {"tiny-q-iq3_s.gguf", "blk.1.attn_gate.weight", 0x001f99427d4a6b30ull},
      {"tiny-q-iq3_s.gguf", "blk.1.attn_q.weight", 0xf473a7afc9c8ea30ull},
      {"tiny-q-iq3_s.gguf", "blk.1.ffn_down_exps.weight", 0x313d40d7b1fc0370ull},
      {"tiny-q-iq3_s.gguf", "blk.1.ffn_down_shexp.weight", 0x7c256fea1c13fb90ull},
      {"tiny-q-iq3_s.gguf", "blk.1.ffn_gate_exps.weight", 0x3e4b436e436f8fa0ull},
      {"tiny-q-iq3_s.gguf", "blk.1.ffn_gate_shexp.weight", 0x7da271a1156f7470ull},
      {"tiny-q-iq3_s.gguf", "blk.1.ffn_up_exps.weight", 0x432e392dc5a85af0ull},
      {"tiny-q-iq3_s.gguf", "blk.1.ffn_up_shexp.weight", 0x7d02fd5911b07f70ull},
      {"tiny-q-iq3_s.gguf", "blk.2.attn_gate.weight", 0x001fb9fc859319a0ull},
      {"tiny-q-iq3_s.gguf", "blk.2.attn_q.weight", 0xf5b5bfc187d41670ull},
      {"tiny-q-iq3_s.gguf", "blk.2.ffn_down.weight", 0xf09967682b894e10ull},
      {"tiny-q-iq3_s.gguf", "blk.2.ffn_gate.weight", 0xf48357c436e365b0ull},
      {"tiny-q-iq3_s.gguf", "blk.2.ffn_up.weight", 0xf455bb738e9d7c30ull},
      {"tiny-q-iq3_s.gguf", "blk.2.nextn.eh_proj.weight", 0xf3e316be7c9fdef0ull},
      {"tiny-q-iq3_s.gguf", "blk.2.nextn.shared_head_head.weight", 0xf829d11383cd3c10ull},
      {"tiny-q-iq4_xs.gguf", "token_embd.weight", 0xfd33b1c5cf026da0ull},
      {"tiny-q-iq4_xs.gguf", "blk.0.attn_gate.weight", 0x0007d053b0636ca0ull},
      {"tiny-q-iq4_xs.gguf", "blk.0.attn_q.weight", 0x7cc07cbd9a2ddc10ull},
      {"tiny-q-iq4_xs.gguf", "blk.0.ffn_down.weight", 0xf047751a5c7f9ac8ull},
      {"tiny-q-iq4_xs.gguf", "blk.0.ffn_gate.weight", 0xf2e6e112290878c8ull},
      {"tiny-q-iq4_xs.gguf", "blk.0.ffn_up.weight", 0xf315da5a1309c818ull},
      {"tiny-q-iq4_xs.gguf", "blk.1.attn_gate.weight", 0x001f7a15c1659a48ull},
      {"tiny-q-iq4_xs.gguf", "blk.1.attn_q.weight", 0xf3487380d6f014b0ull},
      {"tiny-q-iq4_xs.gguf", "blk.1.ffn_down_exps.weight", 0x22a16e257bccc110ull},
      {"tiny-q-iq4_xs.gguf", "blk.1.ffn_down_shexp.weight", 0x7c0055fe2eaa5618ull},
      {"tiny-q-iq4_xs.gguf", "blk.1.ffn_gate_exps.weight", 0x3adadc84cecfd52cull},
      {"tiny-q-iq4_xs.gguf", "blk.1.ffn_gate_shexp.weight", 0x7d3bfff685c94064ull},
      {"tiny-q-iq4_xs.gguf", "blk.1.ffn_up_exps.weight", 0x38dea396ca6aa9ccull},
      {"tiny-q-iq4_xs.gguf", "blk.1.ffn_up_shexp.weight", 0x7cf0d70a98314b58ull},
      {"tiny-q-iq4_xs.gguf", "blk.2.attn_gate.weight", 0x001f3c20d053d804ull},
      {"tiny-q-iq4_xs.gguf", "blk.2.attn_q.weight", 0xf42e8e8344dcdfacull},
      {"tiny-q-iq4_xs.gguf", "blk.2.ffn_down.weight", 0xf08e3cc3b526d410ull},
      {"tiny-q-iq4_xs.gguf", "blk.2.ffn_gate.weight", 0xf42e2a1d2b83a8a8ull},
      {"tiny-q-iq4_xs.gguf", "blk.2.ffn_up.weight", 0xf472d145113cb670ull},
      {"tiny-q-iq4_xs.gguf", "blk.2.nextn.eh_proj.weight", 0xf34ca6f7f46653f0ull},
      {"tiny-q-iq4_xs.gguf", "blk.2.nextn.shared_head_head.weight", 0xf71c8ad008f29acaull},
  };
  std::map<std::string, MiniGguf> files;
  std::map<std::string, int> per_type;
  for (const Expect& e : expects) {
    auto it = files.find(e.file);
    if (it == files.end()) {
      const std::string path = step35::testing::fixtures_dir() + "/models-iq/" + e.file;
      if (!step35::testing::file_exists(path)) GTEST_SKIP() << path << " not found";
      it = files.emplace(e.file, read_gguf(path)).first;
    }
    const MiniTensor* t = it->second.find(e.tensor);
    ASSERT_NE(t, nullptr) << e.file << " " << e.tensor;
    const DTypeInfo* info = dtype_info(t->type);
    ASSERT_NE(info, nullptr) << e.file << " " << e.tensor << ": type " << t->type;
    const int64_t ne0 = t->ne.at(0), rows = t->nelem() / ne0;
    const size_t rb = *row_bytes(info->type, ne0);
    const uint8_t* q = it->second.data(*t, rb * size_t(rows));
    std::vector<float> y(size_t(t->nelem()));
    for (int64_t r = 0; r < rows; ++r) dequantize_row_ref(info->type, q + size_t(r) * rb, y.data() + r * ne0, ne0);
    EXPECT_EQ(weighted_bits(y), e.sum) << e.file << " " << e.tensor << " (" << info->name << ")";
    ++per_type[info->name];
  }
  EXPECT_EQ(per_type["iq1_m"], 13);
  EXPECT_EQ(per_type["iq2_xxs"], 13);
  EXPECT_EQ(per_type["iq3_s"], 21);
  EXPECT_EQ(per_type["iq4_xs"], 21);
}

// The IQ types only the unshipped tiny-q files hold (IQ1_S, IQ2_XS, IQ2_S, IQ3_XXS, IQ4_NL),
// once tests/scripts/regen_tiny_q.sh has made them: per file and type, the sum of the
// tensors' weighted_bits() over gguf-py's dequantization, and the tensor count.
TEST(Fixtures, DequantRegeneratedTinyQIqTensorsMatchLlamaCpp) {
  struct Expect {
    const char* file;
    const char* type;
    int tensors;
    uint64_t sum;
  };
  const Expect expects[] = {
      {"tiny-q-iq1_s.gguf", "iq1_s", 13, 0x72fe2d17473752e0ull},
      {"tiny-q-iq2_m.gguf", "iq2_s", 13, 0x84245401e2a3fc68ull},
      {"tiny-q-iq2_m.gguf", "iq3_s", 1, 0xfe31948f7a290e40ull},
      {"tiny-q-iq2_s.gguf", "iq2_xs", 13, 0x7cbcf9ceb21bc4f0ull},
      {"tiny-q-iq2_s.gguf", "iq3_s", 1, 0xfe31948f7a290e40ull},
      {"tiny-q-iq2_xs.gguf", "iq2_xs", 13, 0x7cbcf9ceb21bc4f0ull},
      {"tiny-q-iq3_xxs.gguf", "iq2_s", 2, 0x71b70710d6e1c518ull},
      {"tiny-q-iq3_xxs.gguf", "iq3_s", 1, 0xfe31948f7a290e40ull},
      {"tiny-q-iq3_xxs.gguf", "iq3_xxs", 11, 0xf5f8273006d37ef0ull},
      {"tiny-q-iq4_nl.gguf", "iq4_nl", 21, 0x07fbc844a16b0840ull},
  };
  const std::string dir = step35::testing::tiny_q_regen_dir();
  int checked = 0;
  for (const Expect& e : expects) {
    const std::string path = dir + "/" + e.file;
    if (!step35::testing::file_exists(path)) continue;
    const MiniGguf g = read_gguf(path);
    uint64_t sum = 0;
    int n = 0;
    for (const MiniTensor& t : g.tensors) {
      const DTypeInfo* info = dtype_info(t.type);
      ASSERT_NE(info, nullptr) << e.file << " " << t.name << ": type " << t.type;
      if (std::string(info->name) != e.type) continue;
      const int64_t ne0 = t.ne.at(0), rows = t.nelem() / ne0;
      const size_t rb = *row_bytes(info->type, ne0);
      const uint8_t* q = g.data(t, rb * size_t(rows));
      std::vector<float> y(size_t(t.nelem()));
      for (int64_t r = 0; r < rows; ++r) dequantize_row_ref(info->type, q + size_t(r) * rb, y.data() + r * ne0, ne0);
      sum += weighted_bits(y);
      ++n;
    }
    EXPECT_EQ(n, e.tensors) << e.file << " " << e.type;
    EXPECT_EQ(sum, e.sum) << e.file << " " << e.type;
    ++checked;
  }
  if (checked == 0) GTEST_SKIP() << "no regenerated tiny-q files in " << dir << " (tests/scripts/regen_tiny_q.sh makes them)";
}
