// `step35 quantize` against llama-quantize, the ground truth:
//  * the K-quant encoders round-trip within the error their bit widths allow;
//  * the type recipe follows llama-quant.cpp's rules on hand-built tensor lists;
//  * whole files: tensor types and bytes equal the fixtures llama-quantize made
//    (tiny-a / tiny-k Q4_K_M, tiny-a Q8_0 and F16, tiny-b Q8_0), and for every file type on
//    three model shapes a fingerprint of llama-quantize's output (kGoldens below);
//  * split inputs, requantization, thread-count independence, and the CLI's errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <set>

#include "gguf/gguf.h"
#include "gguf/gguf_writer.h"
#include "quantize/quantize.h"
#include "model/step35.h"
#include "support.h"
#include "tensor/dtype.h"
#include "tensor/kernels.h"
#include "tensor/quants.h"
#include "tensor/quants_kquant_encode.h"

using namespace step35;
using namespace step35::testing;

namespace {

// ---- helpers -----------------------------------------------------------------------------

std::string out_path(const std::string& name) { return tmp_dir() + "/quantize-" + name + ".gguf"; }

QuantizeSummary quantize(const std::string& in, const std::string& out, FileType type, int threads = 2,
                         std::vector<std::string>* log = nullptr) {
  QuantizeOptions opts;
  opts.type = type;
  opts.n_threads = threads;
  if (log) opts.log = [log](const std::string& line) { log->push_back(line); };
  return quantize_gguf(in, out, opts);
}

std::string model_or_skip_reason(const std::string& file, std::string* path) {
  *path = fixture_model(file);
  if (file_exists(*path)) return "";
  std::string why;
  *path = regenerated_fixture(file, &why);
  return path->empty() ? "cannot find or regenerate " + file + ": " + why : "";
}

// Every tensor of `ours` has the same name, shape, type and bytes as in `ref`, and the
// files hold the same set of tensors. Returns the number of tensors compared.
size_t expect_same_tensors(const gguf::File& ours, const gguf::File& ref) {
  EXPECT_EQ(ours.tensors().size(), ref.tensors().size());
  size_t same = 0;
  for (const gguf::TensorInfo& t : ours.tensors()) {
    const gguf::TensorInfo* r = ref.find_tensor(t.name);
    if (!r) {
      ADD_FAILURE() << t.name << " is not in the reference";
      continue;
    }
    EXPECT_EQ(dtype_info(t.type)->name, std::string(dtype_info(r->type)->name)) << t.name;
    EXPECT_EQ(std::vector<int64_t>(t.ne, t.ne + 4), std::vector<int64_t>(r->ne, r->ne + 4)) << t.name;
    if (t.type != r->type || t.nbytes != r->nbytes) continue;
    const bool bytes_equal = std::memcmp(t.data, r->data, t.nbytes) == 0;
    EXPECT_TRUE(bytes_equal) << t.name << " (" << dtype_info(t.type)->name << ") bytes differ";
    same += bytes_equal;
  }
  return same;
}

// The fingerprint tools/gguf_compare.py --digest prints: sha256 over the tensors sorted by
// name (name, a zero byte, u32 LE type id, data), computed with coreutils' sha256sum; and the
// tensor count per type ("f32:55 q4_K:2 ...").
std::string tensor_digest(const gguf::File& f, const std::string& scratch, std::string* counts) {
  std::vector<const gguf::TensorInfo*> sorted;
  for (const auto& t : f.tensors()) sorted.push_back(&t);
  std::sort(sorted.begin(), sorted.end(), [](auto* a, auto* b) { return a->name < b->name; });
  std::vector<uint8_t> stream;
  std::map<std::string, int> per_type;
  for (const gguf::TensorInfo* t : sorted) {
    stream.insert(stream.end(), t->name.begin(), t->name.end());
    stream.push_back(0);
    for (int k = 0; k < 4; ++k) stream.push_back(uint8_t(t->type >> (8 * k)));
    stream.insert(stream.end(), t->data, t->data + t->nbytes);
    per_type[dtype_info(t->type)->name]++;
  }
  counts->clear();
  for (const auto& [name, n] : per_type) *counts += (counts->empty() ? "" : " ") + name + ":" + std::to_string(n);
  write_bytes(scratch, stream);
  std::string out;
  if (run_command("sha256sum '" + scratch + "'", &out, nullptr) != 0 || out.size() < 64) return "sha256sum failed";
  std::remove(scratch.c_str());
  return out.substr(0, 64);
}

// ---- encoders ----------------------------------------------------------------------------

const DType kKQuants[] = {DType::Q2_K, DType::Q3_K, DType::Q4_K, DType::Q5_K, DType::Q6_K};

// Relative rms error bound per super-block of Gaussian data: a b-bit quantizer over a
// sub-block's range (~4σ for 16-32 samples) errs by step/√12, i.e. 4σ/(2^b-1)/√12 ≈ 0.077σ
// at 4 bits, halving per extra bit; the bounds are that estimate with ~25 % margin
// (Q2_K, Q3_K: their searches do a little better than plain rounding).
double rms_bound(DType t) {
  switch (t) {
    case DType::Q2_K: return 0.36;
    case DType::Q3_K: return 0.19;
    case DType::Q4_K: return 0.095;
    case DType::Q5_K: return 0.05;
    case DType::Q6_K: return 0.025;
    default: return 0;
  }
}

std::vector<float> roundtrip(DType t, const std::vector<float>& x) {
  std::vector<uint8_t> q(*row_bytes(t, int64_t(x.size())));
  EXPECT_TRUE(quantize_row_ref(t, x.data(), q.data(), int64_t(x.size())));
  std::vector<float> y(x.size());
  dequantize_row_ref(t, q.data(), y.data(), int64_t(x.size()));
  return y;
}

// quantize_row_fast against quantize_row_ref for IQ4_NL and IQ4_XS at every ISA level this
// CPU has (their fast path takes the level's searches): "" when all agree byte for byte,
// else the first type and level that differ and where. *rows counts the rows compared. The
// level in use is restored on every way out.
std::string iq4_fast_path_difference(const std::vector<float>& x, size_t* rows = nullptr) {
  const int64_t n = int64_t(x.size());
  const kernels::Isa saved = kernels::active_isa();
  std::string difference;
  for (kernels::Isa isa : kernels::available_isas()) {
    kernels::force_isa(isa);
    for (DType t : {DType::IQ4_NL, DType::IQ4_XS}) {
      std::vector<uint8_t> ref(*row_bytes(t, n)), fast(ref.size());
      const std::string where = std::string(dtype_name(t)) + " at " + kernels::isa_name(isa);
      if (!quantize_row_ref(t, x.data(), ref.data(), n) || !quantize_row_fast(t, x.data(), fast.data(), n)) {
        difference = where + ": refused";
        break;
      }
      size_t first_diff = 0;
      while (first_diff < ref.size() && ref[first_diff] == fast[first_diff]) ++first_diff;
      if (first_diff != ref.size()) {
        difference = where + ": byte " + std::to_string(first_diff);
        break;
      }
      if (rows) ++*rows;
    }
    if (!difference.empty()) break;
  }
  kernels::force_isa(saved);
  return difference;
}

TEST(KQuantEncode, RoundTripErrorWithinBitWidthBounds) {
  std::mt19937 rng(11);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const int n_blocks = 48;
  std::vector<float> x(256 * n_blocks);
  // Super-blocks of different magnitudes and offsets, so the per-block d/dmin matter.
  for (size_t i = 0; i < x.size(); ++i) {
    const int b = int(i / 256);
    x[i] = nd(rng) * 0.02f * float(1 + b % 4) + (b % 5 == 0 ? 0.01f : 0.0f) + (b % 7 == 3 ? -0.5f : 0.0f);
  }
  for (DType t : kKQuants) {
    SCOPED_TRACE(dtype_name(t));
    const std::vector<float> y = roundtrip(t, x);
    for (int b = 0; b < n_blocks; ++b) {
      // Relative to the block's rms (the fixtures' "relative rms weight error"); an offset
      // block has a larger rms, so the same bound is looser there.
      double err2 = 0, sum2 = 0;
      for (int i = 0; i < 256; ++i) {
        err2 += std::pow(double(y[256 * b + i]) - x[256 * b + i], 2);
        sum2 += std::pow(double(x[256 * b + i]), 2);
      }
      EXPECT_LE(std::sqrt(err2 / sum2), rms_bound(t)) << "super-block " << b;
    }
  }
}

TEST(KQuantEncode, ZeroAndConstantSubBlocks) {
  std::vector<float> x(512, 0.0f);  // super-block 0 all zero
  for (int i = 256; i < 512; ++i) x[size_t(i)] = (i / 16) % 2 ? 0.75f : 0.0f;  // zero and constant sub-blocks
  for (DType t : kKQuants) {
    SCOPED_TRACE(dtype_name(t));
    const std::vector<float> y = roundtrip(t, x);
    for (int i = 0; i < 256; ++i) ASSERT_EQ(y[size_t(i)], 0.0f) << i;
    for (int i = 256; i < 512; ++i) {
      if (x[size_t(i)] == 0.0f) {
        ASSERT_NEAR(y[size_t(i)], 0.0f, 0.75f * 0.02f) << i;
      } else {
        // A constant is on the grid of every type up to the f16 rounding of d and a
        // 6-/8-bit sub-block scale (Q2_K's 4-bit scales: one step of 1/15 at worst).
        ASSERT_NEAR(y[size_t(i)], 0.75f, t == DType::Q2_K ? 0.75f / 15 : 0.75f * 0.02f) << i;
      }
    }
  }
}

TEST(KQuantEncode, NonFiniteInputDoesNotCrash) {
  // Garbage in, garbage out, but never undefined behaviour (ASan/UBSan check this run).
  std::vector<float> x(256, 1.0f);
  x[3] = std::numeric_limits<float>::quiet_NaN();
  x[40] = std::numeric_limits<float>::infinity();
  x[100] = -std::numeric_limits<float>::infinity();
  for (DType t : kKQuants) {
    std::vector<uint8_t> q(*row_bytes(t, 256));
    EXPECT_TRUE(quantize_row_ref(t, x.data(), q.data(), 256)) << dtype_name(t);
  }
}

// ---- IQ4_NL / IQ4_XS encoders ----------------------------------------------------------

TEST(Iq4Encode, RoundTripErrorOfNonUniformFourBits) {
  std::mt19937 rng(23);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(256 * 32);
  for (size_t i = 0; i < x.size(); ++i) x[i] = nd(rng) * 0.02f * float(1 + (i / 256) % 4);
  for (DType t : {DType::IQ4_NL, DType::IQ4_XS}) {
    SCOPED_TRACE(dtype_name(t));
    const std::vector<float> y = roundtrip(t, x);
    double err2 = 0, sum2 = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      err2 += std::pow(double(y[i]) - x[i], 2);
      sum2 += std::pow(double(x[i]), 2);
    }
    // Gaussian data, 16 levels fitted per 32 values: ~Q4_K's error (rms_bound(Q4_K) 0.095).
    EXPECT_LE(std::sqrt(err2 / sum2), 0.095);
  }
}

// All-zero blocks come out as llama-quantize writes them (checked against its output on a
// model with zeroed blocks and tensors): level code 8 (the level 1, nearest to 0) under a zero
// scale; IQ4_XS's super-scale is -0.0 (d = -max/32 with max = 0) and every 6-bit sub-block
// scale the biased 0, i.e. 32.
TEST(Iq4Encode, ZeroBlocksAsLlamaQuantizeWritesThem) {
  std::vector<float> x(256, 0.0f);
  std::vector<uint8_t> nl(*row_bytes(DType::IQ4_NL, 256)), xs(*row_bytes(DType::IQ4_XS, 256));
  ASSERT_TRUE(quantize_row_ref(DType::IQ4_NL, x.data(), nl.data(), 256));
  ASSERT_TRUE(quantize_row_ref(DType::IQ4_XS, x.data(), xs.data(), 256));
  for (size_t b = 0; b < 8; ++b) {
    EXPECT_EQ(nl[18 * b], 0x00);
    EXPECT_EQ(nl[18 * b + 1], 0x00);
    for (size_t j = 2; j < 18; ++j) EXPECT_EQ(nl[18 * b + j], 0x88) << b << " " << j;
  }
  const uint8_t head[8] = {0x00, 0x80, 0xaa, 0xaa, 0x00, 0x00, 0x00, 0x00};
  for (size_t j = 0; j < 8; ++j) EXPECT_EQ(xs[j], head[j]) << j;
  for (size_t j = 8; j < 136; ++j) EXPECT_EQ(xs[j], 0x88) << j;
  for (float v : roundtrip(DType::IQ4_XS, x)) EXPECT_EQ(v, 0.0f);
}

// Values exactly halfway between two levels at a trial scale go to the upper level: each
// sub-block's largest magnitude is -127 · 2^e, so the first trial scale maps every value x
// to -x / 2^e exactly, and the others are the negated midpoints of neighbouring levels (and
// the levels themselves). Random data almost never hits a tie; the fast searches must break
// them as the scalar ones do, at every ISA level.
TEST(Iq4Encode, FastSearchesBreakTiesAsTheReference) {
  const int levels[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
  std::vector<float> x;
  for (int e = -6; e <= 6; e += 3)
    for (int b = 0; b < 8; ++b) {
      std::vector<float> sub = {-127.0f};
      for (int k = 0; k < 15; ++k) sub.push_back(-0.5f * float(levels[k] + levels[k + 1]));
      for (int k = 0; k < 16; ++k) sub.push_back(-float(levels[(k + b) % 16]) * (k % 2 ? 1.0f : 0.999f));
      for (float v : sub) x.push_back(std::ldexp(v, e));
    }
  ASSERT_EQ(x.size() % 256, 0u);
  EXPECT_EQ(iq4_fast_path_difference(x), "");
}

TEST(Iq4Encode, NonFiniteInputDoesNotCrash) {
  std::vector<float> x(512, 1.0f);
  x[3] = std::numeric_limits<float>::quiet_NaN();
  x[300] = std::numeric_limits<float>::infinity();
  x[301] = -std::numeric_limits<float>::infinity();
  std::vector<uint8_t> xs(*row_bytes(DType::IQ4_XS, 512)), nl(*row_bytes(DType::IQ4_NL, 512));
  EXPECT_TRUE(quantize_row_ref(DType::IQ4_XS, x.data(), xs.data(), 512));
  EXPECT_TRUE(quantize_row_ref(DType::IQ4_NL, x.data(), nl.data(), 512));
}

// quantize_row_fast (what `step35 quantize` runs) against the scalar reference, on rows that
// reach every branch of the searches: several magnitudes, sparse, one-signed, constant,
// all-zero and denormal sub-blocks, outliers, ties, and non-finite values; the IQ4 types at
// every ISA level.
TEST(KQuantEncode, FastPathIsBitIdenticalToReference) {
  std::mt19937 rng(21);
  const int n = 256 * 8;
  std::vector<float> x(n);
  size_t rows = 0, iq4_rows = 0;
  for (int rep = 0; rep < 120; ++rep) {
    const int mode = rep % 10;
    std::normal_distribution<float> nd(0.0f, mode == 1 ? 1e-3f : mode == 2 ? 30.0f : 0.02f);
    std::uniform_real_distribution<float> ud(-1.0f, 1.0f);
    for (int i = 0; i < n; ++i) {
      float v = nd(rng);
      switch (mode) {
        case 3: v = ud(rng) > 0.7f ? v : 0.0f; break;                                // sparse
        case 4: v = std::fabs(v) + 0.01f; break;                                     // positive
        case 5: v = (i / 16) % 5 == 0 ? 0.0f : (i % 7 == 0 ? v * 50 : v); break;     // zero groups, outliers
        case 6: v = -std::fabs(v); break;                                            // negative
        case 7: v = (i / 32) % 3 == 0 ? 0.75f : v * 1e-30f; break;                   // constant, denormal
        case 8: v = std::ldexp(v, (i / 16) % 60 - 30); break;                        // every magnitude
        case 9: v = float(int(v * 100)) / 25.0f; break;                              // few distinct values (ties)
        default: break;
      }
      if (mode == 0 && rep % 20 == 0 && i % 97 == 5)
        v = i % 3 == 0 ? NAN : (i % 3 == 1 ? INFINITY : -INFINITY);
      x[size_t(i)] = v;
    }
    for (DType t : {DType::Q2_K, DType::Q3_K, DType::Q4_K, DType::Q5_K, DType::Q6_K, DType::Q8_0, DType::Q4_0}) {
      std::vector<uint8_t> ref(*row_bytes(t, n)), fast(ref.size());
      ASSERT_TRUE(quantize_row_ref(t, x.data(), ref.data(), n));
      ASSERT_TRUE(quantize_row_fast(t, x.data(), fast.data(), n));
      ASSERT_TRUE(ref == fast) << dtype_name(t) << " rep " << rep << " mode " << mode;
      ++rows;
    }
    ASSERT_EQ(iq4_fast_path_difference(x, &iq4_rows), "") << "rep " << rep << " mode " << mode;
  }
  EXPECT_EQ(rows, 120u * 7);
  EXPECT_EQ(iq4_rows, 120u * 2 * kernels::available_isas().size());
  EXPECT_FALSE(quantize_row_fast(DType::Q4_K, x.data(), x.data(), 100));  // not a multiple of 256
}

// ---- the recipe on hand-built tensor lists ---------------------------------------------

TensorDesc desc(const std::string& name, std::vector<int64_t> ne, DType type = DType::F32) {
  TensorDesc d;
  d.name = name;
  d.type = type;
  for (size_t k = 0; k < ne.size(); ++k) d.ne[k] = ne[k];
  return d;
}

std::map<std::string, std::string> choose(const std::vector<TensorDesc>& ts, QuantizeModelInfo info, FileType ft) {
  const auto choices = choose_tensor_types(ts, info, ft);
  std::map<std::string, std::string> m;
  for (size_t i = 0; i < ts.size(); ++i) m[ts[i].name] = dtype_name(choices[i].type);
  return m;
}

TEST(QuantizeRecipe, TensorsThatAreNeverQuantized) {
  const std::vector<TensorDesc> ts = {
      desc("output_norm.weight", {256}), desc("rope_freqs.weight", {64}),
      desc("blk.0.attn_norm.weight", {256}), desc("blk.0.attn_q_norm.weight", {64}),
      desc("blk.1.ffn_gate_inp.weight", {256, 64}), desc("blk.1.exp_probs_b.bias", {64}),
      desc("blk.0.attn_gate.weight", {256, 1}, DType::F16),  // 2-D on paper, one row: 1-D to ggml
      desc("blk.0.attn_q.weight", {256, 256}, DType::F16),
  };
  const QuantizeModelInfo info{2, 64, 4};
  for (FileType ft : {FileType::Q4_K_M, FileType::Q8_0, FileType::F16, FileType::Q2_K}) {
    auto m = choose(ts, info, ft);
    SCOPED_TRACE(file_type_name(ft));
    for (const char* kept : {"output_norm.weight", "rope_freqs.weight", "blk.0.attn_norm.weight",
                             "blk.0.attn_q_norm.weight", "blk.1.ffn_gate_inp.weight", "blk.1.exp_probs_b.bias"})
      EXPECT_EQ(m[kept], "f32") << kept;
    EXPECT_EQ(m["blk.0.attn_gate.weight"], "f16");
    EXPECT_NE(m["blk.0.attn_q.weight"], "f32");
  }
}

// 13 blocks (12 + 1 MTP, the benchmark model's count): the _M mixes give more bits to
// layers i < 13/8 = 1, i >= 7·13/8 = 11, and (i - 1) % 3 == 2: {0, 3, 6, 9, 11, 12}.
const std::set<int> kMoreBitsOf13 = {0, 3, 6, 9, 11, 12};

TEST(QuantizeRecipe, Q4KMGivesMoreBitsToEveryThirdAttnVAndFfnDown) {
  std::vector<TensorDesc> ts;
  // Listed in reverse: the counters follow llama-quantize's visiting order, not the file's.
  for (int il = 12; il >= 0; --il) {
    const std::string p = "blk." + std::to_string(il) + ".";
    ts.push_back(desc(p + "attn_v.weight", {1024, 256}));
    ts.push_back(desc(p + (il < 2 ? "ffn_down.weight" : "ffn_down_exps.weight"), {256, 1024, 64}));
    ts.push_back(desc(p + "ffn_down_shexp.weight", {256, 1024}));
    ts.push_back(desc(p + "ffn_up_exps.weight", {1024, 256, 64}));
  }
  ts.push_back(desc("output.weight", {1024, 16384}));
  ts.push_back(desc("token_embd.weight", {1024, 16384}));
  const auto m = choose(ts, QuantizeModelInfo{13, 64, 8}, FileType::Q4_K_M);
  for (int il = 0; il < 13; ++il) {
    const std::string p = "blk." + std::to_string(il) + ".";
    const std::string want = kMoreBitsOf13.count(il) ? "q6_K" : "q4_K";
    EXPECT_EQ(m.at(p + "attn_v.weight"), want) << il;
    EXPECT_EQ(m.at(p + (il < 2 ? "ffn_down.weight" : "ffn_down_exps.weight")), want) << il;
    EXPECT_EQ(m.at(p + "ffn_down_shexp.weight"), want) << il;
    EXPECT_EQ(m.at(p + "ffn_up_exps.weight"), "q4_K") << il;
  }
  EXPECT_EQ(m.at("output.weight"), "q6_K");
  EXPECT_EQ(m.at("token_embd.weight"), "q4_K");
  // Q4_K_S: Q5_K for the first four attn_v and for ffn_down of layers < 13/8.
  const auto s = choose(ts, QuantizeModelInfo{13, 64, 8}, FileType::Q4_K_S);
  for (int il = 0; il < 13; ++il) {
    const std::string p = "blk." + std::to_string(il) + ".";
    EXPECT_EQ(s.at(p + "attn_v.weight"), il < 4 ? "q5_K" : "q4_K") << il;
    EXPECT_EQ(s.at(p + "ffn_down_shexp.weight"), il < 1 ? "q5_K" : "q4_K") << il;
  }
}

// IQ4_NL / IQ4_XS without an importance matrix: attn_v Q5_K when 4+ query heads share a KV
// head, ffn_down Q5_K for blocks < n/8, output Q6_K, the rest the base type; an IQ4_XS row
// that is not whole 256-blocks falls back to IQ4_NL.
TEST(QuantizeRecipe, Iq4MixesOfTheBenchmarkShape) {
  std::vector<TensorDesc> ts;
  for (int il = 0; il < 13; ++il) {
    const std::string p = "blk." + std::to_string(il) + ".";
    ts.push_back(desc(p + "attn_v.weight", {1024, 256}));
    ts.push_back(desc(p + "attn_k.weight", {1024, 256}));
    ts.push_back(desc(p + "attn_output.weight", {2048, 1024}));
    ts.push_back(desc(p + (il < 2 ? "ffn_down.weight" : "ffn_down_exps.weight"), {256, 1024, 64}));
    ts.push_back(desc(p + "ffn_gate_exps.weight", {1024, 256, 64}));
  }
  ts.push_back(desc("output.weight", {1024, 16384}));
  ts.push_back(desc("token_embd.weight", {1024, 16384}));
  for (FileType ft : {FileType::IQ4_NL, FileType::IQ4_XS}) {
    SCOPED_TRACE(file_type_name(ft));
    const std::string base = ft == FileType::IQ4_NL ? "iq4_nl" : "iq4_xs";
    const auto m = choose(ts, QuantizeModelInfo{13, 64, 8}, ft);
    for (int il = 0; il < 13; ++il) {
      const std::string p = "blk." + std::to_string(il) + ".";
      EXPECT_EQ(m.at(p + "attn_v.weight"), "q5_K") << il;
      EXPECT_EQ(m.at(p + "attn_k.weight"), base) << il;
      EXPECT_EQ(m.at(p + "attn_output.weight"), base) << il;
      EXPECT_EQ(m.at(p + (il < 2 ? "ffn_down.weight" : "ffn_down_exps.weight")), il < 1 ? "q5_K" : base) << il;
      EXPECT_EQ(m.at(p + "ffn_gate_exps.weight"), base) << il;
    }
    EXPECT_EQ(m.at("output.weight"), "q6_K");
    EXPECT_EQ(m.at("token_embd.weight"), base);
    // Fewer query heads per KV head: attn_v keeps the base type. Eight experts: Q8_0 for
    // attn_k / attn_v and Q5_K for attn_output, as in every 4-bit mix.
    EXPECT_EQ(choose(ts, QuantizeModelInfo{13, 64, 2}, ft).at("blk.5.attn_v.weight"), base);
    const auto e8 = choose(ts, QuantizeModelInfo{13, 8, 2}, ft);
    EXPECT_EQ(e8.at("blk.5.attn_v.weight"), "q8_0");
    EXPECT_EQ(e8.at("blk.5.attn_k.weight"), "q8_0");
    EXPECT_EQ(e8.at("blk.5.attn_output.weight"), "q5_K");
  }
  const auto c = choose_tensor_types({desc("blk.0.attn_q.weight", {160, 64}), desc("blk.0.attn_k.weight", {48, 64})},
                                     QuantizeModelInfo{1, 0, 1}, FileType::IQ4_XS);
  EXPECT_STREQ(dtype_name(c[0].type), "iq4_nl");
  EXPECT_TRUE(c[0].fallback);
  EXPECT_STREQ(dtype_name(c[1].type), "f16");
}

TEST(QuantizeRecipe, TiedEmbeddingsEightExpertsAndFallbacks) {
  // No output.weight: token_embd is the output matrix and gets its rule (Q6_K, or Q8_0 when
  // the row does not fit the base type's block).
  auto m = choose({desc("token_embd.weight", {512, 100})}, QuantizeModelInfo{1, 0, 1}, FileType::Q4_K_M);
  EXPECT_EQ(m["token_embd.weight"], "q6_K");
  m = choose({desc("token_embd.weight", {96, 100})}, QuantizeModelInfo{1, 0, 1}, FileType::Q4_K_M);
  EXPECT_EQ(m["token_embd.weight"], "q8_0");
  m = choose({desc("token_embd.weight", {96, 100})}, QuantizeModelInfo{1, 0, 1}, FileType::Q8_0);
  EXPECT_EQ(m["token_embd.weight"], "q8_0");

  // Eight experts (Mixtral's shape): attn_k and attn_v Q8_0 whatever the mix, attn_output
  // Q5_K in the low and 4-bit K mixes only.
  const std::vector<TensorDesc> ts = {desc("blk.0.attn_k.weight", {512, 128}), desc("blk.0.attn_v.weight", {512, 128}),
                                      desc("blk.0.attn_output.weight", {512, 512}), desc("output.weight", {512, 100})};
  for (FileType ft : {FileType::Q4_0, FileType::Q4_K_M, FileType::Q5_K_M, FileType::Q6_K}) {
    m = choose(ts, QuantizeModelInfo{1, 8, 2}, ft);
    SCOPED_TRACE(file_type_name(ft));
    EXPECT_EQ(m["blk.0.attn_k.weight"], "q8_0");
    EXPECT_EQ(m["blk.0.attn_v.weight"], "q8_0");
    EXPECT_EQ(m["blk.0.attn_output.weight"], ft == FileType::Q4_K_M ? "q5_K" : dtype_name(file_type_base(ft)));
  }

  // Row lengths that do not fit the block: each K type has its 32-block stand-in, and F16
  // when not even 32 fits.
  const std::vector<TensorDesc> rows = {desc("blk.0.attn_q.weight", {160, 64}), desc("blk.0.attn_k.weight", {48, 64})};
  const std::pair<FileType, const char*> fallbacks[] = {{FileType::Q2_K, "q4_0"},   {FileType::Q3_K_S, "q4_0"},
                                                        {FileType::Q4_K_S, "q5_0"}, {FileType::Q5_K_S, "q5_1"},
                                                        {FileType::Q6_K, "q8_0"},   {FileType::Q8_0, "q8_0"}};
  for (const auto& [ft, want] : fallbacks) {
    const auto c = choose_tensor_types(rows, QuantizeModelInfo{1, 0, 1}, ft);
    EXPECT_EQ(dtype_name(c[0].type), std::string(want)) << file_type_name(ft);
    EXPECT_EQ(c[0].fallback, ft != FileType::Q8_0) << file_type_name(ft);
    EXPECT_EQ(dtype_name(c[1].type), std::string("f16")) << file_type_name(ft);
    EXPECT_NE(c[1].note.find("ncols 48"), std::string::npos) << c[1].note;
  }
  // Float file types have no mixes and no fallbacks.
  EXPECT_EQ(choose(rows, QuantizeModelInfo{1, 0, 1}, FileType::BF16)["blk.0.attn_k.weight"], "bf16");
}

TEST(QuantizeRecipe, LayerIndexedTensorsNeedAValidBlockNumber) {
  const QuantizeModelInfo moe{4, 16, 2};
  EXPECT_THROW(choose_tensor_types({desc("ffn_down_exps.weight", {256, 256, 16})}, moe, FileType::Q4_K_M),
               std::runtime_error);
  EXPECT_THROW(choose_tensor_types({desc("blk.4.ffn_up_exps.weight", {256, 256, 16})}, moe, FileType::Q4_K_M),
               std::runtime_error);
  EXPECT_NO_THROW(choose_tensor_types({desc("blk.3.ffn_up_exps.weight", {256, 256, 16})}, moe, FileType::Q4_K_M));
}

TEST(QuantizeRecipe, FileTypeNames) {
  EXPECT_EQ(file_type_from_name("q4_k_m"), FileType::Q4_K_M);
  EXPECT_EQ(file_type_from_name("Q4_K"), FileType::Q4_K_M);
  EXPECT_EQ(file_type_from_name("Q5_K"), FileType::Q5_K_M);
  EXPECT_EQ(file_type_from_name("bf16"), FileType::BF16);
  EXPECT_FALSE(file_type_from_name("Q2_K_S"));  // needs an importance matrix
  EXPECT_EQ(file_type_from_name("iq4_xs"), FileType::IQ4_XS);
  EXPECT_EQ(file_type_from_name("IQ4_NL"), FileType::IQ4_NL);
  EXPECT_FALSE(file_type_from_name("IQ3_S"));  // needs an importance matrix
  EXPECT_FALSE(file_type_from_name(""));
  EXPECT_EQ(uint32_t(FileType::IQ4_NL), 25u);
  EXPECT_EQ(uint32_t(FileType::IQ4_XS), 30u);
  EXPECT_EQ(uint32_t(FileType::Q4_K_M), 15u);  // general.file_type as llama.cpp numbers it
  EXPECT_STREQ(file_type_name(FileType::Q6_K), "Q6_K");
}

// ---- whole files against llama-quantize's ------------------------------------------------

struct FixtureCase {
  const char* input;
  FileType type;
  const char* reference;  // made by llama-quantize (or bit-identical to its output)
};

void PrintTo(const FixtureCase& c, std::ostream* os) { *os << c.input << " -> " << file_type_name(c.type); }

class QuantizeFixture : public ::testing::TestWithParam<FixtureCase> {};

TEST_P(QuantizeFixture, SameTensorsAsLlamaQuantize) {
  const FixtureCase& c = GetParam();
  std::string in, ref;
  if (std::string why = model_or_skip_reason(c.input, &in); !why.empty()) GTEST_SKIP() << why;
  if (std::string why = model_or_skip_reason(c.reference, &ref); !why.empty()) GTEST_SKIP() << why;
  const std::string out = out_path(std::string(c.reference) + ".ours");
  std::vector<std::string> log;
  const QuantizeSummary s = quantize(in, out, c.type, 2, &log);

  auto ours = gguf::File::open(out), theirs = gguf::File::open(ref), input = gguf::File::open(in);
  EXPECT_EQ(expect_same_tensors(*ours, *theirs), theirs->tensors().size());
  // Tensor order and alignment are the input's.
  ASSERT_EQ(ours->tensors().size(), input->tensors().size());
  for (size_t i = 0; i < input->tensors().size(); ++i) EXPECT_EQ(ours->tensors()[i].name, input->tensors()[i].name);
  EXPECT_EQ(ours->alignment(), input->alignment());
  // Metadata: the input's, with the two keys llama-quantize sets.
  EXPECT_EQ(ours->get_u32("general.file_type"), uint32_t(c.type));
  EXPECT_EQ(ours->get_u32("general.quantization_version"), 2u);
  for (const auto& [key, value] : input->metadata()) {
    if (key == "general.file_type" || key == "general.quantization_version") continue;
    const gguf::Value* v = ours->find(key);
    ASSERT_NE(v, nullptr) << key;
    EXPECT_EQ(v->to_string(1 << 20), value.to_string(1 << 20)) << key;
  }
  EXPECT_EQ(ours->metadata().size(), input->metadata().size() + (input->has("general.file_type") ? 0 : 1) +
                                         (input->has("general.quantization_version") ? 0 : 1));
  // The summary adds up to the file.
  EXPECT_EQ(s.n_tensors, input->tensors().size());
  EXPECT_EQ(s.output_file_bytes, ours->total_file_bytes());
  uint64_t data = 0;
  for (const auto& t : ours->tensors()) data += t.nbytes;
  EXPECT_EQ(s.output_bytes, data);
  EXPECT_EQ(log.size(), input->tensors().size() + 1);  // a header line, one line per tensor
}

INSTANTIATE_TEST_SUITE_P(
    Fixtures, QuantizeFixture,
    ::testing::Values(FixtureCase{"tiny-k-f32.gguf", FileType::Q4_K_M, "tiny-k-q4_k_m.gguf"},  // pure K-quants
                      FixtureCase{"tiny-a-f32.gguf", FileType::Q4_K_M, "tiny-a-q4_k_m.gguf"},  // fallbacks
                      FixtureCase{"tiny-a-f32.gguf", FileType::Q8_0, "tiny-a-q8_0.gguf"},
                      FixtureCase{"tiny-a-f32.gguf", FileType::F16, "tiny-a-f16.gguf"},
                      FixtureCase{"tiny-b-f32.gguf", FileType::Q8_0, "tiny-b-q8_0.gguf"}),  // 8 experts
    [](const auto& info) {
      std::string s = std::string(info.param.reference);
      for (char& ch : s)
        if (!isalnum(static_cast<unsigned char>(ch))) ch = '_';
      return s;
    });

// Fingerprints (tools/gguf_compare.py --digest) of llama-quantize's outputs, llama.cpp
// de3ff81 as in ../shared/docs/peer.md: `llama-quantize MODEL OUT TYPE 2` for each row
// (bench/quantize_vs_llama.sh runs exactly that and compares file by file);
// tiny-k-f32.gguf is the regenerated fixture.
struct Golden {
  const char* input;
  const char* type;
  const char* sha256;
  const char* counts;
};
constexpr Golden kGoldens[] = {
    {"tiny-a-f32.gguf", "F16", "1edc302ec95edfafe9cc1f237a399e6ff15374778a1e51c05d93934d38c4a4c7", "f16:97 f32:55"},
    {"tiny-a-f32.gguf", "BF16", "1a8dfa81a80317613584b59f90af2b629a6ee9d22062f6361872e1907361b11c", "bf16:97 f32:55"},
    {"tiny-a-f32.gguf", "Q8_0", "de5286ef51594f737a3e83d57729fe0a9b93f40afa7c94950af958c474438c5e", "f32:55 q8_0:97"},
    {"tiny-a-f32.gguf", "Q4_0", "865ee772588c806572451d88e44e8e370e16036287c66ec2f2a89597cf0dffa7", "f32:55 q4_0:96 q8_0:1"},
    {"tiny-a-f32.gguf", "Q4_1", "24cb06be04d486859a9946dea4df078da2fce79c0d87bf09a2316e0a455702e8", "f32:55 q4_1:96 q8_0:1"},
    {"tiny-a-f32.gguf", "Q5_0", "3e4a44a1b227ea70fa36ff61224608b4cd4f7bf68ddbd27c25e6c093c92ea763", "f32:55 q5_0:96 q8_0:1"},
    {"tiny-a-f32.gguf", "Q5_1", "dde9e9a9631ce74c654d1598884a5f69dc85290acb1e56b6757ddfb53e383b9a", "f32:55 q5_1:96 q8_0:1"},
    {"tiny-a-f32.gguf", "Q2_K", "8db2bcf3a570ed48fb97c6eca6a332e6e27df5e07d39f9507e4117a8d79702cc", "f32:55 q2_K:1 q3_K:2 q4_0:93 q8_0:1"},
    {"tiny-a-f32.gguf", "Q3_K_S", "2477598eb1f3d5dadb277c4c7384963d1df11654941c9ba422d2d5956aef223a", "f32:55 q3_K:3 q4_0:93 q8_0:1"},
    {"tiny-a-f32.gguf", "Q3_K_M", "eff43e7fd22d9c442c45abc73ce178ec8db7680bfcf488ffce14602808c5da60", "f32:55 q3_K:1 q4_0:61 q4_K:2 q5_0:30 q5_1:2 q8_0:1"},
    {"tiny-a-f32.gguf", "Q3_K_L", "fac04fca8d14ba8c4b2ad0347fd51ba311db69e8b47d01ae18e777d747d7c54e", "f32:55 q3_K:1 q4_0:61 q5_1:32 q5_K:2 q8_0:1"},
    {"tiny-a-f32.gguf", "Q4_K_S", "dbbbd7325fc581810487bd3360738d2b72ab063bd725bc3bd309836e068c72a3", "f32:55 q4_K:2 q5_0:89 q5_1:4 q5_K:1 q8_0:1"},
    {"tiny-a-f32.gguf", "Q4_K_M", "c60ef3fc4a7dbb1dfb8e8cc00754eb81206e8c0754e4cf356c2506980c6da3fd", "f32:55 q4_K:2 q5_0:80 q6_K:1 q8_0:14"},
    {"tiny-a-f32.gguf", "Q5_K_S", "5a28f068c78f7c2875cf271b5c91820593e43a28a6744d2fa1b74c7ccc093e28", "f32:55 q5_1:93 q5_K:3 q8_0:1"},
    {"tiny-a-f32.gguf", "Q5_K_M", "2c6fd943414fe3a2b5206a8a1e431f956671255927aeb6f89bf58d73e6244ce9", "f32:55 q5_1:80 q5_K:2 q6_K:1 q8_0:14"},
    {"tiny-a-f32.gguf", "Q6_K", "c9728f6147367b77448871fc6b62314629f0f21b65622791aa5c2c87590fbe8a", "f32:55 q6_K:3 q8_0:94"},
    {"tiny-b-f32.gguf", "F16", "7024f40408826a0c34e31f7fb984c467d1eeaf4cf348b6ffef8d3e5097699b14", "f16:104 f32:62"},
    {"tiny-b-f32.gguf", "BF16", "8ecdc66ac6ad296f3c813e0a16a8f04b68d9d12e01ee23ad98e00e0941a12c21", "bf16:104 f32:62"},
    {"tiny-b-f32.gguf", "Q8_0", "1baa8d135b96600c79410f51ffbe15a06e32d93b63322f28cdfe7405343048a4", "f32:62 q8_0:104"},
    {"tiny-b-f32.gguf", "Q4_0", "71017cabfbd0c5bab11f5189a2886fc88d27488d9212b7a50d87ac1514683bf1", "f32:62 q4_0:85 q8_0:19"},
    {"tiny-b-f32.gguf", "Q4_1", "756a025bb96ff9202638cc81e1239178b14cdbdfb882063f9cfdb951c11f32f6", "f32:62 q4_1:85 q8_0:19"},
    {"tiny-b-f32.gguf", "Q5_0", "f2fc5274da3a383c6d1a913c8a7a20591029b348874e80611cef1f71bc18b459", "f32:62 q5_0:85 q8_0:19"},
    {"tiny-b-f32.gguf", "Q5_1", "b7bf4af319ff632e84573a6445da7d1422266e9406849c7298bb086a217bed35", "f32:62 q5_1:85 q8_0:19"},
    {"tiny-b-f32.gguf", "Q2_K", "27c882a6029f2781f32c109ea4a2cf177f421b1e41f56453b903ed8c5c06811d", "f32:62 q4_0:76 q5_1:9 q8_0:19"},
    {"tiny-b-f32.gguf", "Q3_K_S", "27c882a6029f2781f32c109ea4a2cf177f421b1e41f56453b903ed8c5c06811d", "f32:62 q4_0:76 q5_1:9 q8_0:19"},
    {"tiny-b-f32.gguf", "Q3_K_M", "e1fc9fdd1ad37cb8abad2f0cdc742000b2036bd134e039f5936a8d4942b662f8", "f32:62 q4_0:59 q5_0:17 q5_1:9 q8_0:19"},
    {"tiny-b-f32.gguf", "Q3_K_L", "0fdcbd06726d5d741992cccff5f1c66528e0f12c5a459270460ca11a31b43b9e", "f32:62 q4_0:68 q5_1:17 q8_0:19"},
    {"tiny-b-f32.gguf", "Q4_K_S", "b37b143259b67a37839faa5da4e07e73d6169b0f141f03759bb36b825710e61a", "f32:62 q5_0:75 q5_1:10 q8_0:19"},
    {"tiny-b-f32.gguf", "Q4_K_M", "925af3a650ed623f3219c7860e8370cd4386f0eecc0611aaccdb96586ba14c9b", "f32:62 q5_0:67 q5_1:9 q8_0:28"},
    {"tiny-b-f32.gguf", "Q5_K_S", "b7bf4af319ff632e84573a6445da7d1422266e9406849c7298bb086a217bed35", "f32:62 q5_1:85 q8_0:19"},
    {"tiny-b-f32.gguf", "Q5_K_M", "e4497f6470ca4ad01e210424ee2dae22f7584808f44c7b8510b9bf5af44d2763", "f32:62 q5_1:76 q8_0:28"},
    {"tiny-b-f32.gguf", "Q6_K", "1baa8d135b96600c79410f51ffbe15a06e32d93b63322f28cdfe7405343048a4", "f32:62 q8_0:104"},
    {"tiny-k-f32.gguf", "F16", "947b29f430fdb6ed9c8fce5e9aa98127be8303cb923433938fbc7b9367683205", "f16:43 f32:24"},
    {"tiny-k-f32.gguf", "BF16", "4ef04f1c04abfeaef5c8768f2fb1bc10d31eb746384e6ca92716483ca597738c", "bf16:43 f32:24"},
    {"tiny-k-f32.gguf", "Q8_0", "73f754bb32df072641d76eea110d0ceb1f3d25ec4000f352f6f4033abb20d464", "f32:24 q8_0:43"},
    {"tiny-k-f32.gguf", "Q4_0", "d0407f43b0a2894ccfb91ba5043c0898efa59bb80d9cf2acb5a32f7cbd11e6b5", "f32:24 q4_0:42 q6_K:1"},
    {"tiny-k-f32.gguf", "Q4_1", "4a0244b9c7bfa7c44cb5fd3be8e5f8070807667ce5f5a650987ecee43a3293a1", "f32:24 q4_1:42 q6_K:1"},
    {"tiny-k-f32.gguf", "Q5_0", "880bf320729f87f409f1daaddfff4da08f7a846d5c6062ff1300bd16c47abe27", "f32:24 q5_0:42 q6_K:1"},
    {"tiny-k-f32.gguf", "Q5_1", "b3d9460054e0b940d18005f7a0162444aacf4ee84c749458d602cd4769f1c7dc", "f32:24 q5_1:42 q6_K:1"},
    {"tiny-k-f32.gguf", "Q2_K", "9baefe1c4194cbe01f620e54e2c21bfa601be634d71b0e3dd39237f507c229df", "f32:24 q2_K:27 q3_K:15 q6_K:1"},
    {"tiny-k-f32.gguf", "Q3_K_S", "2f7b231c9f3113de4a249c7d1760eef1077146b489fdf58b562423399166ffcb", "f32:24 q3_K:42 q6_K:1"},
    {"tiny-k-f32.gguf", "Q3_K_M", "229402384e7c998200031b0f5faf79dac50fca625f2bb3f4d738a2cad5d8167a", "f32:24 q3_K:27 q4_K:13 q5_K:2 q6_K:1"},
    {"tiny-k-f32.gguf", "Q3_K_L", "0714224fbc2a789b07be089f20be9fe0c5a74a1974def37b91fa784f51822a78", "f32:24 q3_K:27 q5_K:15 q6_K:1"},
    {"tiny-k-f32.gguf", "Q4_K_S", "2c4b9cf56f233e01d800e66730d8ad855d645af5fd97288543665845707032c1", "f32:24 q4_K:38 q5_K:4 q6_K:1"},
    {"tiny-k-f32.gguf", "Q4_K_M", "91c63f3ff0311b8dc8c6de6a5cd252d29af1a8d704cb95e78e4df29295d5203c", "f32:24 q4_K:36 q6_K:7"},
    {"tiny-k-f32.gguf", "Q5_K_S", "e8ddf07e92be2824fea07f4f9aa303bd39b714fba83a43b114f711b4ef2bc629", "f32:24 q5_K:42 q6_K:1"},
    {"tiny-k-f32.gguf", "Q5_K_M", "876fda3c5019327f3e0f83017ddb8fe7c6dcf904ed2a9b4b53a1a71f2033d1ce", "f32:24 q5_K:36 q6_K:7"},
    {"tiny-k-f32.gguf", "Q6_K", "e7a4736cea087146ef53e82d01504d849f17577e6de142e2e78894ff734fa553", "f32:24 q6_K:43"},
    // The IQ file types llama-quantize writes without an importance matrix. tiny-a: rows of
    // 128 (IQ4_XS falls back to IQ4_NL); tiny-b: eight experts, rows of 64; tiny-k: rows of
    // 256; tiny-q: eight experts, 256 (tiny-q-f32 is regenerated like tiny-k-f32).
    {"tiny-a-f32.gguf", "IQ4_NL", "2fbfdb0804d50f2ba1a3ed69d94417e9445d06392d9630fe6e8df322f235ac13", "f32:55 iq4_nl:95 q5_K:1 q8_0:1"},
    {"tiny-a-f32.gguf", "IQ4_XS", "3f1ccb37b996d5924a0b6f0bde84de8beb30162901c124321c15f94919a74856", "f32:55 iq4_nl:93 iq4_xs:2 q5_K:1 q8_0:1"},
    {"tiny-b-f32.gguf", "IQ4_NL", "9134b7c3421cb4ae8ee95996c060f107b16695476d9be687bd365f5a961c8d45", "f32:62 iq4_nl:75 q5_1:10 q8_0:19"},
    {"tiny-b-f32.gguf", "IQ4_XS", "9134b7c3421cb4ae8ee95996c060f107b16695476d9be687bd365f5a961c8d45", "f32:62 iq4_nl:75 q5_1:10 q8_0:19"},
    {"tiny-k-f32.gguf", "IQ4_NL", "b25d2d3fe4292a6c5e0df831cc200d653eb8da325e19bd9cbd9ce59815bdd0bb", "f32:24 iq4_nl:42 q6_K:1"},
    {"tiny-k-f32.gguf", "IQ4_XS", "a6af463c2f3437a2a423b63353e9af85229b63e50fdb458ddb3766ebca4b2dc7", "f32:24 iq4_xs:42 q6_K:1"},
    {"tiny-q-f32.gguf", "IQ4_NL", "5af995f084efb26118300ccf2e0a8b8f20178365ed34edc29fbe0d776306b8de", "f32:19 iq4_nl:21 q5_K:3 q6_K:1 q8_0:6"},
    {"tiny-q-f32.gguf", "IQ4_XS", "d381571d39249a51b388d152c973bee25ae4b54010736c798ef858d39df9d18e", "f32:19 iq4_xs:21 q5_K:3 q6_K:1 q8_0:6"},
    // Already-quantized inputs (llama-quantize --allow-requantize) and an F16 input.
    {"tiny-a-q8_0.gguf", "Q4_K_M", "690878358e3bfb8250665b1ab11c83f661a6419bf2aa365a3ea1756f0e7394f2", "f32:55 q4_K:2 q5_0:80 q6_K:1 q8_0:14"},
    {"tiny-a-f16.gguf", "Q4_K_M", "6b6af84a60ff15ba1bf4706a30cf4d6ca53896deb41a1436e326063ad0b727ca", "f32:55 q4_K:2 q5_0:80 q6_K:1 q8_0:14"},
    {"tiny-k-q4_k_m.gguf", "Q4_K_S", "2f0d915292df1bc65bf7655bb45803520d060baeab01e9dfef120cdc09263076", "f32:24 q4_K:38 q5_K:4 q6_K:1"},
};

void PrintTo(const Golden& g, std::ostream* os) { *os << g.input << " -> " << g.type; }

class QuantizeGolden : public ::testing::TestWithParam<Golden> {};

TEST_P(QuantizeGolden, MatchesLlamaQuantizeFingerprint) {
  const Golden& g = GetParam();
  std::string in;
  if (std::string why = model_or_skip_reason(g.input, &in); !why.empty()) GTEST_SKIP() << why;
  const auto type = file_type_from_name(g.type);
  ASSERT_TRUE(type);
  const std::string name = std::string(g.input) + "." + g.type;
  const std::string out = out_path(name);
  std::vector<std::string> log;
  const QuantizeSummary s = quantize(in, out, *type, 2, &log);
  auto f = gguf::File::open(out);
  std::string counts;
  EXPECT_EQ(tensor_digest(*f, out + ".digest", &counts), g.sha256)
      << "compare with llama-quantize's file: bench/quantize_vs_llama.sh " << in << " " << g.type;
  EXPECT_EQ(counts, g.counts);
  // "<set>-<dtype>.gguf": quantized inputs are the q* dtypes (the set name may hold a q too).
  const std::string input(g.input);
  const bool requantized = input[input.rfind('-') + 1] == 'q';
  EXPECT_EQ(s.n_requantized > 0, requantized);
  if (requantized) {
    EXPECT_NE(log.front().find("warning: "), std::string::npos) << log.front();
  }
  f.reset();
  std::remove(out.c_str());
}

INSTANTIATE_TEST_SUITE_P(AllFileTypes, QuantizeGolden, ::testing::ValuesIn(kGoldens), [](const auto& info) {
  std::string s = std::string(info.param.input) + "_" + info.param.type;
  for (char& ch : s)
    if (!isalnum(static_cast<unsigned char>(ch))) ch = '_';
  return s;
});

// ---- other properties of the conversion ------------------------------------------------

TEST(QuantizeFile, ThreadCountDoesNotChangeTheFile) {
  std::string in;
  if (std::string why = model_or_skip_reason("tiny-k-f32.gguf", &in); !why.empty()) GTEST_SKIP() << why;
  const std::string a = out_path("threads1"), b = out_path("threads3");
  quantize(in, a, FileType::Q4_K_S, 1);
  quantize(in, b, FileType::Q4_K_S, 3);
  EXPECT_TRUE(read_bytes(a) == read_bytes(b));
}

// Splits a model into n parts (metadata in part 1, tensors dealt out in order).
std::string write_split(const std::string& src, const std::string& prefix, int n) {
  auto f = gguf::File::open(src);
  const auto& tensors = f->tensors();
  const size_t per = (tensors.size() + size_t(n) - 1) / size_t(n);
  for (int part = 0; part < n; ++part) {
    gguf::Writer w;
    if (part == 0)
      for (const auto& [k, v] : f->metadata()) w.set(k, v);
    w.set_u16("split.no", uint16_t(part));
    w.set_u16("split.count", uint16_t(n));
    w.set_i32("split.tensors.count", int32_t(tensors.size()));
    for (size_t i = size_t(part) * per; i < std::min(tensors.size(), size_t(part + 1) * per); ++i) {
      const auto& t = tensors[i];
      w.add_tensor(t.name, t.type, std::vector<int64_t>(t.ne, t.ne + t.n_dims),
                   std::vector<uint8_t>(t.data, t.data + t.nbytes));
    }
    char name[64];
    std::snprintf(name, sizeof name, "-%05d-of-%05d.gguf", part + 1, n);
    w.write(prefix + name);
  }
  char first[64];
  std::snprintf(first, sizeof first, "-%05d-of-%05d.gguf", 1, n);
  return prefix + first;
}

TEST(QuantizeFile, SplitInputGivesTheSameSingleFile) {
  const std::string whole = fixture_model("tiny-a-f32.gguf");
  if (!file_exists(whole)) GTEST_SKIP() << "tiny-a-f32.gguf not found";
  const std::string part1 = write_split(whole, tmp_dir() + "/quantize-split", 3);
  const std::string a = out_path("from-whole"), b = out_path("from-split");
  quantize(whole, a, FileType::Q4_K_M);
  quantize(part1, b, FileType::Q4_K_M);
  auto fa = gguf::File::open(a), fb = gguf::File::open(b);
  EXPECT_EQ(fb->n_files(), 1u);
  EXPECT_EQ(expect_same_tensors(*fb, *fa), fa->tensors().size());
  for (const char* key : {"split.no", "split.count", "split.tensors.count"}) EXPECT_FALSE(fb->has(key)) << key;
  // The output is a model step35 loads (llama.cpp reads it too: docs/quantize.md).
  Model::LoadOptions opts;
  opts.verbose = false;
  EXPECT_NO_THROW(Model::load(b, opts));
  // Overwriting a part of the input is refused before anything is written.
  const std::string part2 = tmp_dir() + "/quantize-split-00002-of-00003.gguf";
  const auto before = read_bytes(part2);
  EXPECT_THROW(quantize(part1, part2, FileType::Q8_0), std::runtime_error);
  EXPECT_TRUE(read_bytes(part2) == before);
}

// A minimal step35-looking GGUF: one block, one 2-D weight.
std::string write_small_model(const std::string& path, const std::string& arch, float poison) {
  gguf::Writer w;
  w.set_str("general.architecture", arch);
  w.set_u32(arch + ".block_count", 1);
  w.set_u32(arch + ".attention.head_count", 2);
  w.set_u32(arch + ".attention.head_count_kv", 1);
  std::vector<float> x(256 * 4);
  for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(float(i));
  x[256 * 2 + 7] = poison;
  std::vector<uint8_t> bytes(x.size() * 4);
  std::memcpy(bytes.data(), x.data(), bytes.size());
  w.add_tensor("blk.0.attn_q.weight", uint32_t(DType::F32), {256, 4}, bytes);
  w.write(path);
  return path;
}

TEST(QuantizeFile, BadInputsGiveClearErrors) {
  const std::string nan_model = write_small_model(tmp_dir() + "/quantize-nan.gguf", "step35", NAN);
  const std::string out = out_path("nan-out");
  try {
    quantize(nan_model, out, FileType::Q4_K_M);
    ADD_FAILURE() << "a NaN weight was quantized";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("blk.0.attn_q.weight row 2"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(file_exists(out)) << "a failed conversion leaves no output file";

  const std::string other = write_small_model(tmp_dir() + "/quantize-llama.gguf", "llama", 0.5f);
  try {
    quantize(other, out, FileType::Q8_0);
    ADD_FAILURE() << "a non-step35 model was accepted";
  } catch (const gguf::Error& e) {
    EXPECT_NE(std::string(e.what()).find("'llama' is not step35"), std::string::npos) << e.what();
  }
  // A clean small model converts.
  const std::string ok = write_small_model(tmp_dir() + "/quantize-ok.gguf", "step35", 0.5f);
  const QuantizeSummary s = quantize(ok, out, FileType::Q6_K);
  EXPECT_EQ(s.by_type.at("q6_K").tensors, 1u);
}

// ---- the CLI -----------------------------------------------------------------------------

std::string bin() { return "'" + step35_binary() + "'"; }

TEST(QuantizeCli, ProgressAndSummaryOnStderr) {
  const std::string in = fixture_model("tiny-a-f32.gguf");
  if (!file_exists(in)) GTEST_SKIP() << "tiny-a-f32.gguf not found";
  std::string out, err;
  ASSERT_EQ(run_command(bin() + " quantize '" + in + "' '" + out_path("cli") + "' q4_k_m -t 2", &out, &err), 0) << err;
  EXPECT_EQ(out, "");
  EXPECT_NE(err.find("[   1/ 152]"), std::string::npos) << err;
  EXPECT_NE(err.find("fallback: ncols 128 not divisible by 256 (q4_K) -> q5_0"), std::string::npos);
  EXPECT_NE(err.find("Q4_K_M, 152 tensors (97 converted, 55 copied, 93 fallbacks)"), std::string::npos) << err;
  EXPECT_NE(err.find("6.15 bits per weight"), std::string::npos) << err;
  EXPECT_NE(err.find("q6_K        1 tensors"), std::string::npos) << err;
}

TEST(QuantizeCli, ErrorsAreOneClearLine) {
  const std::string in = fixture_model("tiny-a-f32.gguf");
  if (!file_exists(in)) GTEST_SKIP() << "tiny-a-f32.gguf not found";
  const std::string junk = tmp_dir() + "/quantize-junk.gguf";
  write_bytes(junk, {'n', 'o', 't', ' ', 'g', 'g', 'u', 'f'});
  const std::string o = "'" + out_path("cli-err") + "'";
  struct Case {
    std::string args;
    int rc;
    std::string in_err;
  };
  const std::vector<Case> cases = {
      {"quantize '" + in + "' " + o + " Q4_K_X", 2, "unknown TYPE 'Q4_K_X'"},
      {"quantize '" + in + "' " + o + " IQ2_XS", 2, "importance matrix"},
      {"quantize '" + in + "' " + o, 2, "expected IN OUT TYPE"},
      {"quantize '" + in + "' " + o + " Q8_0 -t 0", 2, "--threads"},
      {"quantize '" + in + "' '" + in + "' Q8_0", 1, "is the input file"},
      {"quantize '" + in + "' /nonexistent-dir/out.gguf Q8_0", 1, "cannot create /nonexistent-dir/out.gguf"},
      {"quantize '" + junk + "' " + o + " Q8_0", 1, "quantize-junk.gguf"},
      {"quantize /nonexistent.gguf " + o + " Q8_0", 1, "nonexistent.gguf"},
  };
  const auto input_before = read_bytes(in);
  for (const Case& c : cases) {
    std::string err;
    EXPECT_EQ(run_command(bin() + " " + c.args, nullptr, &err), c.rc) << c.args << "\n" << err;
    EXPECT_NE(err.find(c.in_err), std::string::npos) << c.args << "\n" << err;
    EXPECT_EQ(err.find("terminate called"), std::string::npos) << err;
    EXPECT_EQ(err.find("Sanitizer"), std::string::npos) << err;
  }
  EXPECT_TRUE(read_bytes(in) == input_before) << "the input file is untouched";
}

}  // namespace
