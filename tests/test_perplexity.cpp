// src/perplexity/: the per-token scores, the statistics and the base-file format on
// hand-computed cases (the figures in the comments are worked out by hand).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <functional>
#include <regex>

#include "perplexity/base_file.h"
#include "perplexity/report.h"
#include "perplexity/statistics.h"
#include "perplexity/token_scores.h"
#include "support.h"

using namespace step35::perplexity;
using namespace step35::testing;

namespace {

// A base row for `logits` (the path a base-writing run takes).
std::vector<uint16_t> base_row(const std::vector<float>& logits, int32_t token = 0) {
  std::vector<uint16_t> row(base_row_words(int32_t(logits.size())), 0xffff);
  encode_base_row(logits.data(), int32_t(logits.size()), token, row.data());
  return row;
}

float row_float(const std::vector<uint16_t>& row, int word) {
  float f;
  std::memcpy(&f, row.data() + word, sizeof f);
  return f;
}

}  // namespace

TEST(PerplexityScores, RowWordsMatchLlamaCppLayout) {
  // 4 words of header floats, n_vocab values rounded up to an even count.
  EXPECT_EQ(base_row_words(1), 6u);
  EXPECT_EQ(base_row_words(2), 6u);
  EXPECT_EQ(base_row_words(3), 8u);
  EXPECT_EQ(base_row_words(513), 518u);
  EXPECT_EQ(base_row_words(363), 368u);
}

TEST(PerplexityScores, TokenNllIsMinusLogSoftmax) {
  // logits {0, ln 3}: p = {1/4, 3/4}.
  const std::vector<float> logits = {0.0f, std::log(3.0f)};
  EXPECT_NEAR(token_nll(logits.data(), 2, 1), std::log(4.0 / 3.0), 1e-6);  // 0.287682
  EXPECT_NEAR(token_nll(logits.data(), 2, 0), std::log(4.0), 1e-6);        // 1.386294
  // Shifting every logit changes nothing (the max is subtracted first).
  const std::vector<float> shifted = {1000.0f, 1000.0f + std::log(3.0f)};
  EXPECT_NEAR(token_nll(shifted.data(), 2, 1), std::log(4.0 / 3.0), 1e-4);
}

TEST(PerplexityScores, BaseRowQuantisesLogProbabilities) {
  // logits {0,1,2,3}: max 3, min 0 (3 - 16 < 0), scale 3/65535, values l/scale.
  // Σ e^(l-3) = e^-3 + e^-2 + e^-1 + 1 = 1.553001, ln = 0.440190.
  const std::vector<float> logits = {0, 1, 2, 3};
  std::vector<uint16_t> row(base_row_words(4));
  const double nll = encode_base_row(logits.data(), 4, 2, row.data());
  EXPECT_NEAR(nll, 1.440190, 1e-5);  // 3 + 0.440190 - 2
  EXPECT_FLOAT_EQ(row_float(row, 0), 3.0f / 65535.0f);
  EXPECT_NEAR(row_float(row, 2), -3.440190, 1e-5);  // log p of the minimum logit
  EXPECT_EQ(row[4], 0);
  EXPECT_EQ(row[5], 21845);
  EXPECT_EQ(row[6], 43690);
  EXPECT_EQ(row[7], 65535);
  for (int i = 0; i < 4; ++i)
    EXPECT_NEAR(base_row_log_prob(row.data(), i), double(logits[size_t(i)]) - 3.440190, 2e-5) << i;
  // The same nll as the plain path up to float rounding.
  EXPECT_NEAR(nll, token_nll(logits.data(), 4, 2), 1e-6);
}

TEST(PerplexityScores, BaseRowClampsBelowMaxMinus16AndPads) {
  // max 20: the floor is 4, so logit 0 stores 0 (= the floor) and logit 12 stores
  // round((12 - 4) / (16 / 65535)) = 32767.5 -> 32768 (ties to even).
  const std::vector<float> logits = {0, 12, 20};
  const std::vector<uint16_t> row = base_row(logits);
  ASSERT_EQ(row.size(), 8u);
  EXPECT_EQ(row[4], 0);
  EXPECT_EQ(row[5], 32768);
  EXPECT_EQ(row[6], 65535);
  EXPECT_EQ(row[7], 0) << "the padding word is zero";
  // Equal logits: scale 0, every value 0, log p = -ln 3 for all.
  const std::vector<uint16_t> flat = base_row({5, 5, 5});
  EXPECT_EQ(row_float(flat, 0), 0.0f);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(flat[size_t(4 + i)], 0);
    EXPECT_NEAR(base_row_log_prob(flat.data(), i), -std::log(3.0), 1e-6);
  }
}

TEST(PerplexityScores, KlAgainstBaseByHand) {
  // Base p = {1/4, 3/4}, this model p = {1/2, 1/2}:
  // KL = 1/4 ln(1/2) + 3/4 ln(3/2) = -0.173287 + 0.304099 = 0.130812.
  const std::vector<uint16_t> base = base_row({0.0f, std::log(3.0f)});
  const std::vector<float> model = {0.0f, 0.0f};
  const KlTokenScore s = score_against_base(model.data(), 2, base.data(), 1);
  EXPECT_NEAR(s.kld, 0.130812, 1e-4);
  EXPECT_NEAR(s.nll, std::log(2.0), 1e-6);
  EXPECT_NEAR(s.nll_base, std::log(4.0 / 3.0), 1e-4);
  EXPECT_NEAR(s.p_diff, 0.5 - 0.75, 1e-4);
  EXPECT_FALSE(s.same_top) << "this model's first maximum is token 0, the base's token 1";
  // A model against its own base: KL 0 up to the 16-bit rounding, same top token.
  const std::vector<float> logits = {0.5f, -1.25f, 3.0f, 2.0f, -7.0f};
  const std::vector<uint16_t> own = base_row(logits);
  const KlTokenScore self = score_against_base(logits.data(), 5, own.data(), 3);
  // (each stored log-probability is within half a step, 10/65535/2, of the exact one)
  EXPECT_NEAR(self.kld, 0.0, 1e-4);
  EXPECT_NEAR(self.p_diff, 0.0, 1e-4);
  EXPECT_TRUE(self.same_top);
}

TEST(PerplexityScores, KlIgnoresBaseEntriesAtTheFloor) {
  // Base logits {0, 20}: log p_base(0) = -20 - ln(1 + e^-20) clamps to the row floor
  // (-16), which the sum skips; the only term is p_base(1) (log p_base(1) - log p(1)).
  const std::vector<uint16_t> base = base_row({0.0f, 20.0f});
  const std::vector<float> model = {0.0f, 0.0f};
  const KlTokenScore s = score_against_base(model.data(), 2, base.data(), 1);
  EXPECT_NEAR(s.kld, std::log(2.0), 1e-5);  // 1 · (0 - ln 1/2)
}

TEST(PerplexityStatistics, MeanAndErrorFollowsLlamaCppRule) {
  // 1..11: mean 6, Σx² = 506, var = 506/11 - 36 = 10, error = sqrt(10 / 10) = 1.
  double sum = 0, sum2 = 0;
  for (int i = 1; i <= 11; ++i) {
    sum += i;
    sum2 += i * i;
  }
  MeanError m = mean_and_error(sum, sum2, 11);
  EXPECT_DOUBLE_EQ(m.mean, 6.0);
  EXPECT_NEAR(m.error, 1.0, 1e-12);
  // 10 samples or fewer: no error estimate.
  m = mean_and_error(55, 385, 10);
  EXPECT_DOUBLE_EQ(m.mean, 5.5);
  EXPECT_EQ(m.error, 0.0);
  EXPECT_EQ(mean_and_error(0, 0, 0).mean, 0.0);
}

TEST(PerplexityStatistics, CovarianceOfMeans) {
  // a = 1..10, b = 2a: Σa 55, Σb 110, Σab 770: (77 - 5.5·11) / 9 = 16.5 / 9.
  EXPECT_NEAR(covariance_of_means(55, 110, 770, 10), 16.5 / 9, 1e-12);
  EXPECT_EQ(covariance_of_means(55, 110, 770, 9), 0.0);
}

TEST(PerplexityStatistics, PercentileInterpolatesBetweenRanks) {
  const std::vector<float> v = {1, 2, 3, 4, 5};
  EXPECT_FLOAT_EQ(percentile(v, 0.5f), 3.0f);
  EXPECT_FLOAT_EQ(percentile(v, 0.9f), 4.6f);   // rank 3.6: 0.4·4 + 0.6·5
  EXPECT_FLOAT_EQ(percentile(v, 0.1f), 1.4f);   // rank 0.4
  EXPECT_FLOAT_EQ(percentile(v, 0.0f), 1.0f);
  EXPECT_FLOAT_EQ(percentile(v, 1.0f), 5.0f);
  EXPECT_NEAR(percentile(v, 0.999f), 4.996f, 1e-5);
  EXPECT_FLOAT_EQ(median(v), 3.0f);
  EXPECT_FLOAT_EQ(median({1, 2, 3, 4}), 2.5f);
  EXPECT_FLOAT_EQ(median({7}), 7.0f);
}

TEST(PerplexityStatistics, QuantilesSortAndPick) {
  std::vector<float> v;
  for (int i = 100; i >= 0; --i) v.push_back(float(i));  // 0..100, reversed
  const Quantiles q = quantiles(v);
  EXPECT_EQ(v.front(), 0.0f) << "sorted in place";
  EXPECT_FLOAT_EQ(q.min, 0);
  EXPECT_FLOAT_EQ(q.max, 100);
  EXPECT_FLOAT_EQ(q.median, 50);
  EXPECT_NEAR(q.p99, 99, 1e-4);
  EXPECT_NEAR(q.p95, 95, 1e-4);
  EXPECT_NEAR(q.p90, 90, 1e-4);
  EXPECT_NEAR(q.p75, 75, 1e-4);
  EXPECT_NEAR(q.p25, 25, 1e-4);
  EXPECT_NEAR(q.p10, 10, 1e-4);
  EXPECT_NEAR(q.p5, 5, 1e-4);
  EXPECT_NEAR(q.p1, 1, 1e-4);
  EXPECT_NEAR(q.p99_9, 99.9, 1e-4);
  EXPECT_NEAR(q.p0_1, 0.1, 1e-4);
}

TEST(PerplexityStatistics, FinalEstimateAndItsUncertainty) {
  // nll = ln2 · {1, 2, 3}: PPL = exp(2 ln 2) = 4; var = (ln2)² (14/3 - 4) = (ln2)² · 2/3;
  // E = 4 · sqrt(var / 2) = 4 ln2 / sqrt(3) = 1.600755.
  PerplexitySums s;
  for (int k = 1; k <= 3; ++k) s.add(k * std::log(2.0));
  EXPECT_NEAR(s.ppl(), 4.0, 1e-12);
  double e = 0;
  ASSERT_TRUE(s.ppl_error(&e));
  EXPECT_NEAR(e, 1.600755, 1e-6);
  EXPECT_EQ(final_estimate(s), "Final estimate: PPL = 4.0000 +/- 1.60075\n");
  EXPECT_EQ(running_estimate(2, s), "[3]4.0000,");
  // Identical nll everywhere: zero variance, llama.cpp's error line instead.
  PerplexitySums flat;
  for (int k = 0; k < 3; ++k) flat.add(1.0);
  EXPECT_FALSE(flat.ppl_error(&e));
  EXPECT_EQ(final_estimate(flat), "Unexpected negative standard deviation of log(prob)\n");
}

namespace {

// 12 positions: nll alternating 1 and 2, nll_base 1.5, KLD 0.1 / 0.3, Δp ±0.125, top
// token the same at 9 of 12.
KlSums twelve_positions() {
  KlSums sums;
  for (int i = 0; i < 12; ++i) {
    KlTokenScore t;
    t.nll = i % 2 ? 2.0f : 1.0f;
    t.nll_base = 1.5f;
    t.kld = i % 2 ? 0.3 : 0.1;
    t.p_diff = i % 2 ? 0.125f : -0.125f;
    t.same_top = i < 9;
    sums.add(t);
  }
  return sums;
}

}  // namespace

TEST(PerplexityStatistics, KlFiguresByHand) {
  const KlSums sums = twelve_positions();
  const KlFigures f = kl_figures(sums);
  // mean ln PPL 1.5 both; var(nll) = 2.5 - 2.25 = 0.25, error sqrt(0.25 / 11) = 0.150756.
  EXPECT_NEAR(f.log_ppl.mean, 1.5, 1e-12);
  EXPECT_NEAR(f.log_ppl.error, 0.150756, 1e-6);
  EXPECT_EQ(f.log_ppl_base.error, 0.0);
  EXPECT_NEAR(f.ppl, std::exp(1.5), 1e-9);  // 4.481689
  EXPECT_NEAR(f.ppl_error, 4.481689 * 0.150756, 1e-5);
  EXPECT_NEAR(f.log_ppl_cov, 0.0, 1e-12);  // Σab/n = 2.25 = 1.5 · 1.5
  EXPECT_NEAR(f.log_ppl_ratio, 0.0, 1e-12);
  EXPECT_NEAR(f.log_ppl_ratio_error, 0.150756, 1e-6);
  EXPECT_NEAR(f.ppl_ratio, 1.0, 1e-12);
  EXPECT_NEAR(f.ppl_diff, 0.0, 1e-9);
  EXPECT_NEAR(f.ppl_diff_error, f.ppl_error, 1e-9);
  // KLD: mean 0.2, var 0.05 - 0.04 = 0.01, error sqrt(0.01 / 11) = 0.0301511.
  EXPECT_NEAR(f.kld.mean, 0.2, 1e-12);
  EXPECT_NEAR(f.kld.error, 0.0301511, 1e-6);
  // Δp: mean 0; RMS 0.125 (every Δp² equal: no spread, error 0).
  EXPECT_NEAR(f.p_diff.mean, 0.0, 1e-12);
  EXPECT_NEAR(f.p_diff.error, std::sqrt(0.015625 / 11), 1e-9);
  EXPECT_NEAR(f.rms_p_diff, 0.125, 1e-12);
  EXPECT_NEAR(f.rms_p_diff_error, 0.0, 1e-9);
  // Same top: 9/12 = 0.75, error sqrt(0.75 · 0.25 / 11) = 0.130558.
  EXPECT_NEAR(f.same_top, 0.75, 1e-12);
  EXPECT_NEAR(f.same_top_error, 0.130558, 1e-6);
  EXPECT_NEAR(sums.max_abs_p_diff, 0.125f, 0);
}

TEST(PerplexityReport, LayoutMatchesLlamaPerplexity) {
  const KlSums sums = twelve_positions();
  // Widths of llama-perplexity's table: %4d, %9.4lf, %10.5lf ×2 and %6.3lf % ×2.
  EXPECT_EQ(kl_chunk_line(0, sums),
            "   1       4.4817 \xC2\xB1    0.6756       0.00000 \xC2\xB1    0.15076       0.20000 \xC2\xB1    0.03015"
            "    12.500 \xC2\xB1  0.000 %    75.000 \xC2\xB1 13.056 %\n");
  std::vector<float> kld(12, 0.2f), p_diff(12, 0.0f);
  EXPECT_EQ(kl_summary(sums, kld, p_diff), "") << "fewer than 100 positions: no closing statistics, as llama.cpp";
}

// ---- base file ----

namespace {

struct BaseFixture {
  std::string path;
  BaseHeader h;
  std::vector<uint16_t> rows;  // every chunk's rows
};

// Writes a small base (n_ctx 6: rows 3..4 of each chunk, vocab 5) through the writer.
BaseFixture write_small_base(const std::string& name) {
  BaseFixture b;
  b.path = tmp_dir() + "/" + name;
  b.h.n_ctx = 6;
  b.h.n_vocab = 5;
  b.h.n_chunk = 2;
  for (int i = 0; i < 12; ++i) b.h.tokens.push_back(i % 5);
  BaseFileWriter w(b.path, b.h.n_ctx, b.h.n_vocab, b.h.n_chunk, b.h.tokens.data());
  for (int c = 0; c < 2; ++c) {
    std::vector<uint16_t> chunk;
    for (int r = 0; r < b.h.rows_per_chunk(); ++r) {
      const std::vector<float> logits = {float(c), float(r), 1.5f, -2.0f, 0.25f * float(r + c)};
      const std::vector<uint16_t> row = base_row(logits);
      chunk.insert(chunk.end(), row.begin(), row.end());
    }
    w.write_chunk(chunk);
    b.rows.insert(b.rows.end(), chunk.begin(), chunk.end());
  }
  w.close();
  return b;
}

std::string error_of(const std::string& path) {
  try {
    BaseFileReader r(path);
    std::vector<uint16_t> rows;
    for (int32_t c = 0; c < r.header().n_chunk; ++c) r.read_chunk(rows);
  } catch (const BaseFileError& e) {
    return e.what();
  }
  return "";
}

void patch(const std::string& path, size_t offset, const void* data, size_t n) {
  std::vector<uint8_t> bytes = read_bytes(path);
  ASSERT_LE(offset + n, bytes.size());
  std::memcpy(bytes.data() + offset, data, n);
  write_bytes(path, bytes);
}

}  // namespace

TEST(PerplexityBaseFile, WritesLlamaCppLayoutAndReadsItBack) {
  const BaseFixture b = write_small_base("base_roundtrip.kld");
  const std::vector<uint8_t> bytes = read_bytes(b.path);
  // 8 + 12 header bytes, 12 tokens, 2 chunks × 2 rows (6 - 1 - 3) × 10 words (4 + 5 + 1 padding).
  ASSERT_EQ(bytes.size(), 20u + 12 * 4 + 2 * 2 * 10 * 2);
  EXPECT_EQ(std::string(bytes.begin(), bytes.begin() + 8), "_logits_");
  int32_t fields[3];
  std::memcpy(fields, bytes.data() + 8, sizeof fields);
  EXPECT_EQ(fields[0], 6);
  EXPECT_EQ(fields[1], 5);
  EXPECT_EQ(fields[2], 2);
  BaseFileReader r(b.path);
  EXPECT_EQ(r.header().n_ctx, 6);
  EXPECT_EQ(r.header().n_vocab, 5);
  EXPECT_EQ(r.header().n_chunk, 2);
  EXPECT_EQ(r.header().tokens, b.h.tokens);
  std::vector<uint16_t> all, rows;
  for (int c = 0; c < 2; ++c) {
    r.read_chunk(rows);
    all.insert(all.end(), rows.begin(), rows.end());
  }
  EXPECT_EQ(all, b.rows);
  EXPECT_THROW(r.read_chunk(rows), BaseFileError);
}

TEST(PerplexityBaseFile, RefusesDamagedFilesWithOneLine) {
  const BaseFixture b = write_small_base("base_damaged.kld");
  const std::vector<uint8_t> good = read_bytes(b.path);
  const std::string p = tmp_dir() + "/base_damaged_copy.kld";
  struct Case {
    const char* what;
    std::function<void()> damage;
    const char* want;
  };
  const int32_t big = 0x7fffffff, neg = -3, out_of_vocab = 5;
  const float nan = std::nanf(""), positive_min = 0.5f;
  const std::vector<Case> cases = {
      {"truncated by one byte",
       [&] { write_bytes(p, std::vector<uint8_t>(good.begin(), good.end() - 1)); }, "is truncated"},
      {"cut inside the header", [&] { write_bytes(p, std::vector<uint8_t>(good.begin(), good.begin() + 10)); },
       "is truncated"},
      {"trailing bytes",
       [&] {
         std::vector<uint8_t> more = good;
         more.push_back(0);
         write_bytes(p, more);
       },
       "1 bytes after"},
      {"bad magic", [&] { patch(p, 0, "_LOGITS_", 8); }, "does not start with \"_logits_\""},
      {"negative n_vocab", [&] { patch(p, 12, &neg, 4); }, "n_vocab -3"},
      {"n_ctx too small", [&] { patch(p, 8, &neg, 4); }, "n_ctx -3"},
      {"huge n_chunk", [&] { patch(p, 16, &big, 4); }, "is truncated"},
      {"huge n_ctx and n_chunk",
       [&] {
         patch(p, 8, &big, 4);
         patch(p, 16, &big, 4);
       },
       "header sizes overflow"},
      {"token outside the vocabulary", [&] { patch(p, 20 + 4 * 7, &out_of_vocab, 4); },
       "(offset 48): token 7 is 5, outside the vocabulary of 5"},
      {"NaN scale", [&] { patch(p, 68 + 20, &nan, 4); }, "chunk 1 row 1 has scale nan"},
      {"positive minimum", [&] { patch(p, 68 + 40 + 4, &positive_min, 4); }, "chunk 2 row 0"},
  };
  for (const Case& c : cases) {
    write_bytes(p, good);
    c.damage();
    const std::string err = error_of(p);
    EXPECT_NE(err.find(c.want), std::string::npos) << c.what << ": " << err;
    EXPECT_EQ(err.find('\n'), std::string::npos) << c.what << ": one line";
  }
  EXPECT_NE(error_of(tmp_dir() + "/no_such_base.kld").find("cannot open base file"), std::string::npos);
  EXPECT_NE(error_of(tmp_dir()).find("not a regular file"), std::string::npos);
}

// ---- the command line ----

namespace {

// Debian's GPL-3 text (base-files), the text of the fidelity figures below: 35149 bytes,
// 22588 tokens with the tiny-a vocabulary.
const char* kText = "/usr/share/common-licenses/GPL-3";
const char* kTextSha256 = "3972dc9744f6499f0f9b2dbf76696f2ae7ad8af9b23dde66d6af86c9dfb36986";

std::string bin() { return std::string(1, '\'').append(step35_binary()).append(1, '\''); }

// The F32 KV cache llama.cpp's recorded figures were made with (-ctk f32 -ctv f32 -fa off);
// step35's default is F16, as llama.cpp's.
const char* kF32Cache = " -ctk f32 -ctv f32";

std::string perplexity_cmd(const std::string& model_file, const std::string& args) {
  return bin() + " perplexity -m '" + fixture_model(model_file) + "' " + args + kF32Cache;
}

// Skips the calling test when the text is missing or not the expected version.
bool text_is_available(std::string* why) {
  if (!file_exists(kText)) {
    *why = std::string(kText) + " is missing (Debian package base-files)";
    return false;
  }
  std::string out;
  if (run_command(std::string("sha256sum ") + kText, &out, nullptr) != 0 || out.rfind(kTextSha256, 0) != 0) {
    *why = std::string(kText) + " is not the version the expected figures were measured on (sha256 " + out + ")";
    return false;
  }
  return true;
}

#define REQUIRE_TEXT()                         \
  do {                                         \
    std::string why_;                          \
    if (!text_is_available(&why_)) GTEST_SKIP() << why_; \
  } while (0)

// "Final estimate: PPL = X +/- E" from stdout.
bool final_ppl(const std::string& out, double* ppl, double* error) {
  const size_t at = out.find("Final estimate: PPL = ");
  if (at == std::string::npos) return false;
  return std::sscanf(out.c_str() + at, "Final estimate: PPL = %lf +/- %lf", ppl, error) == 2;
}

// The number after `label` (the first "X" of "label X ± Y" lines), NaN if absent.
double figure(const std::string& out, const std::string& label) {
  const size_t at = out.find(label);
  if (at == std::string::npos) return std::nan("");
  return std::strtod(out.c_str() + at + label.size(), nullptr);
}

}  // namespace

TEST(PerplexityCli, RunningEstimateFinalEstimateAndThreads) {
  REQUIRE_TEXT();
  std::string out1, err1, out2, err2;
  ASSERT_EQ(run_command(perplexity_cmd("tiny-a-f32.gguf", std::string("-f ") + kText + " -c 64 --chunks 6 -t 1"),
                        &out1, &err1),
            0)
      << err1;
  // [1]x,[2]y,... then the final estimate, which repeats the last running value.
  std::smatch m;
  ASSERT_TRUE(std::regex_search(out1, m, std::regex(R"(^\[1\][0-9.]+,\[2\][0-9.]+,\[3\][0-9.]+,\[4\][0-9.]+,)"
                                                    R"(\[5\][0-9.]+,\[6\]([0-9.]+),\n)")))
      << out1;
  double ppl = 0, error = 0;
  ASSERT_TRUE(final_ppl(out1, &ppl, &error)) << out1;
  EXPECT_EQ(m[1].str(), out1.substr(out1.find("PPL = ") + 6, m[1].length()));
  EXPECT_GT(error, 0.0);
  // Progress and the run's shape on stderr, nothing of it on stdout.
  EXPECT_NE(err1.find("calculating perplexity over 6 chunks, n_ctx=64"), std::string::npos) << err1;
  EXPECT_NE(err1.find("seconds per pass"), std::string::npos) << err1;
  EXPECT_EQ(out1.find("seconds per pass"), std::string::npos);
  // Rows are summed in position order: the thread count changes no digit.
  ASSERT_EQ(run_command(perplexity_cmd("tiny-a-f32.gguf", std::string("-f ") + kText + " -c 64 --chunks 6 -t 2"),
                        &out2, &err2),
            0)
      << err2;
  EXPECT_EQ(out1, out2);
}

TEST(PerplexityCli, BatchSizeAndOneTrailingNewline) {
  REQUIRE_TEXT();
  // Smaller forward passes give the same figures (up to float rounding in the last digit).
  std::string out_a, out_b, err;
  ASSERT_EQ(run_command(perplexity_cmd("tiny-b-f32.gguf", std::string("-f ") + kText + " -c 96 --chunks 4 -t 1"),
                        &out_a, &err),
            0)
      << err;
  ASSERT_EQ(run_command(perplexity_cmd("tiny-b-f32.gguf", std::string("-f ") + kText + " -c 96 --chunks 4 -t 1 -b 7"),
                        &out_b, &err),
            0)
      << err;
  double a = 0, b = 0, ea = 0, eb = 0;
  ASSERT_TRUE(final_ppl(out_a, &a, &ea));
  ASSERT_TRUE(final_ppl(out_b, &b, &eb));
  EXPECT_NEAR(a, b, 1e-5 * a);
  EXPECT_NE(err.find("batch_size=7"), std::string::npos) << err;
  // llama.cpp drops one trailing newline of the text file (GPL-3 ends with one): the text
  // without it gives the same run.
  const std::string no_newline = tmp_dir() + "/gpl3_no_trailing_newline.txt";
  std::vector<uint8_t> text = read_bytes(kText);
  ASSERT_EQ(text.back(), '\n');
  text.pop_back();
  write_bytes(no_newline, text);
  std::string out_c;
  ASSERT_EQ(run_command(bin() + " perplexity -m '" + fixture_model("tiny-b-f32.gguf") + "' -f '" + no_newline +
                            "' -c 96 --chunks 4 -t 1" + kF32Cache,
                        &out_c, &err),
            0)
      << err;
  EXPECT_EQ(out_c, out_a);
}

TEST(PerplexityCli, KlDivergenceOfAModelAgainstItselfIsZero) {
  REQUIRE_TEXT();
  const std::string base = tmp_dir() + "/self_tiny_a_f32.kld";
  std::string out, err;
  ASSERT_EQ(run_command(perplexity_cmd("tiny-a-f32.gguf", std::string("-f ") + kText + " -c 64 --chunks 5 -t 1 " +
                                                              "--kl-divergence-base '" + base + "'"),
                        &out, &err),
            0)
      << err;
  double ppl = 0, error = 0;
  ASSERT_TRUE(final_ppl(out, &ppl, &error)) << out;
  // 5 chunks × 31 scored rows × (4 + 513 + 1) words, after the 20-byte header and 320 tokens.
  EXPECT_EQ(read_bytes(base).size(), 20u + 320 * 4 + 5 * 31 * 518 * 2);
  ASSERT_EQ(run_command(perplexity_cmd("tiny-a-f32.gguf", "--kl-divergence-base '" + base + "' --kl-divergence -t 1"),
                        &out, &err),
            0)
      << err;
  EXPECT_NE(out.find("chunk             PPL               ln(PPL(Q)/PPL(base))"), std::string::npos) << out;
  EXPECT_NE(out.find("====== KL divergence statistics ======"), std::string::npos) << out;
  EXPECT_NEAR(figure(out, "Mean PPL(Q)                   :"), ppl, 1e-4 * ppl);
  EXPECT_NEAR(figure(out, "Mean PPL(base)                :"), ppl, 2e-4 * ppl) << "16-bit log-probabilities";
  EXPECT_NEAR(figure(out, "Mean    KLD:"), 0.0, 1e-5);
  EXPECT_NEAR(figure(out, "Maximum KLD:"), 0.0, 1e-4);
  EXPECT_NEAR(figure(out, "Same top p:"), 100.0, 1e-9);
  EXPECT_NEAR(figure(out, "RMS \xCE\x94p    :"), 0.0, 0.01);
  // --chunks reads only the first chunks of the base; fewer than 100 scored tokens give
  // the table but no closing statistics (as llama.cpp).
  ASSERT_EQ(run_command(perplexity_cmd("tiny-a-f32.gguf", "--kl-divergence-base '" + base +
                                                              "' --kl-divergence --chunks 2 -t 1"),
                        &out, &err),
            0)
      << err;
  EXPECT_NE(out.find("\n   2 "), std::string::npos) << out;
  EXPECT_EQ(out.find("\n   3 "), std::string::npos) << out;
  EXPECT_EQ(out.find("======"), std::string::npos) << out;
  EXPECT_NE(err.find("no closing statistics"), std::string::npos) << err;
}

TEST(PerplexityCli, BadInputGivesOneLineErrors) {
  REQUIRE_TEXT();
  const std::string dir = tmp_dir();
  const std::string short_text = dir + "/ppl_short.txt", other_text = dir + "/ppl_other.txt";
  const std::string base = dir + "/bad_input_base.kld", cut = dir + "/bad_input_cut.kld";
  const std::string base_b = dir + "/bad_input_base_b.kld";
  std::vector<uint8_t> other = read_bytes(kText);
  write_bytes(short_text, std::vector<uint8_t>(other.begin(), other.begin() + 60));  // the text's first 60 bytes
  other[10] = 'X';  // same length, one byte changed early on
  write_bytes(other_text, other);
  std::string out, err;
  ASSERT_EQ(run_command(perplexity_cmd("tiny-a-f32.gguf", std::string("-f ") + kText +
                                                              " -c 32 --chunks 3 -t 1 --kl-divergence-base '" + base + "'"),
                        &out, &err),
            0)
      << err;
  ASSERT_EQ(run_command(perplexity_cmd("tiny-b-f32.gguf", std::string("-f ") + kText +
                                                              " -c 32 --chunks 3 -t 1 --kl-divergence-base '" + base_b +
                                                              "'"),
                        &out, &err),
            0)
      << err;
  std::vector<uint8_t> bytes = read_bytes(base);
  bytes.resize(bytes.size() - 1000);
  write_bytes(cut, bytes);
  // A well-formed base of one 5000-token chunk (all zeros), longer than the model's 4096.
  const std::string long_ctx = dir + "/bad_input_long_ctx.kld";
  {
    BaseFileWriter w(long_ctx, 5000, 513, 1, std::vector<int32_t>(5000, 0).data());
    w.write_chunk(std::vector<uint16_t>(size_t(5000 - 1 - 2500) * base_row_words(513), 0));
    w.close();
  }
  struct BadCase {
    std::string args;
    int want_rc;
    std::string want_in_err;
  };
  const std::string a = "-m '" + fixture_model("tiny-a-f32.gguf") + "' ";
  const std::string text = std::string("-f ") + kText + " ";
  const std::vector<BadCase> cases = {
      {a + "-f /nonexistent/text.txt", 1, "cannot read text file /nonexistent/text.txt: No such file"},
      {a + "-f " + dir, 1, "Is a directory"},
      {a + "-f '" + short_text + "' -c 64", 1, "tokenizes to only"},
      {a + "-f '" + short_text + "' -c 64", 1, "needs at least 128"},
      {a + text + "-c 5000", 2, "-c 5000 is larger than the model's context of 4096 tokens"},
      {a + text + "-c 2", 2, "--ctx-size"},
      {a + text + "--chunks 0", 2, "--chunks"},
      {a + text + "-b 0", 2, "--batch-size"},
      {a + "-c 64", 2, "-f TEXT is required"},
      {text + "-c 64", 2, "-m MODEL is required"},
      {a + text + "--kl-divergence", 2, "--kl-divergence needs --kl-divergence-base"},
      {a + text + "-c 64 --kl-divergence-base /nonexistent/dir/base.kld", 1, "cannot create /nonexistent/dir/base.kld"},
      {a + "--kl-divergence --kl-divergence-base /nonexistent.kld", 1, "cannot open base file /nonexistent.kld"},
      {a + "--kl-divergence --kl-divergence-base '" + cut + "'", 1, "is truncated"},
      {a + "--kl-divergence --kl-divergence-base '" + kText + "'", 1, "does not start with \"_logits_\""},
      {a + "--kl-divergence --kl-divergence-base '" + base_b + "'", 1,
       "was made with a vocabulary of 363 tokens, this model has 513"},
      {a + "--kl-divergence --kl-divergence-base '" + long_ctx + "'", 1,
       "was made with a context of 5000 tokens, larger than this model's context of 4096"},
      {a + "--kl-divergence --kl-divergence-base '" + base + "' -c 64", 1,
       "was made with a context of 32 tokens, not -c 64"},
      {a + "--kl-divergence --kl-divergence-base '" + base + "' -f '" + other_text + "'", 1,
       "does not match"},
      {a + "--kl-divergence --kl-divergence-base '" + base + "' -f '" + short_text + "'", 1,
       "the base holds 96 tokens, the text only"},
      {"-m '" + fixture_model("tiny-b-f32.gguf") + "' --kl-divergence --kl-divergence-base '" + base_b +
           "' -f '" + other_text + "'",
       1, "does not match"},
  };
  for (const auto& c : cases) {
    const int rc = run_command(bin() + " perplexity " + c.args, &out, &err);
    EXPECT_EQ(rc, c.want_rc) << c.args << "\n" << err;
    EXPECT_NE(err.find(c.want_in_err), std::string::npos) << c.args << "\n" << err;
    const size_t line = err.find("step35 perplexity: ");
    ASSERT_NE(line, std::string::npos) << c.args << "\n" << err;
    EXPECT_EQ(err.find('\n', line), err.size() - 1) << "the error is one line, the last: " << c.args << "\n" << err;
    EXPECT_EQ(err.find("terminate called"), std::string::npos) << err;
    EXPECT_EQ(out.find("Final estimate"), std::string::npos) << c.args;
  }
}

// ---- agreement with llama-perplexity (expected values recorded from llama.cpp) ----
//
// Every figure below was printed by llama.cpp's llama-perplexity (commit de3ff81, the
// fixtures' oracle build, CPU) on the same file and text, with
//   llama-perplexity -m MODEL -f /usr/share/common-licenses/GPL-3 ARGS -t 1 -ctk f32 -ctv f32 -fa off
// (ARGS as listed): an F32 KV cache without flash attention, the computation step35 does
// (llama.cpp's default F16 cache moves its own figures by up to 1e-4 relative; see
// docs/fidelity.md). Targets: the same final PPL to 4 significant digits on the F32 models,
// within 0.2 % on the quantized ones (llama.cpp rounds activations, so does step35 by
// default), and the KL-divergence figures to 2 significant digits.

namespace {

// |value - ref| within half a unit of ref's `digits`-th significant digit.
bool same_significant_digits(double value, double ref, int digits) {
  if (ref == 0) return value == 0;
  const double unit = std::pow(10.0, std::floor(std::log10(std::fabs(ref))) - digits + 1);
  return std::fabs(value - ref) <= 0.5 * unit;
}

std::string model_path(const std::string& dir, const std::string& file) {
  return fixtures_dir() + "/" + dir + "/" + file;
}

struct PplCase {
  const char* dir;
  const char* model;
  const char* args;
  double llama_ppl;  // llama-perplexity's "Final estimate: PPL = ..."
  bool quantized;    // tolerance 0.2 % instead of 4 significant digits
};

// Runs step35 perplexity for one case; returns false (with *unsupported) when the loader
// refuses a tensor type.
void check_ppl_case(const PplCase& c, const char* threads, bool* unsupported) {
  std::string out, err;
  const int rc = run_command(bin() + " perplexity -m '" + model_path(c.dir, c.model) + "' -f " + kText + " " +
                                 c.args + " -t " + threads + kF32Cache,
                             &out, &err);
  *unsupported = rc != 0 && err.find("unknown ggml type id") != std::string::npos;
  if (*unsupported) return;
  ASSERT_EQ(rc, 0) << c.model << "\n" << err;
  double ppl = 0, error = 0;
  ASSERT_TRUE(final_ppl(out, &ppl, &error)) << out;
  std::printf("[perplexity] %s %s -t %s: step35 %.4f, llama.cpp %.4f (%+.2e relative)\n", c.model, c.args, threads,
              ppl, c.llama_ppl, ppl / c.llama_ppl - 1);
  if (c.quantized)
    EXPECT_NEAR(ppl, c.llama_ppl, 0.002 * c.llama_ppl) << c.model << " " << c.args;
  else
    EXPECT_TRUE(same_significant_digits(ppl, c.llama_ppl, 4)) << c.model << " " << c.args << ": " << ppl
                                                               << " vs llama.cpp " << c.llama_ppl;
}

}  // namespace

TEST(PerplexityFidelity, FinalPplMatchesLlamaPerplexity) {
  REQUIRE_TEXT();
  const PplCase cases[] = {
      {"models", "tiny-a-f32.gguf", "-c 128 --chunks 40", 4235.9049, false},
      {"models", "tiny-b-f32.gguf", "", 2743.6368, false},  // -c 512 (the default), all 47 chunks
      {"models", "tiny-a-f16.gguf", "-c 128 --chunks 40", 4238.3101, true},
      {"models", "tiny-a-q8_0.gguf", "-c 128 --chunks 40", 4215.4975, true},
      {"models", "tiny-a-q4_k_m.gguf", "-c 128 --chunks 40", 4198.5398, true},
      {"models", "tiny-k-q4_k_m.gguf", "-c 256 --chunks 20", 3286.6377, true},
      {"models-iq", "tiny-q-q2_k.gguf", "-c 256 --chunks 10", 3687.3727, true},
  };
  // (One thread: PerplexityCli.RunningEstimateFinalEstimateAndThreads shows 2 give the same output.)
  for (const PplCase& c : cases) {
    bool unsupported = false;
    check_ppl_case(c, "1", &unsupported);
    EXPECT_FALSE(unsupported) << c.model;
  }
}

// The importance-matrix quantisations of the tiny-q set: checked for every type the model
// loader supports; the others are listed (they load once the IQ types are in src/tensor/).
TEST(PerplexityFidelity, FinalPplOfIqFilesMatchesLlamaPerplexity) {
  REQUIRE_TEXT();
  const PplCase cases[] = {
      {"models-iq", "tiny-q-iq4_xs.gguf", "-c 256 --chunks 10", 3621.0297, true},
      {"models-iq", "tiny-q-iq3_s.gguf", "-c 256 --chunks 10", 3887.4062, true},
      {"models-iq", "tiny-q-iq2_xxs.gguf", "-c 256 --chunks 10", 3662.1019, true},
      {"models-iq", "tiny-q-iq1_m.gguf", "-c 256 --chunks 10", 3745.4846, true},
  };
  std::string refused;
  for (const PplCase& c : cases) {
    bool unsupported = false;
    check_ppl_case(c, "1", &unsupported);
    if (unsupported) refused += std::string(" ") + c.model;
  }
  if (refused.size() == 0) return;
  if (refused.size() == std::string(" tiny-q-iq4_xs.gguf tiny-q-iq3_s.gguf tiny-q-iq2_xxs.gguf tiny-q-iq1_m.gguf").size())
    GTEST_SKIP() << "the model loader supports none of the IQ types yet:" << refused;
  std::printf("[perplexity] not checked (tensor types the loader refuses):%s\n", refused.c_str());
}

// The default KV cache is F16, as llama-perplexity's: tiny-a-f32's figure then matches
// llama.cpp's "defaults" column of docs/fidelity.md (llama-perplexity ... -t 1, F16 cache,
// FA on: 4235.9772) to 4 significant digits, and differs from the F32-cache figure. Measured:
// 4236.2225 (+5.8e-5 relative). A Q8_0 cache runs through perplexity too (-ctk / -ctv as in
// llama-perplexity): measured 4247.2964, +0.26 % against F16 (bound 1 %; a cache written or
// read wrongly moves it by far more).
TEST(PerplexityFidelity, DefaultF16CacheMatchesLlamaPerplexityDefaults) {
  REQUIRE_TEXT();
  std::string out, err;
  const std::string args = std::string("-f ") + kText + " -c 128 --chunks 40 -t 1";
  ASSERT_EQ(run_command(bin() + " perplexity -m '" + fixture_model("tiny-a-f32.gguf") + "' " + args, &out, &err), 0)
      << err;
  double f16 = 0, error = 0;
  ASSERT_TRUE(final_ppl(out, &f16, &error)) << out;
  std::printf("[perplexity] tiny-a-f32 F16 cache: step35 %.4f, llama.cpp defaults 4235.9772\n", f16);
  EXPECT_TRUE(same_significant_digits(f16, 4235.9772, 4)) << f16;
  EXPECT_NE(f16, 4235.9049);  // the F32-cache figure: the cache type took effect
  ASSERT_EQ(run_command(bin() + " perplexity -m '" + fixture_model("tiny-a-f32.gguf") + "' " + args +
                            " -ctk q8_0 -ctv q8_0",
                        &out, &err),
            0)
      << err;
  double q8 = 0;
  ASSERT_TRUE(final_ppl(out, &q8, &error)) << out;
  std::printf("[perplexity] tiny-a-f32 Q8_0 cache: step35 %.4f\n", q8);
  EXPECT_NEAR(q8, f16, 0.01 * f16);
  EXPECT_NE(q8, f16);
}

TEST(PerplexityFidelity, KlDivergenceMatchesLlamaPerplexity) {
  REQUIRE_TEXT();
  // Base: tiny-a-f32 -c 128 --chunks 40 (step35's own base; llama.cpp's base of the same
  // run gives the same figures, docs/fidelity.md). llama.cpp's figures come from its own
  // base, made with ARGS "-c 128 --chunks 40 --kl-divergence-base a32.kld", then
  //   llama-perplexity -m MODEL -t 1 -ctk f32 -ctv f32 -fa off --kl-divergence-base a32.kld --kl-divergence
  const std::string base = tmp_dir() + "/fidelity_tiny_a_f32_c128x40.kld";
  std::string out, err;
  ASSERT_EQ(run_command(perplexity_cmd("tiny-a-f32.gguf", std::string("-f ") + kText +
                                                              " -c 128 --chunks 40 -t 1 --kl-divergence-base '" +
                                                              base + "'"),
                        &out, &err),
            0)
      << err;
  struct Figure {
    const char* label;
    double q8_0, q4_k_m;  // llama-perplexity's value for tiny-a-q8_0 / tiny-a-q4_k_m
  };
  // The central figures (the tails, single tokens, are compared in docs/fidelity.md).
  const Figure figures[] = {
      {"Mean    KLD:", 0.005940, 0.063195},
      {"Median  KLD:", 0.001360, 0.045107},
      {"90.0%   KLD:", 0.013700, 0.129425},
      {"95.0%   KLD:", 0.026708, 0.171753},
      {"RMS \xCE\x94p    :", 0.055, 0.216},
      {"Same top p:", 92.183, 73.095},
      {"Mean PPL(Q)/PPL(base)         :", 0.995182, 0.991179},
  };
  for (const char* model : {"tiny-a-q8_0.gguf", "tiny-a-q4_k_m.gguf"}) {
    const bool q8 = std::string(model) == "tiny-a-q8_0.gguf";
    ASSERT_EQ(run_command(perplexity_cmd(model, "-t 1 --kl-divergence --kl-divergence-base '" + base + "'"), &out,
                          &err),
              0)
        << err;
    for (const Figure& f : figures) {
      const double ref = q8 ? f.q8_0 : f.q4_k_m;
      const double ours = figure(out, f.label);
      std::printf("[kl-divergence] %s %s step35 %g, llama.cpp %g\n", model, f.label, ours, ref);
      // RMS Δp within 5 %, not 2 digits: llama.cpp's figure was made with -fa off, and
      // step35's attention is the streaming (flash-style) one since issue 21, whose last bits
      // differ; on q8_0 that moved step35's figure from 0.055 to 0.057 (q4_k_m: 0.214 ->
      // 0.212), where llama.cpp's own F16 cache moves its figure to 0.081 (docs/fidelity.md).
      if (std::string(f.label).rfind("RMS", 0) == 0)
        EXPECT_NEAR(ours, ref, 0.05 * ref) << model << " " << f.label << " " << ours << " vs " << ref;
      else
        EXPECT_TRUE(same_significant_digits(ours, ref, 2)) << model << " " << f.label << " " << ours << " vs " << ref;
    }
    const double ppl_q = figure(out, "Mean PPL(Q)                   :");
    EXPECT_NEAR(ppl_q, q8 ? 4215.4976 : 4198.5398, 0.002 * ppl_q) << model;
  }
}

// Both directions of the file format without llama.cpp at test time: a base llama-perplexity
// wrote (tests/data/perplexity) is read, and the base step35 writes for the same run has the
// same bytes up to the last bit of a logit.
TEST(PerplexityFidelity, ReadsAndWritesLlamaCppBaseFiles) {
  REQUIRE_TEXT();
  const std::string llama_base = std::string(PROJECT_SOURCE_DIR) + "/tests/data/perplexity/tiny-b-f32.gpl3.c64x4.llama.kld";
  std::string out, err;
  ASSERT_EQ(run_command(perplexity_cmd("tiny-b-f32.gguf", "-t 1 --kl-divergence --kl-divergence-base '" + llama_base +
                                                              "' -f " + kText),
                        &out, &err),
            0)
      << err;
  // llama.cpp printed "Final estimate: PPL = 1408.4592 +/- 317.56357" when it wrote the base.
  EXPECT_TRUE(same_significant_digits(figure(out, "Mean PPL(base)                :"), 1408.4592, 4)) << out;
  EXPECT_TRUE(same_significant_digits(figure(out, "Mean PPL(Q)                   :"), 1408.4592, 4)) << out;
  EXPECT_LT(std::fabs(figure(out, "Mean    KLD:")), 1e-5) << out;
  EXPECT_LT(std::fabs(figure(out, "Maximum KLD:")), 1e-4) << out;
  EXPECT_EQ(figure(out, "Same top p:"), 100.0) << out;

  const std::string ours = tmp_dir() + "/tiny-b-f32.gpl3.c64x4.step35.kld";
  ASSERT_EQ(run_command(perplexity_cmd("tiny-b-f32.gguf", std::string("-f ") + kText +
                                                              " -c 64 --chunks 4 -t 1 --kl-divergence-base '" + ours +
                                                              "'"),
                        &out, &err),
            0)
      << err;
  double ppl = 0, error = 0;
  ASSERT_TRUE(final_ppl(out, &ppl, &error));
  EXPECT_TRUE(same_significant_digits(ppl, 1408.4592, 4)) << ppl;
  EXPECT_TRUE(same_significant_digits(error, 317.56357, 4)) << error;
  const std::vector<uint8_t> a = read_bytes(llama_base), b = read_bytes(ours);
  ASSERT_EQ(a.size(), b.size());
  const size_t header = 20 + 4 * 64 * 4;  // magic, n_ctx, n_vocab, n_chunk, 4 × 64 tokens
  EXPECT_TRUE(std::equal(a.begin(), a.begin() + ptrdiff_t(header), b.begin())) << "header and tokens byte for byte";
  const size_t words = base_row_words(363), rows = (a.size() - header) / 2 / words;
  ASSERT_EQ(rows, 4u * 31);
  int max_step = 0;
  double max_rel = 0;
  for (size_t r = 0; r < rows; ++r) {
    uint16_t ra[368], rb[368];
    std::memcpy(ra, a.data() + header + r * words * 2, words * 2);
    std::memcpy(rb, b.data() + header + r * words * 2, words * 2);
    for (int k = 0; k < 2; ++k) {  // scale, min log-prob: equal up to the logits' last bits
      float fa, fb;
      std::memcpy(&fa, ra + 2 * k, 4);
      std::memcpy(&fb, rb + 2 * k, 4);
      max_rel = std::max(max_rel, std::fabs(double(fa) / double(fb) - 1));
    }
    for (size_t i = 4; i < words; ++i) max_step = std::max(max_step, std::abs(int(ra[i]) - int(rb[i])));
  }
  EXPECT_LE(max_step, 1) << "quantised log-probabilities differ by at most one step";
  EXPECT_LT(max_rel, 1e-5);
}
