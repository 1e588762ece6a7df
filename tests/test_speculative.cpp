// MTP speculative decoding: greedy output with --mtp 1|2|3 equals plain decoding token for
// token (prompts shorter and longer than the sliding window, one reused MTP block and three
// chained ones); speculative sampling leaves the target distribution unchanged
// (chi-square); adaptive K falls back to plain decoding when drafts are never accepted.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <random>

#include "model/session.h"
#include "model/step35.h"
#include "runtime/sampler.h"
#include "runtime/speculative.h"
#include "runtime/thread_pool.h"
#include "support.h"

using namespace step35;
using namespace step35::testing;

namespace {

std::unique_ptr<Model> load(const std::string& name) {
  std::string path = fixture_model(name + ".gguf"), why;
  if (!file_exists(path)) path = regenerated_fixture(name + ".gguf", &why);
  if (path.empty()) return nullptr;
  Model::LoadOptions o;
  o.verbose = false;
  return Model::load(path, o);
}

std::vector<int32_t> prompt(int n, int seed, int vocab) {
  std::vector<int32_t> p = {0};
  uint32_t s = uint32_t(seed) * 2654435761u + 11;
  for (int i = 1; i < n; ++i) {
    s = s * 1664525u + 1013904223u;
    p.push_back(3 + int32_t(s >> 8) % (vocab - 10));
  }
  return p;
}

// Greedy decoding with k drafts per step. With `oracle` (the plain greedy continuation),
// drafts are replaced by the true next tokens except at about 2 positions in 7, so that
// verification accepts some drafts and rejects others.
std::vector<int32_t> decode(const Model& m, const std::vector<int32_t>& p, int n_gen, int k,
                            SpeculationStats* stats = nullptr, const std::vector<int32_t>* oracle = nullptr) {
  ThreadPool pool(2);
  SpeculativeDecoder dec(m, 512, 64, Precision::Native, k, false);
  if (oracle) {
    const int32_t n_prompt = int32_t(p.size());
    dec.drafter().draft_override = [&, n_prompt](int32_t n_pos, int32_t kk, int32_t d) {
      const int32_t pos = n_pos + kk + 1;  // the position this draft is for
      const size_t i = size_t(pos - n_prompt);
      if (i >= oracle->size() || (uint32_t(pos) * 2654435761u) % 7 < 2) return d == 5 ? 6 : 5;  // a wrong guess
      return (*oracle)[i];
    };
  }
  SamplingParams sp;
  sp.temperature = 0;
  Sampler sampler(sp, size_t(m.hparams().n_vocab));
  std::vector<float> logits;
  dec.prefill(p.data(), int32_t(p.size()), logits, pool);
  std::vector<int32_t> out = {Sampler::argmax(logits.data(), logits.size())};
  while (int(out.size()) < n_gen) {
    std::vector<int32_t> produced;
    dec.step(out.back(), sampler, produced, pool);
    out.insert(out.end(), produced.begin(), produced.end());
  }
  out.resize(size_t(n_gen));
  if (stats) *stats = dec.stats();
  return out;
}

class GreedyMtp : public ::testing::TestWithParam<std::string> {};

TEST_P(GreedyMtp, EqualsPlainDecodingTokenForToken) {
  auto m = load(GetParam());
  if (!m) GTEST_SKIP() << "model not available";
  ASSERT_TRUE(m->has_mtp());
  const int V = m->hparams().n_vocab, window = m->hparams().swa_window;
  for (int len : {3, window / 2, 3 * window + 5}) {
    const auto p = prompt(len, len, V);
    const auto plain = decode(*m, p, 40, 0);
    for (int k = 1; k <= 3; ++k) {
      SpeculationStats st;
      const auto spec = decode(*m, p, 40, k, &st);
      EXPECT_EQ(spec, plain) << GetParam() << " prompt " << len << " --mtp " << k;
      EXPECT_GT(st.steps, 0u);
      // Partly right drafts: accepted ones are kept, the rest rolled back; same output.
      SpeculationStats so;
      const auto with_oracle = decode(*m, p, 40, k, &so, &plain);
      EXPECT_EQ(with_oracle, plain) << GetParam() << " prompt " << len << " --mtp " << k << " (oracle drafts)";
      EXPECT_GT(so.accepted[1], 0u);
      EXPECT_LT(so.accepted[1], so.drafted[1]);
      if (k >= 2) EXPECT_GT(so.accepted[2], 0u);
      std::printf("[mtp] %s prompt %d k=%d: %.2f tokens/step, acceptance %.2f %.2f %.2f\n", GetParam().c_str(), len, k,
                  st.mean_tokens_per_step(), st.acceptance(1), st.acceptance(2), st.acceptance(3));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, GreedyMtp, ::testing::Values("tiny-a-f32", "tiny-a-q4_k_m", "tiny-b-f32"),
                         [](const auto& info) {
                           std::string s = info.param;
                           for (char& c : s)
                             if (!isalnum(static_cast<unsigned char>(c))) c = '_';
                           return s;
                         });

// Chi-square of observed counts against expected probabilities; bins with expected count
// below 5 are merged. Returns (statistic, degrees of freedom).
std::pair<double, int> chi_square(const std::map<int32_t, int>& counts, const std::vector<Sampler::TokenProb>& p,
                                  int n) {
  double stat = 0, e_acc = 0, o_acc = 0;
  int dof = -1;
  std::vector<Sampler::TokenProb> sorted = p;
  std::sort(sorted.begin(), sorted.end(), [](auto& a, auto& b) { return a.p > b.p; });
  for (const auto& tp : sorted) {
    const double e = tp.p * n;
    auto it = counts.find(tp.token);
    const double o = it == counts.end() ? 0 : it->second;
    if (e >= 5) {
      stat += (o - e) * (o - e) / e;
      ++dof;
    } else {
      e_acc += e, o_acc += o;
    }
  }
  if (e_acc > 0) {
    stat += (o_acc - e_acc) * (o_acc - e_acc) / std::max(e_acc, 1e-9);
    ++dof;
  }
  return {stat, std::max(dof, 1)};
}

// verify_drafts on synthetic distributions: the first token it outputs is distributed as
// the target p, whatever the draft distribution q.
TEST(SpeculativeSampling, OutputFollowsTheTargetDistribution) {
  const size_t V = 12;
  std::mt19937 rng(5);
  std::normal_distribution<float> g(0.0f, 1.5f);
  for (int trial = 0; trial < 3; ++trial) {
    std::vector<float> rows(V * 3), draft_logits(V);
    for (auto& x : rows) x = g(rng);
    for (auto& x : draft_logits) x = g(rng) * (trial == 2 ? 0.0f : 1.0f);  // trial 2: uniform q
    SamplingParams sp;
    sp.temperature = 1.0f;
    sp.top_k = 0;
    sp.top_p = 1.0f;
    sp.min_p = 0.0f;
    sp.seed = 100 + uint64_t(trial);
    Sampler sampler(sp, V);
    std::vector<Sampler::TokenProb> p, q;
    sampler.distribution(rows.data(), p);
    sampler.distribution(draft_logits.data(), q);
    const int n = 40000;
    std::map<int32_t, int> counts;
    int accepted = 0;
    for (int i = 0; i < n; ++i) {
      // Draw the draft from q with the sampler's own RNG, as the drafter does.
      double u = sampler.uniform(), cum = 0;
      int32_t d = q.back().token;
      for (const auto& tp : q)
        if (u < (cum += tp.p)) {
          d = tp.token;
          break;
        }
      std::vector<int32_t> out;
      accepted += verify_drafts(sampler, rows.data(), V, {d}, {q}, -1, out) > 0;
      ++counts[out[0]];
    }
    const auto [stat, dof] = chi_square(counts, p, n);
    // 99.9th percentile of chi-square with <= 11 degrees of freedom is < 32.
    EXPECT_LT(stat, 32.0) << "trial " << trial << " dof " << dof;
    EXPECT_GT(accepted, 0);
    EXPECT_LT(accepted, n);
    std::printf("[spec] trial %d: chi2 %.2f (dof %d), acceptance %.3f\n", trial, stat, dof, double(accepted) / n);
  }
}

// The same through the real model: the token after a fixed pending token, sampled with
// MTP speculation (K = 2), follows the trunk's distribution at that position.
TEST(SpeculativeSampling, ModelStepFollowsTheTrunkDistribution) {
  auto m = load("tiny-b-f32");
  ASSERT_TRUE(m);
  const size_t V = size_t(m->hparams().n_vocab);
  const auto p = prompt(12, 3, int(V));
  const int32_t pending = 77;
  ThreadPool pool(1);
  SamplingParams sp;
  sp.temperature = 1.0f;
  sp.top_k = 0;
  sp.top_p = 1.0f;
  sp.min_p = 0.0f;
  // Target: the trunk's distribution after prompt + pending.
  std::vector<Sampler::TokenProb> target;
  {
    Session s(*m, 64, 64);
    std::vector<float> logits;
    auto all = p;
    all.push_back(pending);
    s.forward(all.data(), int32_t(all.size()), false, logits, pool);
    Sampler tmp(sp, V);
    tmp.distribution(logits.data(), target);
  }
  const int n = 3000;
  std::map<int32_t, int> counts;
  std::vector<float> logits;
  uint64_t drafted = 0;
  for (int i = 0; i < n; ++i) {
    // A fresh decoder each draw: the prompt, then one speculative step.
    SpeculativeDecoder dec(*m, 64, 64, Precision::Native, 2, false);
    dec.prefill(p.data(), int32_t(p.size()), logits, pool);
    sp.seed = uint64_t(1000 + i);
    Sampler sampler(sp, V);
    std::vector<int32_t> out;
    dec.step(pending, sampler, out, pool);
    ASSERT_GE(dec.n_pos(), int32_t(p.size()) + 1);
    ++counts[out[0]];
    drafted += dec.stats().drafted[1];
  }
  EXPECT_GT(drafted, 0u);
  const auto [stat, dof] = chi_square(counts, target, n);
  // Generous bound (99.99th percentile for the merged bin count seen here).
  EXPECT_LT(stat, 40.0 + 2.0 * dof) << "dof " << dof;
  std::printf("[spec] model: chi2 %.2f (dof %d)\n", stat, dof);
}

TEST(AdaptiveK, FallsBackToPlainDecodingWithoutAcceptance) {
  AdaptiveK a(3);
  int chosen_nonzero = 0;
  for (int step = 0; step < 2000; ++step) {
    const int32_t k = a.choose();
    // A K-draft pass costs 1 + 0.25 K; drafting 0.2 per draft; nothing is ever accepted.
    a.record(k, 0, 1.0 + 0.25 * k, 0.2 * k);
    if (step >= 200 && k > 0) ++chosen_nonzero;
  }
  EXPECT_LT(chosen_nonzero, 20);  // only rare exploration
}

TEST(AdaptiveK, SpeculatesWhenItPays) {
  AdaptiveK a(3);
  std::mt19937 rng(1);
  std::uniform_real_distribution<double> u(0, 1);
  int sum_k = 0;
  for (int step = 0; step < 500; ++step) {
    const int32_t k = a.choose();
    int acc = 0;
    while (acc < k && u(rng) < 0.8) ++acc;
    a.record(k, acc, 1.0 + 0.15 * k, 0.1 * k);
    if (step >= 100) sum_k += k;
  }
  EXPECT_GT(sum_k / 400.0, 1.5);
}

}  // namespace
