// KV cache kernels (tensor/kv_kernels.h): rows stored in every cache type hold exactly the
// values ggml's cache writer makes, the per-block attention kernels of every ISA level match
// the scalar reference and a double-precision computation, grouping query rows or keys never
// changes a result, and the Walsh-Hadamard rotation is ggml's.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "tensor/dtype.h"
#include "tensor/fp16.h"
#include "tensor/kernels.h"
#include "tensor/kv_kernels.h"
#include "tensor/quants.h"

namespace step35 {
namespace {

using kernels::Isa;

const DType kKvTypes[] = {DType::F32, DType::F16, DType::BF16, DType::Q8_0, DType::Q4_0};

struct IsaGuard {
  Isa saved = kernels::active_isa();
  ~IsaGuard() { kernels::force_isa(saved); }
};

std::vector<float> normals(size_t n, std::mt19937& rng, float sd = 1.0f) {
  std::normal_distribution<float> nd(0.0f, sd);
  std::vector<float> v(n);
  for (float& f : v) f = nd(rng);
  return v;
}

// The value ggml's cache writer stores for row x (set_rows with the type's from_float):
// F16/BF16 round to nearest even, Q8_0 the x86 encoder (d = amax/127, x*127/amax rounded
// half to even), Q4_0 the reference encoder.
std::vector<float> ggml_stored(DType t, const std::vector<float>& x) {
  const int64_t n = int64_t(x.size());
  std::vector<float> out(x.size());
  if (t == DType::Q8_0) {
    for (int64_t b = 0; b < n / 32; ++b) {
      float amax = 0;
      for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[size_t(32 * b + j)]));
      const float d = fp16_to_fp32(fp32_to_fp16(amax / 127.0f));
      const float id = amax != 0 ? 127.0f / amax : 0.0f;
      for (int j = 0; j < 32; ++j) out[size_t(32 * b + j)] = float(std::nearbyint(x[size_t(32 * b + j)] * id)) * d;
    }
    return out;
  }
  std::vector<uint8_t> bytes(*row_bytes(t, n));
  EXPECT_TRUE(quantize_row_ref(t, x.data(), bytes.data(), n));
  dequantize_row_ref(t, bytes.data(), out.data(), n);
  return out;
}

class KvKernels : public ::testing::TestWithParam<DType> {};

TEST_P(KvKernels, StoredRowsHoldGgmlsValues) {
  const DType t = GetParam();
  std::mt19937 rng(7 + int(t));
  for (int32_t bs : {32, 20}) {
    const int64_t d = 128;
    std::vector<uint8_t> kblock(size_t(bs) * *row_bytes(t, d)), vblock(kblock.size());
    std::vector<std::vector<float>> rows;
    for (int32_t j = 0; j < bs; ++j) {
      rows.push_back(normals(size_t(d), rng, 2.0f));
      rows.back()[3] = 0.0f;  // a zero and a tie-prone value
      rows.back()[5] = 0.5f;
    }
    // Written in a scrambled order: positions do not disturb each other.
    for (int32_t k = 0; k < bs; ++k) {
      const int32_t j = (k * 7) % bs;
      kernels::kv_store_key(t, rows[size_t(j)].data(), d, kblock.data(), bs, j);
      kernels::kv_store_value(t, rows[size_t(j)].data(), d, vblock.data(), bs, j);
    }
    std::vector<float> got(static_cast<size_t>(d));
    for (int32_t j = 0; j < bs; ++j) {
      const std::vector<float> want = ggml_stored(t, rows[size_t(j)]);
      kernels::kv_load_key(t, kblock.data(), bs, j, d, got.data());
      for (int64_t i = 0; i < d; ++i) ASSERT_EQ(got[size_t(i)], want[size_t(i)]) << dtype_name(t) << " key " << j << "," << i;
      kernels::kv_load_value(t, vblock.data(), bs, j, d, got.data());
      for (int64_t i = 0; i < d; ++i) ASSERT_EQ(got[size_t(i)], want[size_t(i)]) << dtype_name(t) << " value " << j << "," << i;
    }
  }
}

// One block of attention through the kernels at every level: scores against a double
// computation from the stored keys and converted query, each level against the scalar one,
// and the same values whatever rows and keys a call covers.
TEST_P(KvKernels, BlockAttentionMatchesReferenceAndIsGroupingInvariant) {
  IsaGuard guard;
  const DType t = GetParam();
  const bool integer = kernels::kv_type_quantized(t);
  std::mt19937 rng(11 + int(t));
  for (int32_t bs : {32, 20}) {
    for (int64_t d : integer ? std::vector<int64_t>{64, 128} : std::vector<int64_t>{72, 128}) {
      const int64_t n_q = 11;
      std::vector<uint8_t> kblock(size_t(bs) * *row_bytes(t, d)), vblock(kblock.size());
      for (int32_t j = 0; j < bs; ++j) {
        kernels::kv_store_key(t, normals(size_t(d), rng).data(), d, kblock.data(), bs, j);
        kernels::kv_store_value(t, normals(size_t(d), rng).data(), d, vblock.data(), bs, j);
      }
      const size_t qb = kernels::attn_query_bytes(t, d);
      ASSERT_EQ(qb % 8, 0u);
      std::vector<uint8_t> q(qb * size_t(n_q));
      std::vector<std::vector<float>> qf;
      for (int64_t r = 0; r < n_q; ++r) {
        qf.push_back(normals(size_t(d), rng));
        kernels::attn_convert_query(t, qf.back().data(), d, q.data() + qb * size_t(r));
      }
      const float scale = 1.0f / std::sqrt(float(d));
      // Double-precision scores from the stored keys and the query as the type rounds it.
      std::vector<float> key(static_cast<size_t>(d));
      std::vector<double> want(size_t(n_q * bs));
      for (int64_t r = 0; r < n_q; ++r) {
        std::vector<float> qr = qf[size_t(r)];
        if (integer) {
          for (int64_t b = 0; b < d / 32; ++b) {
            float amax = 0;
            for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(qr[size_t(32 * b + j)]));
            const float dq = fp16_to_fp32(fp32_to_fp16(amax / 127.0f)), id = amax != 0 ? 127.0f / amax : 0.0f;
            for (int j = 0; j < 32; ++j) qr[size_t(32 * b + j)] = float(std::nearbyint(qr[size_t(32 * b + j)] * id)) * dq;
          }
        } else if (t == DType::BF16) {
          for (float& f : qr) f = bf16_to_fp32(fp32_to_bf16(f));
        }
        for (int32_t j = 0; j < bs; ++j) {
          kernels::kv_load_key(t, kblock.data(), bs, j, d, key.data());
          double s = 0;
          for (int64_t i = 0; i < d; ++i) s += double(qr[size_t(i)]) * key[size_t(i)];
          want[size_t(r * bs + j)] = s * scale;
        }
      }
      std::vector<float> ref_s, ref_acc;
      for (Isa isa : kernels::available_isas()) {
        kernels::force_isa(isa);
        SCOPED_TRACE(std::string(kernels::isa_name(isa)) + " " + dtype_name(t) + " bs " + std::to_string(bs) + " d " +
                     std::to_string(d));
        std::vector<float> s(size_t(n_q * bs), -1.0f);
        kernels::attn_scores(t, q.data(), qb, n_q, kblock.data(), bs, bs, d, scale, s.data(), bs);
        for (size_t i = 0; i < s.size(); ++i) ASSERT_NEAR(s[i], want[i], 2e-5 * (1 + std::fabs(want[i])));
        // One row and a prefix of the keys at a time: the same bits.
        for (int64_t r = 0; r < n_q; r += 3) {
          for (int32_t n_k : {1, 7, bs}) {
            std::vector<float> s1(size_t(bs), 99.0f);
            kernels::attn_scores(t, q.data() + qb * size_t(r), qb, 1, kblock.data(), bs, n_k, d, scale, s1.data(), bs);
            for (int32_t j = 0; j < bs; ++j)
              ASSERT_EQ(s1[size_t(j)], j < n_k ? s[size_t(r * bs + j)] : 99.0f) << "row " << r << " n_k " << n_k;
          }
        }
        // Softmax weights with two masked keys per row, then the weighted values.
        std::vector<float> p = s, sums(static_cast<size_t>(n_q));
        for (int64_t r = 0; r < n_q; ++r) {
          p[size_t(r * bs + (r % bs))] = -INFINITY;
          p[size_t(r * bs + ((r + 5) % bs))] = -INFINITY;
          float mx = -INFINITY;
          for (int32_t j = 0; j < bs; ++j) mx = std::max(mx, p[size_t(r * bs + j)]);
          sums[size_t(r)] = kernels::attn_exp_sum(p.data() + r * bs, bs, mx);
          double want_sum = 0;
          for (int32_t j = 0; j < bs; ++j) {
            const float sj = s[size_t(r * bs + j)];
            const bool masked = j == r % bs || j == (r + 5) % bs;
            const double e = masked ? 0.0 : std::exp(double(sj) - mx);
            ASSERT_NEAR(p[size_t(r * bs + j)], e, 1e-6 * e + (masked ? 0.0 : 1e-30));
            if (masked) {
              ASSERT_EQ(p[size_t(r * bs + j)], 0.0f);
            }
            want_sum += e;
          }
          ASSERT_NEAR(sums[size_t(r)], want_sum, 1e-5 * want_sum);
        }
        std::vector<float> acc(size_t(n_q * (d + 3)), 0.25f);
        kernels::attn_accumulate(t, p.data(), bs, n_q, vblock.data(), bs, d, acc.data(), d + 3);
        std::vector<float> val(static_cast<size_t>(d));
        for (int64_t r = 0; r < n_q; ++r)
          for (int64_t c = 0; c < d; ++c) {
            double w = 0.25;
            for (int32_t j = 0; j < bs; ++j) {
              kernels::kv_load_value(t, vblock.data(), bs, j, d, val.data());
              w += double(p[size_t(r * bs + j)]) * val[size_t(c)];
            }
            ASSERT_NEAR(acc[size_t(r * (d + 3) + c)], w, 1e-5 * (1 + std::fabs(w)));
          }
        for (int64_t r = 0; r < n_q; ++r)  // the padding between rows is untouched
          for (int64_t c = d; c < d + 3; ++c) ASSERT_EQ(acc[size_t(r * (d + 3) + c)], 0.25f);
        // Row by row, and with zero weights on keys past a prefix: the same bits.
        for (int64_t r = 0; r < n_q; r += 4) {
          std::vector<float> a1(size_t(d), 0.25f);
          kernels::attn_accumulate(t, p.data() + r * bs, bs, 1, vblock.data(), bs, d, a1.data(), d);
          ASSERT_EQ(0, std::memcmp(a1.data(), acc.data() + r * (d + 3), size_t(d) * sizeof(float))) << "row " << r;
          std::vector<float> pz(p.begin() + r * bs, p.begin() + (r + 1) * bs);
          for (int32_t j = 9; j < bs; ++j) pz[size_t(j)] = 0.0f;
          std::vector<float> a2(size_t(d), 0.25f), a3(size_t(d), 0.25f);
          kernels::attn_accumulate(t, pz.data(), bs, 1, vblock.data(), 9, d, a2.data(), d);
          kernels::attn_accumulate(t, pz.data(), bs, 1, vblock.data(), bs, d, a3.data(), d);
          ASSERT_EQ(0, std::memcmp(a2.data(), a3.data(), size_t(d) * sizeof(float))) << "row " << r;
        }
        if (isa == Isa::Scalar) {
          ref_s = s;
          ref_acc = acc;
        } else {
          for (size_t i = 0; i < s.size(); ++i) ASSERT_NEAR(s[i], ref_s[i], 1e-5 * (1 + std::fabs(ref_s[i])));
          for (size_t i = 0; i < acc.size(); ++i) ASSERT_NEAR(acc[i], ref_acc[i], 1e-5 * (1 + std::fabs(ref_acc[i])));
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Types, KvKernels, ::testing::ValuesIn(kKvTypes),
                         [](const ::testing::TestParamInfo<DType>& i) { return std::string(dtype_name(i.param)); });

TEST(KvKernelsTypes, OnlyCacheTypesAndWholeBlocksAreAccepted) {
  EXPECT_TRUE(kernels::kv_type_supported(DType::F16));
  EXPECT_FALSE(kernels::kv_type_supported(DType::Q4_K));
  EXPECT_TRUE(kernels::kv_type_quantized(DType::Q4_0));
  EXPECT_FALSE(kernels::kv_type_quantized(DType::BF16));
  std::vector<uint8_t> block(4096);
  std::vector<float> x(48, 1.0f);
  EXPECT_THROW(kernels::kv_store_key(DType::Q8_0, x.data(), 48, block.data(), 4, 0), std::invalid_argument);
  EXPECT_THROW(kernels::kv_store_value(DType::Q6_K, x.data(), 48, block.data(), 4, 0), std::invalid_argument);
  EXPECT_THROW(kernels::attn_query_bytes(DType::Q4_0, 16), std::invalid_argument);
}

// The row maximum of the softmax: every level, every length (tails included), masked keys
// and NaNs skipped, the empty row -infinity.
TEST(KvKernelsRowMax, SameAtEveryIsa) {
  IsaGuard guard;
  std::mt19937 rng(8);
  for (int64_t n : {0, 1, 5, 8, 15, 16, 17, 32, 47}) {
    std::vector<float> s = normals(size_t(n) + 1, rng, 3.0f);
    for (int64_t j = 0; j < n; j += 3) s[size_t(j)] = -INFINITY;
    if (n > 4) s[4] = std::numeric_limits<float>::quiet_NaN();
    float want = -INFINITY;
    for (int64_t j = 0; j < n; ++j) want = std::max(want, s[size_t(j)]);
    for (Isa isa : kernels::available_isas()) {
      kernels::force_isa(isa);
      EXPECT_EQ(kernels::attn_row_max(s.data(), n), want) << kernels::isa_name(isa) << " n " << n;
    }
  }
}

// The softmax weights and their sum: the SIMD levels agree bit for bit (the scalar
// reference sums in another order), at every length and with masked keys.
TEST(KvKernelsExpSum, SimdLevelsAgreeBitForBit) {
  IsaGuard guard;
  std::mt19937 rng(9);
  for (int64_t n : {1, 7, 8, 9, 16, 17, 31, 32, 45}) {
    std::vector<float> s = normals(size_t(n), rng, 4.0f);
    for (int64_t j = 1; j < n; j += 4) s[size_t(j)] = -INFINITY;
    float mx = -INFINITY;
    for (float v : s) mx = std::max(mx, v);
    std::vector<float> first;
    float first_sum = 0;
    for (Isa isa : kernels::available_isas()) {
      if (isa == Isa::Scalar) continue;
      kernels::force_isa(isa);
      std::vector<float> p = s;
      const float sum = kernels::attn_exp_sum(p.data(), n, mx);
      if (first.empty()) {
        first = p;
        first_sum = sum;
        continue;
      }
      EXPECT_EQ(sum, first_sum) << kernels::isa_name(isa) << " n " << n;
      EXPECT_EQ(0, std::memcmp(p.data(), first.data(), p.size() * sizeof(float))) << kernels::isa_name(isa) << " n " << n;
    }
  }
}

// ggml's rotation: the Sylvester-ordered Walsh-Hadamard matrix / sqrt(n), applied per chunk.
TEST(KvKernelsHadamard, MatchesSylvesterMatrixAndIsItsOwnInverse) {
  std::mt19937 rng(3);
  for (int64_t n : {1, 2, 64, 128}) {
    const int64_t len = 2 * n;
    std::vector<float> x = normals(size_t(len), rng), y = x;
    kernels::hadamard_rows(y.data(), len, n);
    for (int64_t c = 0; c < len; c += n)
      for (int64_t i = 0; i < n; ++i) {
        double want = 0;
        for (int64_t j = 0; j < n; ++j)
          want += ((__builtin_popcountll(uint64_t(i & j)) & 1) ? -1.0 : 1.0) * x[size_t(c + j)];
        want /= std::sqrt(double(n));
        ASSERT_NEAR(y[size_t(c + i)], want, 1e-5) << n << " " << i;
      }
    kernels::hadamard_rows(y.data(), len, n);
    for (int64_t i = 0; i < len; ++i) ASSERT_NEAR(y[size_t(i)], x[size_t(i)], 1e-5);
  }
  // Exact steps: scaled first, then u + v / u - v.
  float two[2] = {3.0f, 1.0f};
  kernels::hadamard_rows(two, 2, 2);
  const float s = 1.0f / std::sqrt(2.0f);
  // The products are separate statements: within one expression clang may fuse a product
  // and the sum into an FMA (-ffp-contract=on), which rounds once where the kernel rounds twice.
  const float u = 3.0f * s;
  const float v = 1.0f * s;
  EXPECT_EQ(two[0], u + v);
  EXPECT_EQ(two[1], u - v);
  // Every ISA level gives the scalar loop's bits.
  {
    IsaGuard guard;
    for (int64_t n : {1, 2, 4, 8, 16, 32, 64, 128, 256}) {
      const std::vector<float> x = normals(size_t(3 * n), rng, 5.0f);
      kernels::force_isa(Isa::Scalar);
      std::vector<float> want = x;
      kernels::hadamard_rows(want.data(), 3 * n, n);
      for (Isa isa : kernels::available_isas()) {
        kernels::force_isa(isa);
        std::vector<float> got = x;
        kernels::hadamard_rows(got.data(), 3 * n, n);
        ASSERT_EQ(0, std::memcmp(got.data(), want.data(), got.size() * sizeof(float)))
            << kernels::isa_name(isa) << " n " << n;
      }
    }
  }
  std::vector<float> bad(6);
  EXPECT_THROW(kernels::hadamard_rows(bad.data(), 6, 3), std::invalid_argument);
  EXPECT_THROW(kernels::hadamard_rows(bad.data(), 6, 4), std::invalid_argument);
}

}  // namespace
}  // namespace step35
