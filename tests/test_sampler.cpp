#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <new>
#include <set>
#include <vector>

#include "engine/sampler.h"

// Allocation counter for the "no allocation after the first call" test: this executable
// replaces the global operator new/delete with malloc/free plus a counter that is only
// armed inside that test.
static std::atomic<bool> g_count_allocs{false};
static std::atomic<long> g_allocs{0};

void* operator new(std::size_t n) {
  if (g_count_allocs.load(std::memory_order_relaxed)) g_allocs.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n) { return operator new(n); }
// Out of line, so GCC's -Wmismatched-new-delete does not see free() on an operator new
// pointer once the allocator calls are inlined (here new *is* malloc).
[[gnu::noinline]] static void release(void* p) noexcept { std::free(p); }
void operator delete(void* p) noexcept { release(p); }
void operator delete[](void* p) noexcept { release(p); }
void operator delete(void* p, std::size_t) noexcept { release(p); }
void operator delete[](void* p, std::size_t) noexcept { release(p); }

using namespace step35;

namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// Sampling with every truncation off.
SamplingParams plain(float temp, uint64_t seed = 1) {
  SamplingParams p;
  p.temperature = temp;
  p.top_k = 0;
  p.top_p = 1.0f;
  p.min_p = 0.0f;
  p.seed = seed;
  return p;
}

std::vector<double> softmax(const std::vector<float>& l, double temp = 1.0) {
  double mx = -INFINITY;
  for (float v : l) mx = std::max(mx, double(v));
  std::vector<double> p(l.size());
  double z = 0;
  for (size_t i = 0; i < l.size(); ++i) z += (p[i] = std::exp((double(l[i]) - mx) / temp));
  for (double& x : p) x /= z;
  return p;
}

std::vector<int> histogram(Sampler& s, const std::vector<float>& l, int draws) {
  std::vector<int> counts(l.size());
  for (int i = 0; i < draws; ++i) {
    const int32_t t = s.sample(l.data());
    EXPECT_GE(t, 0);
    EXPECT_LT(size_t(t), l.size());
    if (t >= 0 && size_t(t) < l.size()) counts[size_t(t)]++;
  }
  return counts;
}

// Pearson chi-square of observed counts against expected probabilities; tokens with an
// expected probability of 0 must never be drawn (checked separately, not summed).
double chi_square(const std::vector<int>& counts, const std::vector<double>& p, int draws) {
  double chi2 = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    if (p[i] == 0.0) {
      EXPECT_EQ(counts[i], 0) << "token " << i << " has probability 0 but was drawn";
      continue;
    }
    const double e = draws * p[i];
    chi2 += (counts[i] - e) * (counts[i] - e) / e;
  }
  return chi2;
}

// Upper 0.1% points of the chi-square distribution by degrees of freedom: a correct
// sampler fails one of these checks with probability 1e-3 (and the seeds are fixed, so a
// pass is a pass forever).
double chi2_crit_001(int dof) {
  static const double crit[] = {0, 10.83, 13.82, 16.27, 18.47, 20.52, 22.46, 24.32, 26.12, 27.88, 29.59};
  return crit[dof];
}

TEST(Sampler, GreedyPicksArgmaxLowestIdOnTies) {
  const std::vector<float> l = {0.5f, 2.0f, 2.0f, -1.0f};
  Sampler s(plain(0.0f), l.size());
  EXPECT_EQ(s.sample(l.data()), 1);
  EXPECT_EQ(Sampler::argmax(l.data(), l.size()), 1);
  Sampler neg(plain(-1.0f), l.size());  // negative temperature is greedy too
  EXPECT_EQ(neg.sample(l.data()), 1);
  Sampler nan_t(plain(kNaN), l.size());  // and a NaN temperature
  EXPECT_EQ(nan_t.sample(l.data()), 1);
  // Truncation settings do not matter for greedy.
  SamplingParams p = plain(0.0f);
  p.top_k = 3;
  p.top_p = 0.1f;
  p.min_p = 0.9f;
  Sampler t(p, l.size());
  EXPECT_EQ(t.sample(l.data()), 1);
}

TEST(Sampler, ArgmaxIgnoresNanAndAllMinusInfGivesZero) {
  const std::vector<float> a = {kNaN, 1.0f, kNaN, 3.0f, kNaN};
  EXPECT_EQ(Sampler::argmax(a.data(), a.size()), 3);
  const std::vector<float> b = {-kInf, kNaN, -kInf};
  EXPECT_EQ(Sampler::argmax(b.data(), b.size()), 0);
  const std::vector<float> c = {1.0f, kInf, kInf};
  EXPECT_EQ(Sampler::argmax(c.data(), c.size()), 1);
  EXPECT_EQ(Sampler::argmax(nullptr, 0), 0);
}

TEST(Sampler, FixedSeedReproducesDifferentSeedsDiffer) {
  std::vector<float> l(50);
  for (size_t i = 0; i < l.size(); ++i) l[i] = float(std::sin(double(i)));
  auto draw = [&](uint64_t seed) {
    Sampler s(plain(1.0f, seed), l.size());
    std::vector<int32_t> out;
    for (int i = 0; i < 64; ++i) out.push_back(s.sample(l.data()));
    return out;
  };
  EXPECT_EQ(draw(7), draw(7));
  EXPECT_NE(draw(7), draw(8));
  EXPECT_NE(draw(0), draw(1));
  // reset() re-seeds: the same sequence again.
  Sampler s(plain(1.0f, 7), l.size());
  std::vector<int32_t> first;
  for (int i = 0; i < 16; ++i) first.push_back(s.sample(l.data()));
  s.reset();
  std::vector<int32_t> again;
  for (int i = 0; i < 16; ++i) again.push_back(s.sample(l.data()));
  EXPECT_EQ(first, again);
}

TEST(Sampler, SeedSequenceIsPinned) {
  // mt19937_64 is specified exactly by the standard and the uniform variate is built from
  // its raw output, so these draws are the same on every platform and standard library.
  // If this changes, a user's --seed no longer reproduces their earlier runs.
  const std::vector<float> l = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, -1.0f, 0.25f, 0.75f};
  Sampler s(plain(1.0f, 42), l.size());
  std::vector<int32_t> got;
  for (int i = 0; i < 16; ++i) got.push_back(s.sample(l.data()));
  const std::vector<int32_t> want = {4, 4, 4, 2, 7, 1, 4, 3, 3, 3, 0, 4, 4, 4, 5, 7};
  EXPECT_EQ(got, want);
  // The raw engine itself: the standard's check value (10000th output, default seed).
  std::mt19937_64 e;
  e.discard(9999);
  EXPECT_EQ(e(), 9981545732273789042ull);
}

TEST(Sampler, TopKOneIsGreedyAtAnyTemperature) {
  std::vector<float> l(100);
  for (size_t i = 0; i < l.size(); ++i) l[i] = float(std::cos(double(i) * 1.7) * 3.0);
  const int32_t best = Sampler::argmax(l.data(), l.size());
  for (float temp : {0.1f, 1.0f, 5.0f, 100.0f}) {
    SamplingParams p = plain(temp, 99);
    p.top_k = 1;
    Sampler s(p, l.size());
    for (int i = 0; i < 200; ++i) ASSERT_EQ(s.sample(l.data()), best) << "temperature " << temp;
  }
}

TEST(Sampler, MatchesSoftmaxDistribution) {
  const std::vector<float> l = {1.0f, 0.0f, -0.5f, 2.0f, 0.3f, -2.0f};
  const int N = 20000;
  Sampler s(plain(1.0f, 123), l.size());
  const auto counts = histogram(s, l, N);
  EXPECT_LT(chi_square(counts, softmax(l), N), chi2_crit_001(5));
}

TEST(Sampler, TemperatureScalesTheDistribution) {
  const std::vector<float> l = {1.0f, 0.0f, -0.5f, 2.0f, 0.3f, -2.0f};
  const int N = 20000;
  for (float temp : {0.5f, 2.0f}) {
    Sampler s(plain(temp, 5), l.size());
    const auto counts = histogram(s, l, N);
    EXPECT_LT(chi_square(counts, softmax(l, temp), N), chi2_crit_001(5)) << "temperature " << temp;
  }
}

TEST(Sampler, TruncatedDistributionIsRenormalised) {
  // top-k 4 of 6, then min-p removes one more: the survivors keep their relative weights.
  const std::vector<float> l = {1.0f, 0.0f, -0.5f, 2.0f, 0.3f, -2.0f};
  SamplingParams p = plain(1.0f, 77);
  p.top_k = 4;      // keeps 3, 0, 4, 1
  p.min_p = 0.12f;  // the weakest survivor, token 1, has e^(0 - 2) = 0.135 of the max: kept
  const int N = 20000;
  Sampler s(p, l.size());
  const auto counts = histogram(s, l, N);
  std::vector<float> kept = l;
  kept[2] = kept[5] = -kInf;
  EXPECT_LT(chi_square(counts, softmax(kept), N), chi2_crit_001(3));

  p.min_p = 0.14f;  // now token 1 (0.135 of the max) goes as well
  Sampler s2(p, l.size());
  const auto counts2 = histogram(s2, l, N);
  kept[1] = -kInf;
  EXPECT_LT(chi_square(counts2, softmax(kept), N), chi2_crit_001(2));
}

// Draws many times and returns the set of tokens seen.
std::set<int32_t> support_of(const SamplingParams& p, const std::vector<float>& l, int draws = 4000) {
  Sampler s(p, l.size());
  std::set<int32_t> seen;
  for (int i = 0; i < draws; ++i) seen.insert(s.sample(l.data()));
  return seen;
}

TEST(Sampler, TopKKeepsExactlyTheKBest) {
  const std::vector<float> l = {0.1f, 3.0f, -1.0f, 2.9f, 2.95f, 0.0f, 2.8f, -0.5f};
  SamplingParams p = plain(2.0f);  // a high temperature, so every kept token shows up
  p.top_k = 3;
  EXPECT_EQ(support_of(p, l), (std::set<int32_t>{1, 3, 4}));
  p.top_k = 4;
  EXPECT_EQ(support_of(p, l), (std::set<int32_t>{1, 3, 4, 6}));
  // Ties at the boundary: the lower id is the one kept.
  const std::vector<float> tie = {1.0f, 2.0f, 1.0f, 1.0f};
  p.top_k = 2;
  EXPECT_EQ(support_of(p, tie), (std::set<int32_t>{0, 1}));
  p.top_k = 100;  // larger than the vocabulary: no truncation
  EXPECT_EQ(support_of(p, tie), (std::set<int32_t>{0, 1, 2, 3}));
}

TEST(Sampler, TopPKeepsTheSmallestNucleus) {
  const std::vector<float> l = {3.0f, 2.9f, 1.0f, 0.5f, 0.0f, -1.0f};
  const auto prob = softmax(l);  // 0.4178, 0.3781, 0.0566, 0.0343, 0.0208, 0.0077
  SamplingParams p = plain(1.0f);
  p.top_p = 0.40f;  // token 0 alone reaches 0.4
  EXPECT_EQ(support_of(p, l), (std::set<int32_t>{0}));
  p.top_p = 0.5f;
  EXPECT_EQ(support_of(p, l), (std::set<int32_t>{0, 1}));
  p.top_p = float(prob[0] + prob[1] + prob[2]) + 1e-4f;  // just past three tokens: four
  EXPECT_EQ(support_of(p, l), (std::set<int32_t>{0, 1, 2, 3}));
  p.top_p = 0.0f;  // at least one token
  EXPECT_EQ(support_of(p, l), (std::set<int32_t>{0}));
  p.top_p = 0.999999f;  // nearly everything
  EXPECT_EQ(support_of(p, l, 20000).size(), 6u);
}

TEST(Sampler, TopPOnABigVocabularyNeedsMoreThanOneChunk) {
  // A flat distribution over 1000 tokens: the nucleus for 0.5 is ~500 tokens, beyond the
  // first sorted chunk.
  std::vector<float> l(1000);
  for (size_t i = 0; i < l.size(); ++i) l[i] = -float(i) * 1e-3f;  // strictly decreasing
  const auto prob = softmax(l);
  double cum = 0;
  size_t expect_n = 0;
  while (cum < 0.5) cum += prob[expect_n++];
  SamplingParams p = plain(1.0f, 3);
  p.top_p = 0.5f;
  const auto seen = support_of(p, l, 8000);  // ~16 expected draws of each kept token
  EXPECT_EQ(*seen.rbegin(), int32_t(expect_n - 1));
  EXPECT_GT(seen.size(), expect_n - 20);  // nearly all kept tokens appear
}

TEST(Sampler, MinPDropsTokensBelowTheFraction) {
  // Relative probabilities e^(l - 3): 1, 0.905, 0.135, 0.082, 0.050, 0.018.
  const std::vector<float> l = {3.0f, 2.9f, 1.0f, 0.5f, 0.0f, -1.0f};
  SamplingParams p = plain(1.0f);
  p.min_p = 0.2f;
  EXPECT_EQ(support_of(p, l), (std::set<int32_t>{0, 1}));
  p.min_p = 0.1f;
  EXPECT_EQ(support_of(p, l), (std::set<int32_t>{0, 1, 2}));
  p.min_p = 0.95f;
  EXPECT_EQ(support_of(p, l), (std::set<int32_t>{0}));
  p.min_p = 2.0f;  // more than the max itself: the max stays
  EXPECT_EQ(support_of(p, l), (std::set<int32_t>{0}));
  // min-p is measured at the sampling temperature: at T = 2 the ratios are e^((l-3)/2).
  p.min_p = 0.2f;
  p.temperature = 2.0f;  // 1, 0.951, 0.368, 0.287, 0.223, 0.135
  EXPECT_EQ(support_of(p, l), (std::set<int32_t>{0, 1, 2, 3, 4}));
}

TEST(Sampler, TopPIsMeasuredOverTheTopKSet) {
  // Over all tokens p0 = 0.665 < 0.7, so top-p 0.7 alone keeps {0, 1}; after top-k 2 the
  // softmax is over two tokens, p0 = 0.731 >= 0.7, and only token 0 is left.
  const std::vector<float> l = {2.0f, 1.0f, 0.0f, -5.0f};
  SamplingParams p = plain(1.0f);
  p.top_p = 0.7f;
  EXPECT_EQ(support_of(p, l), (std::set<int32_t>{0, 1}));
  p.top_k = 2;
  EXPECT_EQ(support_of(p, l), (std::set<int32_t>{0}));
}

// logit_bias is added before anything else: it moves greedy picks, a -inf bias bans a
// token, and sampling follows softmax(logits + bias).
TEST(Sampler, LogitBiasShiftsGreedyAndTheDistribution) {
  const std::vector<float> l = {1.0f, 2.0f, 0.5f, -1.0f};
  SamplingParams p = plain(0.0f);
  p.logit_bias = {{2, 1.6f}};
  EXPECT_EQ(Sampler(p, l.size()).sample(l.data()), 2);
  p.logit_bias = {{1, -kInf}};
  EXPECT_EQ(Sampler(p, l.size()).sample(l.data()), 0);
  p.logit_bias = {{7, 50.0f}, {-1, 50.0f}};  // outside the vocabulary: ignored
  EXPECT_EQ(Sampler(p, l.size()).sample(l.data()), 1);

  p = plain(1.0f, 91);
  p.logit_bias = {{3, 2.0f}, {1, -kInf}};
  const int N = 20000;
  Sampler s(p, l.size());
  const auto counts = histogram(s, l, N);
  const std::vector<float> biased = {1.0f, -kInf, 0.5f, 1.0f};
  EXPECT_LT(chi_square(counts, softmax(biased), N), chi2_crit_001(2));
  std::vector<Sampler::TokenProb> dist;
  s.distribution(l.data(), dist);
  ASSERT_EQ(dist.size(), 3u);
  for (const auto& tp : dist) EXPECT_NEAR(tp.p, softmax(biased)[size_t(tp.token)], 1e-9) << tp.token;
}

// Locally typical sampling keeps the tokens whose surprise is closest to the entropy. Here
// one token has p = 0.4 and twelve have 0.05 each (entropy 2.16 nats): the twelve
// (surprise 3.00) are more typical than the likely one (0.92), so typical_p 0.48 keeps ten
// of them (ties by id) and never the most likely token.
TEST(Sampler, TypicalPKeepsTheTokensClosestToTheEntropy) {
  std::vector<float> l(13, std::log(0.05f));
  l[0] = std::log(0.4f);
  SamplingParams p = plain(1.0f, 5);
  p.typical_p = 0.48f;
  std::set<int32_t> expected;
  for (int32_t t = 1; t <= 10; ++t) expected.insert(t);
  EXPECT_EQ(support_of(p, l, 8000), expected);
  // Draws among the kept ones are uniform (equal probabilities, renormalised).
  const int N = 20000;
  Sampler s(p, l.size());
  const auto counts = histogram(s, l, N);
  std::vector<double> uniform(13, 0.0);
  for (int32_t t = 1; t <= 10; ++t) uniform[size_t(t)] = 0.1;
  EXPECT_LT(chi_square(counts, uniform, N), chi2_crit_001(9));
  p.typical_p = 1.0f;  // off
  EXPECT_EQ(support_of(p, l, 8000).size(), 13u);
}

TEST(Sampler, RepeatPenaltyDividesPositiveAndMultipliesNegative) {
  {
    const std::vector<float> l = {2.0f, 1.9f, -1.0f};
    SamplingParams p = plain(0.0f);
    p.repeat_penalty = 1.2f;  // 2.0 / 1.2 = 1.67 < 1.9
    Sampler s(p, l.size());
    EXPECT_EQ(s.sample(l.data()), 0);
    s.accept(0);
    EXPECT_EQ(s.sample(l.data()), 1);
    EXPECT_EQ(l[0], 2.0f);  // the caller's logits are untouched
  }
  {
    const std::vector<float> l = {-1.0f, -1.1f, -3.0f};
    SamplingParams p = plain(0.0f);
    p.repeat_penalty = 1.2f;  // -1.0 * 1.2 = -1.2 < -1.1 (dividing would have raised it)
    Sampler s(p, l.size());
    s.accept(0);
    EXPECT_EQ(s.sample(l.data()), 1);
  }
  {
    // Once per distinct token, however often it occurs: 2.0 / 1.04 = 1.92 > 1.9, while
    // three applications would give 1.78.
    const std::vector<float> l = {2.0f, 1.9f, -1.0f};
    SamplingParams p = plain(0.0f);
    p.repeat_penalty = 1.04f;
    Sampler s(p, l.size());
    for (int i = 0; i < 3; ++i) s.accept(0);
    EXPECT_EQ(s.sample(l.data()), 0);
  }
}

TEST(Sampler, PresencePenaltyIsOncePerToken) {
  const std::vector<float> l = {2.0f, 1.9f, -1.0f};
  {
    SamplingParams p = plain(0.0f);
    p.presence_penalty = 0.2f;
    Sampler s(p, l.size());
    s.accept(0);
    EXPECT_EQ(s.sample(l.data()), 1);  // 2.0 - 0.2 < 1.9
  }
  {
    SamplingParams p = plain(0.0f);
    p.presence_penalty = 0.05f;  // 3 occurrences still cost 0.05 only: 1.95 > 1.9
    Sampler s(p, l.size());
    for (int i = 0; i < 3; ++i) s.accept(0);
    EXPECT_EQ(s.sample(l.data()), 0);
  }
  {
    SamplingParams p = plain(0.0f);
    p.presence_penalty = -0.5f;  // a negative presence penalty promotes seen tokens
    Sampler s(p, l.size());
    s.accept(2);
    EXPECT_EQ(s.sample(l.data()), 0);  // -1.0 + 0.5 = -0.5: still below
    s.accept(1);
    EXPECT_EQ(s.sample(l.data()), 1);  // 1.9 + 0.5 = 2.4
  }
}

TEST(Sampler, FrequencyPenaltyScalesWithTheCount) {
  const std::vector<float> l = {2.0f, 1.9f, -1.0f};
  SamplingParams p = plain(0.0f);
  p.frequency_penalty = 0.06f;
  Sampler s(p, l.size());
  s.accept(0);
  EXPECT_EQ(s.sample(l.data()), 0);  // 2.0 - 0.06 > 1.9
  s.accept(0);
  EXPECT_EQ(s.sample(l.data()), 1);  // 2.0 - 0.12 < 1.9
}

TEST(Sampler, PenaltiesOnlySeeTheLastN) {
  const std::vector<float> l = {2.0f, 1.9f, -1.0f};
  SamplingParams p = plain(0.0f);
  p.repeat_penalty = 2.0f;
  p.repeat_last_n = 1;  // only the last token counts
  Sampler s(p, l.size());
  s.accept(0);
  EXPECT_EQ(s.sample(l.data()), 1);
  s.accept(2);  // token 0 leaves the window
  EXPECT_EQ(s.sample(l.data()), 0);
  p.repeat_last_n = 3;
  Sampler w(p, l.size());
  for (int32_t t : {0, 2, 2}) w.accept(t);
  EXPECT_EQ(w.sample(l.data()), 1);  // 0 is still among the last 3
  w.accept(2);
  EXPECT_EQ(w.sample(l.data()), 0);  // now it is not
  p.repeat_last_n = 0;  // no window: penalties off
  Sampler off(p, l.size());
  off.accept(0);
  EXPECT_EQ(off.sample(l.data()), 0);
  // reset() forgets the history.
  SamplingParams rp = plain(0.0f);
  rp.repeat_penalty = 2.0f;
  Sampler rs(rp, l.size());
  rs.accept(0);
  EXPECT_EQ(rs.sample(l.data()), 1);
  rs.reset();
  EXPECT_EQ(rs.sample(l.data()), 0);
}

TEST(Sampler, PenalisedDistributionMatchesTheExpectedLogits) {
  // All three penalties at once, sampled at T = 1: the draws must follow the softmax of
  // exactly the hand-penalised logits (tokens 1 and 3 seen; 0, 2, 4 untouched).
  const std::vector<float> l = {0.5f, 1.0f, -0.2f, -0.4f, 0.1f};
  SamplingParams p = plain(1.0f, 11);
  p.repeat_penalty = 1.5f;
  p.presence_penalty = 0.1f;
  p.frequency_penalty = 0.2f;
  Sampler s(p, l.size());
  for (int32_t t : {1, 3, 1, 7 /* out of range: ignored */, -1 /* ignored */}) s.accept(t);
  std::vector<float> want = l;
  want[1] = 1.0f / 1.5f - 0.1f - 0.2f * 2;   // seen twice
  want[3] = -0.4f * 1.5f - 0.1f - 0.2f * 1;  // seen once
  const int N = 20000;
  const auto counts = histogram(s, l, N);
  EXPECT_LT(chi_square(counts, softmax(want), N), chi2_crit_001(4));
}

TEST(Sampler, NanAndInfAreSafe) {
  {
    const std::vector<float> l = {kNaN, -kInf, 1.0f, kNaN};
    Sampler s(plain(1.0f), l.size());
    for (int i = 0; i < 100; ++i) EXPECT_EQ(s.sample(l.data()), 2);
    Sampler g(plain(0.0f), l.size());
    EXPECT_EQ(g.sample(l.data()), 2);
  }
  {
    const std::vector<float> all_bad = {kNaN, -kInf, kNaN};
    for (float temp : {0.0f, 1.0f}) {
      SamplingParams p = plain(temp);
      p.top_k = 2;
      p.top_p = 0.5f;
      p.min_p = 0.1f;
      Sampler s(p, all_bad.size());
      EXPECT_EQ(s.sample(all_bad.data()), 0);
    }
  }
  {
    // +inf is a point mass: the lowest +inf id.
    const std::vector<float> l = {1.0f, kInf, 0.0f, kInf};
    Sampler s(plain(1.0f), l.size());
    for (int i = 0; i < 10; ++i) EXPECT_EQ(s.sample(l.data()), 1);
  }
  {
    // Penalties on infinite logits stay well defined.
    const std::vector<float> l = {kInf, 1.0f, -kInf};
    SamplingParams p = plain(1.0f);
    p.repeat_penalty = 1.3f;
    p.presence_penalty = kInf;  // inf - inf would be NaN: treated as -inf
    Sampler s(p, l.size());
    s.accept(0);
    s.accept(2);
    for (int i = 0; i < 10; ++i) EXPECT_EQ(s.sample(l.data()), 1);
  }
  {
    // Extreme temperatures: tiny is greedy-like, huge is uniform-like; neither crashes.
    const std::vector<float> l = {0.0f, 50.0f, -50.0f};
    Sampler cold(plain(1e-30f), l.size());
    for (int i = 0; i < 10; ++i) EXPECT_EQ(cold.sample(l.data()), 1);
    Sampler hot(plain(kInf), l.size());
    std::set<int32_t> seen;
    for (int i = 0; i < 200; ++i) seen.insert(hot.sample(l.data()));
    EXPECT_EQ(seen.size(), 3u);
  }
  {
    Sampler empty(plain(1.0f), 0);
    EXPECT_EQ(empty.sample(nullptr), 0);
  }
}

TEST(Sampler, NoAllocationAfterTheFirstCall) {
  std::vector<float> l(5000);
  for (size_t i = 0; i < l.size(); ++i) l[i] = float(std::sin(double(i) * 0.37) * 4.0);
  SamplingParams p;  // the defaults: top-k, top-p, min-p all on
  p.repeat_penalty = 1.1f;
  p.presence_penalty = 0.1f;
  p.frequency_penalty = 0.1f;
  p.repeat_last_n = 16;
  for (int variant = 0; variant < 4; ++variant) {
    if (variant == 1) p.top_k = 0;      // top-p over the whole vocabulary (chunked sort)
    if (variant == 2) p.top_p = 1.0f;   // no top-p: the id-order path
    if (variant == 3) {                 // typical-p over the whole vocabulary, and a bias
      p.typical_p = 0.9f;
      p.logit_bias = {{3, 2.0f}, {4, -kInf}};
    }
    Sampler s(p, l.size());
    s.accept(1);
    s.sample(l.data());
    g_allocs = 0;
    g_count_allocs = true;
    for (int i = 0; i < 200; ++i) s.accept(s.sample(l.data()));
    g_count_allocs = false;
    EXPECT_EQ(g_allocs.load(), 0) << "variant " << variant;
  }
}

}  // namespace
