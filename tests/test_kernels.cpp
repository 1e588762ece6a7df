// Kernels: every SIMD level against the scalar reference on random blocks of every weight
// type (both precisions), the activation quantizers against ggml's rules, and the
// invariance contract of matmul (row splits, token counts, index lists).
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "tensor/dtype.h"
#include "tensor/fp16.h"
#include "tensor/kernels.h"
#include "tensor/kernels_impl.h"
#include "tensor/quants.h"
#include "tensor/quants_iq.h"
#include "tensor/repack.h"

namespace step35 {
namespace {

using kernels::ActRows;
using kernels::ActType;
using kernels::Isa;

const DType kAllTypes[] = {DType::F32,    DType::F16,    DType::BF16,    DType::Q8_0,   DType::Q4_0,  DType::Q4_1,
                           DType::Q5_0,   DType::Q5_1,   DType::Q2_K,    DType::Q3_K,   DType::Q4_K,  DType::Q5_K,
                           DType::Q6_K,   DType::MXFP4,  DType::IQ2_XXS, DType::IQ2_XS, DType::IQ2_S, DType::IQ3_XXS,
                           DType::IQ3_S,  DType::IQ1_S,  DType::IQ1_M,   DType::IQ4_NL, DType::IQ4_XS, DType::TQ1_0,
                           DType::TQ2_0};

// The weight types whose dot products are exact integer sums per block followed by the same
// few float steps at every level: bit for bit across ISAs (every type against Q8_K, and
// IQ4_NL, whose SIMD kernel adds its 32-blocks in the reference's order).
bool q8k_integer_dot(DType t) {
  return kernels::act_type(t, Precision::Native) == ActType::Q8_K || t == DType::IQ4_NL;
}

// Random blocks for the types without an encoder (MXFP4, the IQ types that need an
// importance matrix, TQ1_0/TQ2_0): random bytes, then the scale field made moderate so
// products stay finite (F16 super-scales of magnitude 1/16..1/8, MXFP4 exponents near 2^0,
// IQ1_M's scattered F16 scale between 1/8 and 2).
// `fill` >= 0: every byte that value instead of random (blocks at the limits of a format).
void random_codes(DType t, uint8_t* dst, int64_t n, std::mt19937& rng, int fill = -1) {
  const DTypeInfo& info = dtype_info(t);
  const int64_t nb = n / info.block_elems;
  for (int64_t b = 0; b < nb; ++b) {
    uint8_t* blk = dst + size_t(b) * info.block_bytes;
    for (size_t j = 0; j < info.block_bytes; ++j) blk[j] = fill >= 0 ? uint8_t(fill) : uint8_t(rng());
    if (t == DType::MXFP4) {
      blk[0] = uint8_t(120 + rng() % 12);
    } else if (t == DType::IQ1_M) {
      blk[55] = uint8_t((blk[55] & 0x0f) | 0x30);
    } else {
      const size_t off = t == DType::TQ1_0 ? 52 : t == DType::TQ2_0 ? 64 : 0;
      const uint16_t h = uint16_t(0x2c00 | (rng() & 0x83ff));
      std::memcpy(blk + off, &h, 2);
    }
  }
}

// Restores the ISA in use when a test ends.
struct IsaGuard {
  Isa saved = kernels::active_isa();
  ~IsaGuard() { kernels::force_isa(saved); }
};

// A random weight matrix of type t (n_out rows of n_in), quantized from normal values.
struct RandomMatrix {
  std::vector<uint8_t> bytes;
  WeightMatrix w;
  RandomMatrix(DType t, int64_t n_out, int64_t n_in, std::mt19937& rng) {
    const size_t rb = *row_bytes(t, n_in);
    bytes.resize(rb * size_t(n_out));
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<float> row(static_cast<size_t>(n_in));
    for (int64_t o = 0; o < n_out; ++o) {
      uint8_t* dst = bytes.data() + rb * size_t(o);
      for (float& v : row) v = nd(rng);
      if (!quantize_row_ref(t, row.data(), dst, n_in)) random_codes(t, dst, n_in, rng);
    }
    w.data = bytes.data();
    w.type = t;
    w.n_in = n_in;
    w.n_out = n_out;
    w.row_bytes = rb;
  }
};

struct Acts {
  std::vector<float> f32;
  std::vector<uint8_t> conv;
  ActRows rows;
  Acts(ActType t, int64_t n_tok, int64_t n, std::mt19937& rng) {
    std::normal_distribution<float> nd(0.0f, 1.0f);
    f32.resize(size_t(n_tok * n));
    for (float& v : f32) v = nd(rng);
    const size_t stride = kernels::act_row_bytes(t, n);
    conv.resize(stride * size_t(n_tok));
    kernels::convert_activations(t, f32.data(), n_tok, n, n, conv.data());
    rows.type = t;
    rows.data = conv.data();
    rows.stride = stride;
    rows.n_tok = n_tok;
  }
};

// Σ|w·x| in double over the dequantized weights: the scale of rounding differences.
double abs_dot(const WeightMatrix& w, int64_t o, const float* x) {
  std::vector<float> row(size_t(w.n_in));
  dequantize_row(w, o, row.data());
  double s = 0;
  for (int64_t i = 0; i < w.n_in; ++i) s += std::fabs(double(row[size_t(i)]) * x[i]);
  return s;
}

std::vector<float> run(const WeightMatrix& w, const ActRows& x) {
  std::vector<float> y(size_t(x.n_tok * w.n_out), -1.0f);
  kernels::matmul(w, 0, w.n_out, x, y.data(), w.n_out);
  return y;
}

class KernelTypes : public ::testing::TestWithParam<DType> {};

// Every available ISA level against the scalar level, both precisions.
TEST_P(KernelTypes, SimdMatchesScalarReference) {
  IsaGuard guard;
  const DType t = GetParam();
  std::mt19937 rng(1234 + int(t));
  const int64_t n_in = 512, n_out = 19, n_tok = 5;
  RandomMatrix m(t, n_out, n_in, rng);
  for (Precision p : {Precision::Native, Precision::Exact}) {
    Acts a(kernels::act_type(t, p), n_tok, n_in, rng);
    kernels::force_isa(Isa::Scalar);
    const std::vector<float> ref = run(m.w, a.rows);
    for (Isa isa : kernels::available_isas()) {
      kernels::force_isa(isa);
      const std::vector<float> got = run(m.w, a.rows);
      for (int64_t tk = 0; tk < n_tok; ++tk) {
        for (int64_t o = 0; o < n_out; ++o) {
          const float r = ref[size_t(tk * n_out + o)], g = got[size_t(tk * n_out + o)];
          if (p == Precision::Native && q8k_integer_dot(t)) {
            // Exact integer sums per block and the same float steps: bit for bit.
            ASSERT_EQ(r, g) << dtype_name(t) << " " << kernels::isa_name(isa) << " o=" << o << " t=" << tk;
          } else {
            const double tol = 2e-6 * abs_dot(m.w, o, a.f32.data() + tk * n_in) + 1e-6;
            ASSERT_NEAR(r, g, tol) << dtype_name(t) << " " << kernels::isa_name(isa) << " o=" << o << " t=" << tk;
          }
        }
      }
    }
  }
}

// Native (ggml-rounded activations) stays near the exact product: a check of the block
// layouts of every activation format, independent of the SIMD code.
TEST_P(KernelTypes, NativeCloseToExact) {
  const DType t = GetParam();
  std::mt19937 rng(99 + int(t));
  const int64_t n_in = 1024, n_out = 7, n_tok = 3;
  RandomMatrix m(t, n_out, n_in, rng);
  Acts native(kernels::act_type(t, Precision::Native), n_tok, n_in, rng);
  Acts exact(ActType::F32, n_tok, n_in, rng);
  exact.f32 = native.f32;
  std::memcpy(exact.conv.data(), native.f32.data(), native.f32.size() * 4);  // F32 rows are unpadded here
  exact.rows.stride = size_t(n_in) * 4;
  const std::vector<float> yn = run(m.w, native.rows), ye = run(m.w, exact.rows);
  for (int64_t tk = 0; tk < n_tok; ++tk)
    for (int64_t o = 0; o < n_out; ++o) {
      // 8-bit activations: relative error ~0.4 % of Σ|w·x| at most; BF16 ~0.4 %, F16 less.
      const double tol = 0.01 * abs_dot(m.w, o, native.f32.data() + tk * n_in);
      EXPECT_NEAR(yn[size_t(tk * n_out + o)], ye[size_t(tk * n_out + o)], tol) << dtype_name(t);
    }
}

// One (row, token) value never depends on the row range, the token count, the other
// tokens or an index list.
TEST_P(KernelTypes, InvariantToSplitsTokensAndIndex) {
  IsaGuard guard;
  const DType t = GetParam();
  for (Isa isa : kernels::available_isas()) {
    kernels::force_isa(isa);
    std::mt19937 rng(7 + int(t));
    const int64_t n_in = 256, n_out = 21, n_tok = 9;
    RandomMatrix m(t, n_out, n_in, rng);
    Acts a(kernels::act_type(t, Precision::Native), n_tok, n_in, rng);
    const std::vector<float> full = run(m.w, a.rows);
    // Odd row splits.
    std::vector<float> split(full.size(), -1.0f);
    for (int64_t o0 = 0; o0 < n_out; o0 += 5)
      kernels::matmul(m.w, o0, std::min<int64_t>(n_out, o0 + 5), a.rows, split.data(), n_out);
    ASSERT_EQ(0, std::memcmp(full.data(), split.data(), full.size() * 4));
    // Each token alone, through an index list in reverse order.
    std::vector<int32_t> idx(static_cast<size_t>(n_tok));
    for (int64_t k = 0; k < n_tok; ++k) idx[size_t(k)] = int32_t(n_tok - 1 - k);
    ActRows rev = a.rows;
    rev.idx = idx.data();
    const std::vector<float> yr = run(m.w, rev);
    for (int64_t k = 0; k < n_tok; ++k) {
      ActRows one = a.rows;
      one.data = a.rows.data + size_t(k) * a.rows.stride;
      one.n_tok = 1;
      const std::vector<float> y1 = run(m.w, one);
      ASSERT_EQ(0, std::memcmp(y1.data(), full.data() + k * n_out, size_t(n_out) * 4)) << kernels::isa_name(isa);
      ASSERT_EQ(0, std::memcmp(yr.data() + (n_tok - 1 - k) * n_out, full.data() + k * n_out, size_t(n_out) * 4));
    }
  }
}

// The multi-row / multi-token tiles (Q4_K, Q6_K: 4 rows x up to 4 tokens) give every
// (row, token) pair exactly the value of a one-row, one-token call and of the scalar
// reference, for odd row counts and ranges, every token count 1..9 (partial token groups)
// and index lists with repeats.
TEST(Kernels, RowGroupsAndTilesMatchSingleRowSingleToken) {
  IsaGuard guard;
  for (DType t : {DType::Q4_K, DType::Q5_K, DType::Q6_K, DType::Q2_K, DType::Q3_K, DType::IQ2_XXS, DType::IQ2_XS,
                  DType::IQ2_S, DType::IQ3_XXS, DType::IQ3_S, DType::IQ1_S, DType::IQ1_M, DType::IQ4_XS, DType::IQ4_NL,
                  DType::TQ1_0, DType::TQ2_0}) {
    std::mt19937 rng(4242 + int(t));
    const int64_t n_in = 768, n_out = 23, max_tok = 9;
    RandomMatrix m(t, n_out, n_in, rng);
    Acts a(kernels::act_type(t, Precision::Native), max_tok, n_in, rng);
    // Single row, single token, scalar level: the ground truth.
    kernels::force_isa(Isa::Scalar);
    std::vector<float> ref(size_t(max_tok * n_out));
    for (int64_t k = 0; k < max_tok; ++k) {
      ActRows one = a.rows;
      one.data = a.rows.data + size_t(k) * a.rows.stride;
      one.n_tok = 1;
      for (int64_t o = 0; o < n_out; ++o) kernels::matmul(m.w, o, o + 1, one, &ref[size_t(k * n_out)], 0);
    }
    for (Isa isa : kernels::available_isas()) {
      kernels::force_isa(isa);
      for (int64_t k = 0; k < max_tok; ++k) {  // one row and one token per call at this level
        ActRows one = a.rows;
        one.data = a.rows.data + size_t(k) * a.rows.stride;
        one.n_tok = 1;
        for (int64_t o = 0; o < n_out; ++o) {
          float v = -1.0f;
          kernels::matmul(m.w, o, o + 1, one, &v - o, 0);
          ASSERT_EQ(ref[size_t(k * n_out + o)], v) << dtype_name(t) << " " << kernels::isa_name(isa);
        }
      }
      for (int64_t n_tok = 1; n_tok <= max_tok; ++n_tok) {
        // Tokens through an index list with repeats, rows in odd ranges.
        std::vector<int32_t> idx(static_cast<size_t>(n_tok));
        for (int64_t j = 0; j < n_tok; ++j) idx[size_t(j)] = int32_t((j * 5 + 3) % max_tok);
        ActRows x = a.rows;
        x.idx = idx.data();
        x.n_tok = n_tok;
        for (int64_t step : {int64_t(1), int64_t(3), int64_t(7), n_out}) {
          std::vector<float> y(size_t(n_tok * n_out), -1.0f);
          for (int64_t o0 = 0; o0 < n_out; o0 += step)
            kernels::matmul(m.w, o0, std::min(n_out, o0 + step), x, y.data(), n_out);
          for (int64_t j = 0; j < n_tok; ++j)
            for (int64_t o = 0; o < n_out; ++o)
              ASSERT_EQ(ref[size_t(idx[size_t(j)] * n_out + o)], y[size_t(j * n_out + o)])
                  << dtype_name(t) << " " << kernels::isa_name(isa) << " n_tok=" << n_tok << " step=" << step
                  << " o=" << o << " j=" << j;
        }
      }
    }
  }
}

// The IQ / TQ kernels at the limits of their formats, against the scalar level bit for bit:
// blocks of all-zero and all-one bytes (largest grid indices, every sign set, extreme
// sub-block multipliers) and random bytes, times activations of ±127 whose signs follow the
// weights (every product positive: the largest pair sums the SIMD kernels form in int16),
// all +127 and all -127.
TEST(Kernels, IqBlocksAtTheLimitsMatchScalar) {
  IsaGuard guard;
  for (DType t : {DType::IQ2_XXS, DType::IQ2_XS, DType::IQ2_S, DType::IQ3_XXS, DType::IQ3_S, DType::IQ1_S,
                  DType::IQ1_M, DType::IQ4_XS, DType::IQ4_NL, DType::TQ1_0, DType::TQ2_0}) {
    std::mt19937 rng(777 + int(t));
    const int64_t n_in = 512, n_out = 6;
    RandomMatrix m(t, n_out, n_in, rng);
    for (int64_t o = 0; o < n_out; ++o)  // rows 0, 1: zero / one bytes; the rest random
      random_codes(t, m.bytes.data() + m.w.row_bytes * size_t(o), n_in, rng, o == 0 ? 0x00 : o == 1 ? 0xff : -1);
    const ActType at = kernels::act_type(t, Precision::Native);
    const size_t stride = kernels::act_row_bytes(at, n_in);
    std::vector<float> x(size_t(n_out + 2) * size_t(n_in));
    for (int64_t o = 0; o < n_out; ++o) {  // activation row o: the signs of weight row o
      std::vector<float> w(static_cast<size_t>(n_in));
      dequantize_row(m.w, o, w.data());
      for (int64_t i = 0; i < n_in; ++i) x[size_t(o * n_in + i)] = w[size_t(i)] < 0.0f ? -1.0f : 1.0f;
    }
    for (int64_t i = 0; i < n_in; ++i) x[size_t(n_out * n_in + i)] = 1.0f, x[size_t((n_out + 1) * n_in + i)] = -1.0f;
    std::vector<uint8_t> conv(stride * size_t(n_out + 2));
    kernels::convert_activations(at, x.data(), n_out + 2, n_in, n_in, conv.data());
    ActRows rows;
    rows.type = at;
    rows.data = conv.data();
    rows.stride = stride;
    rows.n_tok = n_out + 2;
    kernels::force_isa(Isa::Scalar);
    const std::vector<float> ref = run(m.w, rows);
    for (Isa isa : kernels::available_isas()) {
      kernels::force_isa(isa);
      const std::vector<float> got = run(m.w, rows);
      for (size_t k = 0; k < ref.size(); ++k)
        ASSERT_EQ(ref[k], got[k]) << dtype_name(t) << " " << kernels::isa_name(isa) << " token " << k / size_t(n_out)
                                  << " row " << k % size_t(n_out);
    }
  }
}

// The levels of this CPU that have 16-row repacked kernels (the AVX-512 ones).
std::vector<Isa> levels_with_repacked_kernels() {
  IsaGuard guard;
  std::vector<Isa> levels;
  for (Isa isa : kernels::available_isas()) {
    kernels::force_isa(isa);
    if (kernels::active_table().x16_dot[unsigned(DType::Q4_K)] != nullptr) levels.push_back(isa);
  }
  return levels;
}

bool have_repacked_kernels() { return !levels_with_repacked_kernels().empty(); }

// Rows repacked 16 at a time (tensor/repack.h) give, through matmul, exactly the
// scalar reference's value for every (row, token) pair: 16-aligned ranges take the
// repacked kernel (1..4 tokens per call, partial token groups, index lists with repeats),
// other ranges fall back to the GGUF rows; the second matrix of a 3-D tensor (an expert)
// finds its own repacked rows.
void check_repacked_matches_scalar(DType type) {
  IsaGuard guard;
  std::mt19937 rng(9090 + int(type));
  const int64_t n_in = 768, n_out = 48, max_tok = 9;
  RandomMatrix two(type, 2 * n_out, n_in, rng);  // rows of both matrices, back to back
  WeightMatrix w3 = two.w;
  w3.n_out = n_out;
  w3.n_mat = 2;
  Acts a(ActType::Q8_K, max_tok, n_in, rng);
  kernels::force_isa(Isa::Scalar);
  EXPECT_FALSE(kernels::can_repack(w3));  // the scalar level has no repacked kernel
  std::vector<float> ref(size_t(2 * max_tok * n_out));
  for (int64_t e = 0; e < 2; ++e)
    for (int64_t k = 0; k < max_tok; ++k) {
      ActRows one = a.rows;
      one.data = a.rows.data + size_t(k) * a.rows.stride;
      one.n_tok = 1;
      kernels::matmul(w3.matrix(e), 0, n_out, one, &ref[size_t((e * max_tok + k) * n_out)], 0);
    }
  for (Isa isa : levels_with_repacked_kernels()) {
    SCOPED_TRACE(kernels::isa_name(isa));
    kernels::force_isa(isa);
    ASSERT_TRUE(kernels::can_repack(w3));
    EXPECT_EQ(kernels::repacked_bytes(w3), size_t(2 * 3) * kernels::x16_group_bytes(type, n_in));
    const kernels::AlignedBytes packed = kernels::repack(w3);
    EXPECT_EQ(kernels::row_granularity(w3), 16);
    for (int64_t e = 0; e < 2; ++e) {
      const WeightMatrix m = w3.matrix(e);
      for (int64_t n_tok = 1; n_tok <= max_tok; ++n_tok) {
        std::vector<int32_t> idx(static_cast<size_t>(n_tok));
        for (int64_t j = 0; j < n_tok; ++j) idx[size_t(j)] = int32_t((j * 5 + 3) % max_tok);
        ActRows x = a.rows;
        x.idx = idx.data();
        x.n_tok = n_tok;
        for (int64_t step : {int64_t(16), int64_t(32), n_out, int64_t(5)}) {
          std::vector<float> y(size_t(n_tok * n_out), -1.0f);
          for (int64_t o0 = 0; o0 < n_out; o0 += step)
            kernels::matmul(m, o0, std::min(n_out, o0 + step), x, y.data(), n_out);
          for (int64_t j = 0; j < n_tok; ++j)
            for (int64_t o = 0; o < n_out; ++o)
              ASSERT_EQ(ref[size_t((e * max_tok + idx[size_t(j)]) * n_out + o)], y[size_t(j * n_out + o)])
                  << dtype_name(type) << " matrix " << e << " n_tok=" << n_tok << " step=" << step << " o=" << o << " j=" << j;
        }
      }
    }
  }
}

TEST(Kernels, RepackedQ4kMatchesScalarReference) {
  if (!have_repacked_kernels()) GTEST_SKIP() << "no level with repacked kernels (AVX-512) on this CPU";
  check_repacked_matches_scalar(DType::Q4_K);
}

TEST(Kernels, RepackedQ6kMatchesScalarReference) {
  if (!have_repacked_kernels()) GTEST_SKIP() << "no level with repacked kernels (AVX-512) on this CPU";
  check_repacked_matches_scalar(DType::Q6_K);
}

TEST(Kernels, RepackedQ5kMatchesScalarReference) {
  if (!have_repacked_kernels()) GTEST_SKIP() << "no level with repacked kernels (AVX-512) on this CPU";
  check_repacked_matches_scalar(DType::Q5_K);
}

// The IQ / TQ types in the 4-bit code layout (every value a code into its type's table).
TEST(Kernels, RepackedIqMatchesScalarReference) {
  if (!have_repacked_kernels()) GTEST_SKIP() << "no level with repacked kernels (AVX-512) on this CPU";
  for (DType t : {DType::IQ4_XS, DType::IQ3_S, DType::IQ3_XXS, DType::IQ2_S, DType::IQ2_XS, DType::IQ2_XXS,
                  DType::IQ1_M, DType::IQ1_S, DType::TQ2_0, DType::TQ1_0}) {
    check_repacked_matches_scalar(t);
    if (HasFatalFailure()) return;
  }
}

// IQ4_NL (32-element blocks with an F16 scale each) has no repacked layout.
TEST(Kernels, Iq4nlIsNotRepacked) {
  std::mt19937 rng(3);
  RandomMatrix m(DType::IQ4_NL, 16, 256, rng);
  EXPECT_FALSE(kernels::can_repack(m.w));
  EXPECT_EQ(kernels::x16_group_bytes(DType::IQ4_NL, 256), 0u);
}

INSTANTIATE_TEST_SUITE_P(AllTypes, KernelTypes, ::testing::ValuesIn(kAllTypes),
                         [](const ::testing::TestParamInfo<DType>& i) { return std::string(dtype_name(i.param)); });

// The SIMD Q8_K, Q8_0 and Q8_1 roundings write the same bytes as the scalar ones at every level, on
// normal values, exact .5 ties, repeated largest magnitudes of both signs, zeros, tiny
// and huge values, infinities and NaNs.
TEST(Kernels, ActivationQuantizersSameAtEveryIsa) {
  IsaGuard guard;
  std::mt19937 rng(31337);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const int64_t n = 256 * 12;
  std::vector<float> x(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) x[size_t(i)] = nd(rng);
  float* b = x.data();
  for (int j = 0; j < 256; ++j) b[256 * 1 + j] = float(j % 255 - 127) * 0.5f;  // ties after scaling by -1
  b[256 * 1 + 7] = 127.0f;                                                       // max = 127: iscale = -1
  for (int j = 0; j < 256; ++j) b[256 * 2 + j] = 0.0f;                           // all zero
  for (int j = 0; j < 256; ++j) b[256 * 3 + j] = nd(rng) * 1e-30f;               // tiny
  b[256 * 4 + 10] = -5.0f, b[256 * 4 + 200] = 5.0f;                              // first of equal |max| wins
  b[256 * 5 + 3] = std::numeric_limits<float>::quiet_NaN();                      // NaN among values
  b[256 * 6 + 77] = std::numeric_limits<float>::infinity();                      // inf
  for (int j = 0; j < 256; ++j) b[256 * 7 + j] = std::numeric_limits<float>::quiet_NaN();  // all NaN
  for (int j = 0; j < 256; ++j) b[256 * 8 + j] = nd(rng) * 3e37f;                // huge
  for (int j = 0; j < 256; ++j) b[256 * 9 + j] = -std::fabs(nd(rng));            // max negative
  for (int j = 0; j < 256; ++j) b[256 * 10 + j] = float(int(rng() % 7) - 3);     // few distinct values
  // The same blocks through the 32-value rounders (ggml's x86 Q8_0 and Q8_1).
  for (ActType at : {ActType::Q8_K, ActType::Q8_0, ActType::Q8_1}) {
    const size_t rb = kernels::act_row_bytes(at, n);
    const size_t block_bytes = at == ActType::Q8_K ? 292 : at == ActType::Q8_0 ? 34 : 36;
    kernels::force_isa(Isa::Scalar);
    std::vector<uint8_t> ref(rb, 0xAB);
    kernels::convert_activations(at, x.data(), 1, n, n, ref.data());
    for (Isa isa : kernels::available_isas()) {
      kernels::force_isa(isa);
      std::vector<uint8_t> got(rb, 0xAB);
      kernels::convert_activations(at, x.data(), 1, n, n, got.data());
      for (size_t i = 0; i < rb; ++i)
        ASSERT_EQ(ref[i], got[i]) << kernels::act_type_name(at) << " " << kernels::isa_name(isa) << " byte " << i
                                  << " (block " << i / block_bytes << ")";
    }
  }
}

// ggml's Q8_K rule on a hand-made block: the largest magnitude (with its sign) maps to
// -127, rounding is to nearest with ties to even, d = 1/iscale, bsums per 16.
TEST(Kernels, Q8KQuantizerFollowsGgml) {
  std::vector<float> x(256, 0.0f);
  x[0] = 2.0f;    // max (positive): iscale = -63.5
  x[1] = -1.0f;   // -> 63.5 -> 64 (tie to even)
  x[2] = 0.5f;    // -> -31.75 -> -32
  x[17] = 1.0f;   // -> -63.5 -> -64
  x[18] = 3.0f / 127.0f;
  std::vector<uint8_t> q(kernels::act_row_bytes(ActType::Q8_K, 256));
  kernels::convert_activations(ActType::Q8_K, x.data(), 1, 256, 256, q.data());
  float d;
  std::memcpy(&d, q.data(), 4);
  const auto* qs = reinterpret_cast<const int8_t*>(q.data() + 4);
  int16_t bsums[16];
  std::memcpy(bsums, q.data() + 4 + 256, sizeof bsums);
  EXPECT_EQ(d, 1.0f / (-127.0f / 2.0f));
  EXPECT_EQ(qs[0], -127);
  EXPECT_EQ(qs[1], 64);
  EXPECT_EQ(qs[2], -32);
  EXPECT_EQ(qs[17], -64);
  EXPECT_EQ(qs[18], int8_t(std::nearbyint(-127.0f / 2.0f * (3.0f / 127.0f))));
  EXPECT_EQ(bsums[0], -127 + 64 - 32);
  EXPECT_EQ(bsums[1], -64 + qs[18]);
  for (int g = 2; g < 16; ++g) EXPECT_EQ(bsums[g], 0);
}

// ggml's x86 Q8_0 rule: d = amax/127 in F16, values x·(127/amax) rounded half to even;
// Q8_1 adds s = F16(d·Σq) with the F32 d.
TEST(Kernels, Q8_0AndQ8_1QuantizersFollowGgml) {
  std::vector<float> x(32, 0.0f);
  x[0] = -4.0f;
  x[1] = 2.0f * 4.0f / 127.0f * 0.75f;  // 1.5 -> 2
  x[2] = 4.0f / 127.0f * 2.5f;          // 2.5 -> 2 (ties to even)
  x[3] = 1.0f;
  std::vector<uint8_t> q(kernels::act_row_bytes(ActType::Q8_0, 32));
  kernels::convert_activations(ActType::Q8_0, x.data(), 1, 32, 32, q.data());
  uint16_t d16;
  std::memcpy(&d16, q.data(), 2);
  EXPECT_EQ(d16, fp32_to_fp16(4.0f / 127.0f));
  const auto* qs = reinterpret_cast<const int8_t*>(q.data() + 2);
  EXPECT_EQ(qs[0], -127);
  EXPECT_EQ(qs[1], 2);
  EXPECT_EQ(qs[2], int8_t(std::nearbyint(x[2] * (127.0f / 4.0f))));
  EXPECT_EQ(qs[3], int8_t(std::nearbyint(127.0f / 4.0f)));
  std::vector<uint8_t> q1(kernels::act_row_bytes(ActType::Q8_1, 32));
  kernels::convert_activations(ActType::Q8_1, x.data(), 1, 32, 32, q1.data());
  uint16_t s16;
  std::memcpy(&s16, q1.data() + 2, 2);
  int sum = 0;
  for (int j = 0; j < 32; ++j) sum += int8_t(q1[4 + j]);
  EXPECT_EQ(0, std::memcmp(q1.data() + 4, q.data() + 2, 32));
  EXPECT_EQ(s16, fp32_to_fp16(4.0f / 127.0f * float(sum)));  // d before its F16 rounding, as ggml
}

TEST(Kernels, WrongActivationTypeIsRejected) {
  std::mt19937 rng(5);
  RandomMatrix m(DType::Q4_K, 2, 256, rng);
  Acts a(ActType::Q8_0, 1, 256, rng);
  std::vector<float> y(2);
  EXPECT_THROW(kernels::matmul(m.w, 0, 2, a.rows, y.data(), 2), std::invalid_argument);
  EXPECT_THROW(kernels::act_row_bytes(ActType::Q8_K, 100), std::invalid_argument);
}

// The attention helpers at every level against the scalar level.
TEST(Kernels, AttentionHelpersMatchScalar) {
  IsaGuard guard;
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const int64_t D = 72, n_q = 3, n_k = 13, k_stride = 2 * D;
  std::vector<float> q(size_t(n_q * D)), k(size_t(n_k * k_stride));
  for (float& f : q) f = nd(rng);
  for (float& f : k) f = nd(rng);
  auto compute = [&](std::vector<float>& s, std::vector<float>& sums) {
    s.assign(size_t(n_q * 16), 0.0f);
    sums.assign(size_t(n_q), 0.0f);
    kernels::attn_scores(q.data(), D, n_q, k.data(), k_stride, n_k, D, 0.125f, s.data(), 16);
    for (int64_t r = 0; r < n_q; ++r) sums[size_t(r)] = kernels::exp_shift_sum(s.data() + r * 16, n_k, 1.5f);
  };
  kernels::force_isa(Isa::Scalar);
  std::vector<float> s0, sum0;
  compute(s0, sum0);
  for (int64_t r = 0; r < n_q; ++r)
    for (int64_t j = 0; j < n_k; ++j) {
      const double want = std::exp(0.125 * [&] {
        double d = 0;
        for (int64_t i = 0; i < D; ++i) d += double(q[size_t(r * D + i)]) * k[size_t(j * k_stride + i)];
        return d;
      }() - 1.5);
      EXPECT_NEAR(s0[size_t(r * 16 + j)], want, 1e-5 * want + 1e-6);
    }
  for (Isa isa : kernels::available_isas()) {
    kernels::force_isa(isa);
    std::vector<float> s, sums;
    compute(s, sums);
    for (size_t i = 0; i < s.size(); ++i) EXPECT_NEAR(s[i], s0[i], 1e-5 * std::fabs(s0[i]) + 1e-6) << kernels::isa_name(isa);
    for (size_t i = 0; i < sums.size(); ++i) EXPECT_NEAR(sums[i], sum0[i], 1e-5 * sum0[i]) << kernels::isa_name(isa);
    EXPECT_NEAR(kernels::dot_f32(q.data(), k.data(), D), [&] {
      kernels::force_isa(Isa::Scalar);
      const float r = kernels::dot_f32(q.data(), k.data(), D);
      kernels::force_isa(isa);
      return r;
    }(), 1e-4);
  }
}

// SwiGLU rows (SiLU(gate) * up, optional clamp): every level gives the scalar level's bits
// (the same exp steps), and the values are SiLU's to float accuracy.
// C += A·B: every level gives the scalar level's bits (one fused multiply-add per step, in
// order), the values are the product (double reference), strided A (a transposed view)
// works, tiles of every height and partial chunks are covered, and a k split into
// consecutive calls gives the bits of one call.
TEST(Kernels, GemmAccMatchesScalarBitForBit) {
  IsaGuard guard;
  std::mt19937 rng(11);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (const auto& [m, n, k] : {std::array<int64_t, 3>{7, 150, 37}, {4, 64, 128}, {1, 5, 3}, {9, 1024, 16}}) {
    const int64_t lda = k + 3, ldb = n + 5, ldc = n + 7;
    std::vector<float> a(size_t(m * lda)), at(size_t(k * (m + 2))), b(size_t(k * ldb)), c0(size_t(m * ldc));
    for (float& f : a) f = nd(rng);
    for (float& f : b) f = nd(rng);
    for (float& f : c0) f = nd(rng);
    for (int64_t i = 0; i < m; ++i)
      for (int64_t p = 0; p < k; ++p) at[size_t(p * (m + 2) + i)] = a[size_t(i * lda + p)];
    kernels::force_isa(Isa::Scalar);
    std::vector<float> want = c0;
    kernels::gemm_acc_f32(m, n, k, a.data(), lda, 1, b.data(), ldb, want.data(), ldc);
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double ref = c0[size_t(i * ldc + j)];
        for (int64_t p = 0; p < k; ++p) ref += double(a[size_t(i * lda + p)]) * b[size_t(p * ldb + j)];
        EXPECT_NEAR(want[size_t(i * ldc + j)], ref, 1e-4 * (1 + std::fabs(ref)));
      }
    for (Isa isa : kernels::available_isas()) {
      kernels::force_isa(isa);
      std::vector<float> c = c0, ct = c0, split = c0;
      kernels::gemm_acc_f32(m, n, k, a.data(), lda, 1, b.data(), ldb, c.data(), ldc);
      kernels::gemm_acc_f32(m, n, k, at.data(), 1, m + 2, b.data(), ldb, ct.data(), ldc);
      const int64_t k1 = k / 3;
      kernels::gemm_acc_f32(m, n, k1, a.data(), lda, 1, b.data(), ldb, split.data(), ldc);
      kernels::gemm_acc_f32(m, n, k - k1, a.data() + k1, lda, 1, b.data() + k1 * ldb, ldb, split.data(), ldc);
      EXPECT_EQ(c, want) << kernels::isa_name(isa) << " " << m << "x" << n << "x" << k;
      EXPECT_EQ(ct, want) << kernels::isa_name(isa);
      EXPECT_EQ(split, want) << kernels::isa_name(isa);
    }
  }
}

// attn_scores gives each (query, key) pair the same bits wherever the key falls in the
// call (the training's backward splits keys into blocks and must not change results).
TEST(Kernels, AttentionScoresDoNotDependOnKeyPosition) {
  IsaGuard guard;
  std::mt19937 rng(12);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const int64_t D = 40, n_q = 2, n_k = 11;
  std::vector<float> q(size_t(n_q * D)), k(size_t(n_k * D));
  for (float& f : q) f = nd(rng);
  for (float& f : k) f = nd(rng);
  for (Isa isa : kernels::available_isas()) {
    kernels::force_isa(isa);
    std::vector<float> all(size_t(n_q * n_k));
    kernels::attn_scores(q.data(), D, n_q, k.data(), D, n_k, D, 0.5f, all.data(), n_k);
    for (int64_t j0 = 0; j0 < n_k; ++j0)
      for (int64_t j1 = j0 + 1; j1 <= n_k; ++j1) {
        std::vector<float> part(size_t(n_q * (j1 - j0)));
        kernels::attn_scores(q.data(), D, n_q, k.data() + j0 * D, D, j1 - j0, D, 0.5f, part.data(), j1 - j0);
        for (int64_t r = 0; r < n_q; ++r)
          for (int64_t j = j0; j < j1; ++j)
            ASSERT_EQ(part[size_t(r * (j1 - j0) + j - j0)], all[size_t(r * n_k + j)])
                << kernels::isa_name(isa) << " keys " << j0 << ".." << j1;
      }
  }
}

TEST(Kernels, SwigluMatchesScalarAndSilu) {
  IsaGuard guard;
  std::mt19937 rng(11);
  std::normal_distribution<float> nd(0.0f, 4.0f);
  const int64_t n = 1000 + 3;  // a tail past the vector width
  std::vector<float> g(static_cast<size_t>(n)), u(static_cast<size_t>(n));
  for (float& f : g) f = nd(rng);
  for (float& f : u) f = nd(rng);
  g[0] = 120.0f, g[1] = -120.0f, g[2] = 0.0f, g[3] = 88.5f, g[4] = -87.5f;  // past the exp range
  for (float limit : {0.0f, 7.0f}) {
    kernels::force_isa(Isa::Scalar);
    std::vector<float> ref(static_cast<size_t>(n));
    kernels::swiglu_convert(ActType::F32, g.data(), u.data(), n, limit, 1, n, reinterpret_cast<uint8_t*>(ref.data()));
    for (int64_t i = 0; i < n; ++i) {
      const double s = double(g[size_t(i)]) / (1.0 + std::exp(-double(g[size_t(i)])));
      const double want = limit > 0 ? std::min(s, double(limit)) * std::clamp(double(u[size_t(i)]), -double(limit), double(limit))
                                    : s * double(u[size_t(i)]);
      EXPECT_NEAR(ref[size_t(i)], want, 1e-6 * std::fabs(want) + 1e-30) << i << " limit " << limit;
    }
    for (Isa isa : kernels::available_isas()) {
      kernels::force_isa(isa);
      std::vector<float> out(static_cast<size_t>(n));
      kernels::swiglu_convert(ActType::F32, g.data(), u.data(), n, limit, 1, n,
                              reinterpret_cast<uint8_t*>(out.data()));
      ASSERT_EQ(0, std::memcmp(out.data(), ref.data(), size_t(n) * sizeof(float))) << kernels::isa_name(isa);
    }
  }
}

// The IQ4 encoders' searches of each level that has them against the scalar ones
// (quants_iq.h), bit for bit: random sub-blocks of several magnitudes, values exactly
// halfway between two levels (ties go to the upper level), beyond the outer levels, zero,
// denormal, below the all-zero threshold, and non-finite.
TEST(Kernels, Iq4SearchesMatchScalar) {
  IsaGuard guard;
  const int levels[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
  std::mt19937 rng(41);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<std::vector<float>> subs;
  for (int r = 0; r < 300; ++r) {
    std::vector<float> v(32);
    const float scale = std::ldexp(1.0f, r % 40 - 20);
    for (float& e : v) e = nd(rng) * scale;
    if (r % 5 == 1) v[size_t(r) % 32] *= 40.0f;                      // an outlier
    if (r % 7 == 2) v[size_t(r) % 32] = -v[(size_t(r) + 1) % 32];  // equal magnitudes
    subs.push_back(v);
  }
  for (int e = -4; e <= 4; e += 4) {  // the first trial scale maps x to -x / 2^e: exact midpoints
    std::vector<float> v = {std::ldexp(-127.0f, e)};
    for (int k = 0; k < 15; ++k) v.push_back(std::ldexp(-0.5f * float(levels[k] + levels[k + 1]), e));
    for (int k = 0; k < 16; ++k) v.push_back(std::ldexp(-float(levels[k]), e));
    subs.push_back(v);
  }
  subs.push_back(std::vector<float>(32, 0.0f));
  subs.push_back(std::vector<float>(32, 1e-16f));
  subs.push_back(std::vector<float>(32, 1e-40f));
  std::vector<float> odd(32, 0.5f);
  odd[3] = std::numeric_limits<float>::quiet_NaN();
  odd[9] = std::numeric_limits<float>::infinity();
  odd[10] = -std::numeric_limits<float>::infinity();
  subs.push_back(odd);

  int checked = 0;
  for (Isa isa : kernels::available_isas()) {
    kernels::force_isa(isa);
    const kernels::IsaKernels& k = kernels::active_table();
    if (!k.iq4_scales || !k.iq4_pack_levels) continue;
    SCOPED_TRACE(kernels::isa_name(isa));
    for (size_t i = 0; i < subs.size(); ++i) {
      const float* x = subs[i].data();
      float d_ref = 0.0f, d = 0.0f;
      iq::iq4_scales_ref(x, 1, &d_ref);
      k.iq4_scales(x, 1, &d);
      EXPECT_EQ(std::memcmp(&d_ref, &d, 4), 0) << "sub-block " << i << ": " << d_ref << " vs " << d;
      // At the sub-block's own scale, at -1 (the ties above land on midpoints), and beyond.
      for (float id : {d_ref != 0.0f ? 1.0f / d_ref : 0.0f, -1.0f, 1.0f, 1e30f, -0.0f}) {
        uint8_t q_ref[16], q[16];
        iq::iq4_pack_levels_ref(x, id, q_ref);
        k.iq4_pack_levels(x, id, q);
        EXPECT_EQ(std::memcmp(q_ref, q, 16), 0) << "sub-block " << i << " at inverse scale " << id;
      }
    }
    // Several sub-blocks in one call.
    std::vector<float> all;
    for (size_t i = 0; i < 8; ++i) all.insert(all.end(), subs[i].begin(), subs[i].end());
    float d_ref[8], d[8];
    iq::iq4_scales_ref(all.data(), 8, d_ref);
    k.iq4_scales(all.data(), 8, d);
    EXPECT_EQ(std::memcmp(d_ref, d, sizeof d), 0);
    ++checked;
  }
  if (checked == 0) GTEST_SKIP() << "no ISA level with IQ4 searches on this CPU";
}

TEST(Kernels, IsaSelection) {
  const std::vector<Isa> isas = kernels::available_isas();
  ASSERT_FALSE(isas.empty());
  EXPECT_EQ(isas.front(), Isa::Scalar);
  EXPECT_FALSE(kernels::cpu_summary().empty());
}

}  // namespace
}  // namespace step35
