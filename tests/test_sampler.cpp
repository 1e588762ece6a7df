#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "runtime/sampler.h"

using namespace step35;

namespace {

SamplingParams plain(float temp, uint64_t seed = 1) {
  SamplingParams p;
  p.temperature = temp;
  p.top_k = 0;
  p.top_p = 1.0f;
  p.min_p = 0.0f;
  p.seed = seed;
  return p;
}

TEST(Sampler, GreedyPicksArgmaxLowestIdOnTies) {
  const std::vector<float> l = {0.5f, 2.0f, 2.0f, -1.0f};
  Sampler s(plain(0.0f), l.size());
  EXPECT_EQ(s.sample(l.data()), 1);
  EXPECT_EQ(Sampler::argmax(l.data(), l.size()), 1);
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
  Sampler s(plain(1.0f, 7), l.size());
  const int32_t first = s.sample(l.data());
  s.reset();
  EXPECT_EQ(s.sample(l.data()), first);
}

TEST(Sampler, TopKOneIsGreedy) {
  std::vector<float> l = {0.1f, 0.3f, 0.2f, 0.25f};
  SamplingParams p = plain(5.0f);
  p.top_k = 1;
  Sampler s(p, l.size());
  for (int i = 0; i < 100; ++i) EXPECT_EQ(s.sample(l.data()), 1);
}

TEST(Sampler, MatchesSoftmaxDistribution) {
  const std::vector<float> l = {1.0f, 0.0f, -0.5f, 2.0f, 0.3f, -2.0f};
  double z = 0;
  std::vector<double> p(l.size());
  for (size_t i = 0; i < l.size(); ++i) z += (p[i] = std::exp(double(l[i])));
  for (double& x : p) x /= z;
  Sampler s(plain(1.0f, 123), l.size());
  const int N = 20000;
  std::vector<int> counts(l.size());
  for (int i = 0; i < N; ++i) counts[size_t(s.sample(l.data()))]++;
  double chi2 = 0;
  for (size_t i = 0; i < l.size(); ++i) chi2 += std::pow(counts[i] - N * p[i], 2) / (N * p[i]);
  EXPECT_LT(chi2, 20.5);  // 5 degrees of freedom, p = 0.001
}

TEST(Sampler, TruncationNeverSamplesExcludedTokens) {
  const std::vector<float> l = {3.0f, 2.9f, 1.0f, 0.5f, 0.0f, -1.0f};
  {
    SamplingParams p = plain(1.0f);
    p.top_k = 2;
    Sampler s(p, l.size());
    for (int i = 0; i < 2000; ++i) EXPECT_LT(s.sample(l.data()), 2);
  }
  {
    SamplingParams p = plain(1.0f);
    p.top_p = 0.5f;  // token 0 alone has ~0.42 of the mass: tokens 0 and 1 remain
    Sampler s(p, l.size());
    for (int i = 0; i < 2000; ++i) EXPECT_LT(s.sample(l.data()), 2);
  }
  {
    SamplingParams p = plain(1.0f);
    p.min_p = 0.2f;  // exp(1-3) = 0.135 < 0.2: token 2 and below are dropped
    Sampler s(p, l.size());
    for (int i = 0; i < 2000; ++i) EXPECT_LT(s.sample(l.data()), 2);
  }
}

TEST(Sampler, PenaltiesChangeTheSeenTokens) {
  const std::vector<float> l = {2.0f, 1.9f, -1.0f};
  {
    SamplingParams p = plain(0.0f);
    p.repeat_penalty = 1.2f;  // 2.0 / 1.2 = 1.67 < 1.9
    Sampler s(p, l.size());
    s.accept(0);
    EXPECT_EQ(s.sample(l.data()), 1);
  }
  {
    SamplingParams p = plain(0.0f);
    p.presence_penalty = 0.2f;
    Sampler s(p, l.size());
    s.accept(0);
    s.accept(0);
    EXPECT_EQ(s.sample(l.data()), 1);  // 2.0 - 0.2 < 1.9
  }
  {
    SamplingParams p = plain(0.0f);
    p.frequency_penalty = 0.06f;
    Sampler s(p, l.size());
    s.accept(0);
    EXPECT_EQ(s.sample(l.data()), 0);  // 2.0 - 0.06 > 1.9
    s.accept(0);
    EXPECT_EQ(s.sample(l.data()), 1);  // 2.0 - 0.12 < 1.9
  }
  {
    SamplingParams p = plain(0.0f);
    p.repeat_penalty = 2.0f;
    p.repeat_last_n = 1;  // only the last token counts
    Sampler s(p, l.size());
    s.accept(0);
    s.accept(2);
    EXPECT_EQ(s.sample(l.data()), 0);
  }
}

TEST(Sampler, NanAndInfAreSafe) {
  const std::vector<float> l = {NAN, -INFINITY, 1.0f, NAN};
  Sampler s(plain(1.0f), l.size());
  for (int i = 0; i < 100; ++i) EXPECT_EQ(s.sample(l.data()), 2);
  const std::vector<float> all_bad = {NAN, -INFINITY};
  Sampler s2(plain(1.0f), all_bad.size());
  const int32_t t = s2.sample(all_bad.data());
  EXPECT_TRUE(t == 0 || t == 1);
}

}  // namespace
