// MTP speculative decoding: greedy output with --mtp 1|2|3 equals plain decoding token for
// token (prompts shorter and longer than the sliding window, one reused MTP block and three
// chained ones); speculative sampling leaves the target distribution unchanged
// (chi-square); adaptive K falls back to plain decoding when drafts are never accepted.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <random>

#include <condition_variable>
#include <mutex>

#include "engine/engine.h"
#include "engine/generator.h"
#include "engine/sampler.h"
#include "engine/speculative.h"
#include "exec/thread_pool.h"
#include "model/session.h"
#include "model/step35.h"
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
  const std::vector<int32_t> rest = lcg_tokens(n - 1, uint32_t(seed) * 2654435761u + 11, vocab - 10);
  p.insert(p.end(), rest.begin(), rest.end());
  return p;
}

// Greedy decoding with k drafts per step. With `oracle` (the plain greedy continuation),
// drafts are replaced by the true next tokens except at about 2 positions in 7, so that
// verification accepts some drafts and rejects others.
std::vector<int32_t> decode(const Model& m, const std::vector<int32_t>& p, int n_gen, int k,
                            SpeculationStats* stats = nullptr, const std::vector<int32_t>* oracle = nullptr) {
  ThreadPool pool(2);
  GeneratorOptions go;
  go.n_ctx = 512;
  go.n_batch = 64;
  go.mtp = k;
  Generator gen(m, go);
  if (oracle) {
    const int32_t n_prompt = int32_t(p.size());
    gen.speculation()->drafter().draft_override = [&, n_prompt](int32_t n_pos, int32_t kk, int32_t d) {
      const int32_t pos = n_pos + kk + 1;  // the position this draft is for
      const size_t i = size_t(pos - n_prompt);
      if (i >= oracle->size() || (uint32_t(pos) * 2654435761u) % 7 < 2) return d == 5 ? 6 : 5;  // a wrong guess
      return (*oracle)[i];
    };
  }
  SequenceParams params;
  params.prompt = p;
  params.sampling.temperature = 0;
  params.stop_at_eog = false;
  params.max_tokens = n_gen;
  std::vector<int32_t> out;
  gen.start(std::move(params), [&](const GenerateEvent& ev) {
    out.push_back(ev.token);
    return SinkReply::Continue;
  });
  EXPECT_EQ(gen.run(pool), FinishReason::Length);
  if (stats) *stats = gen.sequence().speculation_stats();
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
      if (k >= 2) {
        EXPECT_GT(so.accepted[2], 0u);
      }
      std::printf("[mtp] %s prompt %d k=%d: %.2f tokens/step, acceptance %.2f %.2f %.2f\n", GetParam().c_str(), len, k,
                  st.mean_tokens_per_step(), st.acceptance(1), st.acceptance(2), st.acceptance(3));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, GreedyMtp,
                         ::testing::Values("tiny-a-f32", "tiny-a-f16", "tiny-a-q8_0", "tiny-a-q4_k_m", "tiny-b-f32"),
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
  uint64_t drafted = 0;
  GeneratorOptions go;
  go.n_ctx = 64;
  go.n_batch = 64;
  go.mtp = 2;
  Generator gen(*m, go);
  for (int i = 0; i < n; ++i) {
    // A fresh sequence each draw: the prompt, then the pending token in one speculative step.
    SequenceParams params;
    params.prompt = p;
    params.prompt.push_back(pending);
    params.last_prompt_token_pending = true;
    params.sampling = sp;
    params.sampling.seed = uint64_t(1000 + i);
    params.stop_at_eog = false;
    int32_t first = -1;
    gen.start(std::move(params), [&first](const GenerateEvent& ev) {
      first = ev.token;
      return SinkReply::Cancel;
    });
    ASSERT_EQ(gen.run(pool), FinishReason::Cancelled);
    ASSERT_GE(gen.sequence().n_pos(), int32_t(p.size()) + 1);
    ++counts[first];
    drafted += gen.sequence().speculation_stats().drafted[1];
  }
  EXPECT_GT(drafted, 0u);
  const auto [stat, dof] = chi_square(counts, target, n);
  // Generous bound (99.99th percentile for the merged bin count seen here).
  EXPECT_LT(stat, 40.0 + 2.0 * dof) << "dof " << dof;
  std::printf("[spec] model: chi2 %.2f (dof %d)\n", stat, dof);
}

// The speculation protocol lives in Sequence alone: a sequence stepped by Generator (run,
// bench, eval) and the same request through the serving engine beside another one give
// the same tokens, with seeded sampling and K = 2 (draws for drafting and for rejection
// sampling come from the same RNG stream in the same order) and greedily with K = 3.
TEST(Speculation, GeneratorAndServingEngineAgree) {
  auto m = load("tiny-b-f32");
  ASSERT_TRUE(m);
  const auto p = prompt(21, 4, m->hparams().n_vocab);
  for (const auto& [k, temperature] : {std::pair{2, 0.9f}, std::pair{3, 0.0f}}) {
    SamplingParams sp;
    sp.temperature = temperature;
    sp.seed = 99;
    const int n = 30;
    // Generator.
    ThreadPool pool(2);
    GeneratorOptions go;
    go.n_ctx = 256;
    go.n_batch = 64;
    go.mtp = k;
    Generator gen(*m, go);
    SequenceParams params;
    params.prompt = p;
    params.sampling = sp;
    params.max_tokens = n;
    std::vector<int32_t> alone;
    gen.start(std::move(params), [&](const GenerateEvent& ev) {
      alone.push_back(ev.token);
      return SinkReply::Continue;
    });
    gen.run(pool);
    ASSERT_GT(gen.sequence().speculation_stats().steps, 0u);
    // The engine, with a second request in the same passes.
    EngineOptions eo;
    eo.n_threads = 2;
    eo.n_ctx = 256;
    eo.n_batch = 64;
    eo.mtp = k;
    eo.mtp_adaptive = false;
    auto engine = make_engine(*m, eo);
    std::mutex mu;
    std::condition_variable cv;
    std::vector<int32_t> served;
    int finished = 0;
    for (int i = 0; i < 2; ++i) {
      GenerateRequest r;
      r.prompt = i == 0 ? p : prompt(9, 8, m->hparams().n_vocab);
      r.sampling = sp;
      r.max_tokens = n;
      engine->submit(std::move(r), [&, i](const GenerateEvent& ev) {
        std::lock_guard<std::mutex> lock(mu);
        if (ev.done) {
          ++finished;
          cv.notify_all();
        } else if (i == 0) {
          served.push_back(ev.token);
        }
        return SinkReply::Continue;
      });
    }
    std::unique_lock<std::mutex> lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(120), [&] { return finished == 2; }));
    EXPECT_EQ(served, alone) << "K = " << k << ", temperature " << temperature;
    EXPECT_GT(engine->stats().mtp_steps, 0u);
  }
}

// Costs in units of one decode step: a (K+1)-token pass costs 1 + verify_slope K, each
// draft draft_cost.
struct FakeCosts {
  double verify_slope, draft_cost;
  double trunk(int32_t k) const { return 1.0 + verify_slope * k; }
};

TEST(AdaptiveK, ZeroAcceptanceMeansNearlyAllStepsArePlain) {
  AdaptiveK a(3);
  const FakeCosts c{0.5, 0.2};  // about what the benchmark model measures today
  int speculative = 0;
  std::vector<int> probe_steps;
  for (int step = 0; step < 4000; ++step) {
    const int32_t k = a.choose();
    if (a.last_was_probe()) probe_steps.push_back(step);
    a.record(k, 0, c.trunk(k), c.draft_cost * k);
    speculative += k > 0;
  }
  // Only probes speculate, with one draft each, and they get rarer: +32, +64, +128, ...
  // The first waits until two decode steps (its assumed cost) fit the probe budget.
  EXPECT_EQ(uint64_t(speculative), a.probes());
  EXPECT_LE(speculative, 8);
  EXPECT_EQ(a.paying_probes(), 0u);
  ASSERT_GE(probe_steps.size(), 5u);
  EXPECT_EQ(probe_steps[0], int(std::lround(2.0 / AdaptiveK::kProbeBudget)));
  for (size_t i = 1; i < probe_steps.size(); ++i) {
    const int gap = probe_steps[i] - probe_steps[i - 1];
    EXPECT_EQ(gap, std::min<int>(int(AdaptiveK::kFirstProbeGap) << (i - 1), int(AdaptiveK::kMaxProbeGap))) << i;
  }
  EXPECT_EQ(a.best_k(), 0);
  EXPECT_LT(a.acceptance(1), 0.2);
}

TEST(AdaptiveK, ProbesStayWithinTheirBudgetWhenCatchUpIsDear) {
  AdaptiveK a(3);
  int speculative = 0;
  for (int step = 0; step < 20000; ++step) {
    const int32_t k = a.choose();
    // Each probe's drafting is mostly catch-up and costs six decode steps.
    a.record(k, 0, 1.0 + 0.5 * k, 6.0 * k, /*catch_up=*/k > 0 ? 4 : 0);
    speculative += k > 0;
  }
  EXPECT_GT(speculative, 0);
  EXPECT_NEAR(a.probe_overhead_s(), 6.5 * speculative, 1e-6);
  EXPECT_LE(a.probe_overhead_s(), AdaptiveK::kProbeBudget * a.elapsed_s());
  EXPECT_EQ(a.best_k(), 0);
}

TEST(AdaptiveK, SpeculatesWhenItPays) {
  AdaptiveK a(3);
  std::mt19937 rng(1);
  std::uniform_real_distribution<double> u(0, 1);
  const FakeCosts c{0.15, 0.1};  // cheap verification: K = 3 pays most at 0.8 acceptance
  int sum_k = 0;
  for (int step = 0; step < 500; ++step) {
    const int32_t k = a.choose();
    int acc = 0;
    while (acc < k && u(rng) < 0.8) ++acc;
    a.record(k, acc, c.trunk(k), c.draft_cost * k);
    if (step >= 100) sum_k += k;
  }
  EXPECT_GT(sum_k / 400.0, 2.0);
  EXPECT_GE(a.best_k(), 2);
  EXPECT_NEAR(a.acceptance(1), 0.8, 0.2);
  for (int32_t k = 0; k <= 3; ++k) EXPECT_NEAR(a.verify_cost(k), c.trunk(k), 1e-9) << k;
  EXPECT_NEAR(a.draft_cost(), 0.1, 1e-9);
}

TEST(AdaptiveK, StaysPlainWhenVerificationIsTooDearEvenWithHighAcceptance) {
  AdaptiveK a(3);
  const FakeCosts c{1.0, 0.3};  // every extra token costs a full step: never pays
  int speculative = 0;
  for (int step = 0; step < 2000; ++step) {
    const int32_t k = a.choose();
    a.record(k, k, c.trunk(k), c.draft_cost * k);  // every draft accepted
    speculative += k > 0;
  }
  EXPECT_EQ(a.best_k(), 0);
  EXPECT_EQ(uint64_t(speculative), a.probes());
  EXPECT_LE(speculative, 10);
}

TEST(AdaptiveK, BackoffGrowsWhileProbesFailAndResetsOnAPayingProbe) {
  AdaptiveK a(3);
  const FakeCosts c{0.3, 0.1};
  bool accepting = false;
  uint64_t gap_before = 0;
  int first_speculative_after_switch = -1;
  for (int step = 0; step < 3000; ++step) {
    if (step == 1000) {
      accepting = true;  // the text became predictable
      gap_before = a.probe_gap();
    }
    const int32_t k = a.choose();
    a.record(k, accepting ? k : 0, c.trunk(k), c.draft_cost * k);
    if (accepting && k > 0 && first_speculative_after_switch < 0) first_speculative_after_switch = step;
  }
  EXPECT_GE(gap_before, 256u);  // backed off while nothing was accepted
  ASSERT_GE(first_speculative_after_switch, 1000);
  EXPECT_LE(first_speculative_after_switch, 1000 + int(gap_before));
  EXPECT_GE(a.paying_probes(), 1u);
  EXPECT_EQ(a.probe_gap(), AdaptiveK::kFirstProbeGap);
  EXPECT_GT(a.best_k(), 0);
}

TEST(AdaptiveK, CostModelIsMonotoneAndIgnoresCatchUpInDraftCost) {
  AdaptiveK a(3);
  EXPECT_EQ(a.choose(), 0);
  a.record(0, 0, 1.0, 0);
  // A probe whose drafting was mostly catch-up work, then in-step drafting.
  a.record_cost(1, 1.6, 5.0, /*catch_up=*/4);
  EXPECT_NEAR(a.draft_cost(), 1.0, 1e-9);  // shared over the 5 positions, while nothing better is known
  a.record_cost(1, 1.6, 0.2, 0);
  a.record_cost(1, 1.6, 4.0, 12);
  EXPECT_NEAR(a.draft_cost(), 0.2, 1e-9);
  // Unmeasured K extrapolate from c_0 and c_1; a noisy c_2 below c_1 does not make the
  // model prefer it.
  EXPECT_NEAR(a.verify_cost(3), 1.0 + 3 * 0.6, 1e-9);
  a.record_cost(2, 1.2, 0.4, false);
  for (int32_t k = 1; k <= 3; ++k) EXPECT_GE(a.verify_cost(k), a.verify_cost(k - 1)) << k;
  EXPECT_NEAR(a.verify_cost(2), 1.6, 1e-9);
}

}  // namespace
