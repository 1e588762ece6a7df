// Batching never changes results: a sequence's logits are bitwise the same whether it runs
// alone or in one forward pass with other sequences, whatever the chunking and thread count.
#include <gtest/gtest.h>

#include <memory>
#include <thread>

#include "model/session.h"
#include "model/step35.h"
#include "model/workspace.h"
#include "engine/sampler.h"
#include "exec/thread_pool.h"
#include "tensor/kernels.h"
#include "support.h"

using namespace step35;
using namespace step35::testing;

namespace {

struct Loaded {
  std::unique_ptr<Model> model;
};

const Model& tiny_a() {
  static Loaded l;
  if (!l.model) {
    Model::LoadOptions o;
    o.verbose = false;
    l.model = Model::load(fixture_model("tiny-a-q4_k_m.gguf"), o);
  }
  return *l.model;
}

std::vector<int32_t> prompt(int n, int seed) { return lcg_tokens(n, uint32_t(seed) * 2654435761u + 1, 500); }

// Greedy continuation of one sequence alone (prefill in one chunk, then one token a step).
std::vector<std::vector<float>> run_alone(const Model& m, const std::vector<int32_t>& p, int n_gen, int threads,
                                          Precision prec, int32_t batch) {
  ThreadPool pool(threads);
  Session s(m, 256, batch, prec);
  std::vector<std::vector<float>> rows;
  std::vector<float> logits;
  s.forward(p.data(), int32_t(p.size()), false, logits, pool);
  rows.push_back(logits);
  for (int i = 0; i < n_gen; ++i) {
    const int32_t next = Sampler::argmax(logits.data(), logits.size());
    s.forward(&next, 1, false, logits, pool);
    rows.push_back(logits);
  }
  return rows;
}

class Batching : public ::testing::TestWithParam<Precision> {};

TEST_P(Batching, SequenceResultsDoNotDependOnCompany) {
  const Model& m = tiny_a();
  const Precision prec = GetParam();
  const int V = m.hparams().n_vocab, n_gen = 12;
  // Three sequences of different lengths (one longer than the 16-token window).
  const std::vector<std::vector<int32_t>> prompts = {prompt(5, 1), prompt(37, 2), prompt(20, 3)};
  std::vector<std::vector<std::vector<float>>> alone;
  for (const auto& p : prompts) alone.push_back(run_alone(m, p, n_gen, 1, prec, 512));

  // All three together in one pool: prefills in one batch, then decode steps together,
  // with the third sequence joining one step late.
  for (int threads : {1, 2}) {
    ThreadPool pool(threads);
    const auto layers = m.kv_layers();
    KvPool kv(layers, m.hparams().swa_window, KvPool::kDefaultBlockSize, 64, 64);
    Workspace ws;
    ForwardOptions opts;
    opts.precision = prec;
    std::vector<KvSeq> seqs(3);
    std::vector<std::vector<int32_t>> next(3);
    std::vector<int> steps(3, 0);
    BatchOutput out;
    for (int round = 0; round <= n_gen + 1; ++round) {
      std::vector<SeqChunk> chunks;
      std::vector<int> which;
      for (int s = 0; s < 3; ++s) {
        if (s == 2 && round == 0) continue;  // joins late
        if (steps[size_t(s)] > n_gen) continue;
        SeqChunk c;
        c.seq = &seqs[size_t(s)];
        if (steps[size_t(s)] == 0) {
          c.tokens = prompts[size_t(s)].data();
          c.n_tokens = int32_t(prompts[size_t(s)].size());
        } else {
          c.tokens = next[size_t(s)].data();
          c.n_tokens = 1;
        }
        chunks.push_back(c);
        which.push_back(s);
      }
      if (chunks.empty()) break;
      m.forward(kv, chunks, out, ws, pool, opts);
      for (size_t c = 0; c < chunks.size(); ++c) {
        const int s = which[c];
        const float* row = out.logits.data() + size_t(out.logits_offset[c]) * size_t(V);
        const auto& ref = alone[size_t(s)][size_t(steps[size_t(s)])];
        ASSERT_EQ(0, std::memcmp(row, ref.data(), size_t(V) * sizeof(float)))
            << "sequence " << s << " step " << steps[size_t(s)] << " threads " << threads;
        next[size_t(s)] = {Sampler::argmax(row, size_t(V))};
        ++steps[size_t(s)];
      }
    }
    for (auto& s : seqs) kv.free_seq(s);
    EXPECT_EQ(kv.n_free(KvKind::Full), 64);
    EXPECT_EQ(kv.n_free(KvKind::Swa), 64);
  }
}

TEST_P(Batching, ChunkedPrefillEqualsOneBatch) {
  const Model& m = tiny_a();
  const auto p = prompt(70, 9);
  const auto whole = run_alone(m, p, 4, 2, GetParam(), 512);
  const auto chunked = run_alone(m, p, 4, 2, GetParam(), 7);
  ASSERT_EQ(whole.size(), chunked.size());
  for (size_t i = 0; i < whole.size(); ++i) EXPECT_EQ(whole[i], chunked[i]) << "step " << i;
}

// Routed experts repacked when first routed to (the default where the file fits in memory)
// give the same logits as the GGUF rows, during the pass that repacks them and after; two
// passes on two threads may meet the same unrepacked experts at once.
TEST(RepackOnFirstUse, ExpertsAreRepackedWhenRoutedToAndResultsDoNotChange) {
  if (!kernels::has_repacked(DType::Q4_K)) GTEST_SKIP() << "no repacked kernels on this CPU";
  auto load = [](Model::LoadOptions::ExpertRepack mode) {
    Model::LoadOptions o;
    o.verbose = false;
    o.repack_experts = mode;
    return Model::load(fixture_model("tiny-k-q4_k_m.gguf"), o);
  };
  const auto never = load(Model::LoadOptions::ExpertRepack::Never);
  EXPECT_EQ(never->lazy_repack_bytes(), 0u);
  const std::vector<std::vector<int32_t>> prompts = {prompt(9, 21), prompt(40, 22)};
  std::vector<std::vector<std::vector<float>>> ref;
  for (const auto& p : prompts) ref.push_back(run_alone(*never, p, 6, 2, Precision::Native, 512));

  const auto lazy = load(Model::LoadOptions::ExpertRepack::OnFirstUse);
  ASSERT_GT(lazy->lazy_repack_bytes(), 0u);
  EXPECT_EQ(lazy->lazy_repacked_so_far(), 0u) << "nothing is repacked before a pass routes to it";
  EXPECT_EQ(run_alone(*lazy, prompts[0], 6, 2, Precision::Native, 512), ref[0]) << "the pass that repacks";
  const uint64_t after_first = lazy->lazy_repacked_so_far();
  EXPECT_GT(after_first, 0u);
  EXPECT_LE(after_first, lazy->lazy_repack_bytes());
  EXPECT_EQ(run_alone(*lazy, prompts[0], 6, 2, Precision::Native, 512), ref[0]) << "from the copies";
  EXPECT_EQ(lazy->lazy_repacked_so_far(), after_first) << "the same experts are not repacked twice";

  // Two threads, each with its own pool, on a model none of whose experts are repacked.
  const auto shared = load(Model::LoadOptions::ExpertRepack::OnFirstUse);
  std::vector<std::vector<std::vector<float>>> got(prompts.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < prompts.size(); ++i)
    threads.emplace_back([&, i] { got[i] = run_alone(*shared, prompts[i], 6, 2, Precision::Native, 512); });
  for (auto& t : threads) t.join();
  for (size_t i = 0; i < prompts.size(); ++i) EXPECT_EQ(got[i], ref[i]) << "prompt " << i;

  // All the rest at once (what `bench` does before timing): every byte, the same logits.
  ThreadPool pool{2};
  lazy->prepare_all_experts(pool);
  EXPECT_EQ(lazy->lazy_repacked_so_far(), lazy->lazy_repack_bytes());
  EXPECT_EQ(run_alone(*lazy, prompts[1], 6, 2, Precision::Native, 512), ref[1]) << "after prepare_all_experts";
  lazy->prepare_all_experts(pool);
  EXPECT_EQ(lazy->lazy_repacked_so_far(), lazy->lazy_repack_bytes()) << "nothing is repacked twice";
}

INSTANTIATE_TEST_SUITE_P(Precisions, Batching, ::testing::Values(Precision::Native, Precision::Exact),
                         [](const auto& info) { return info.param == Precision::Native ? "native" : "exact"; });

}  // namespace
