// Models under a memory budget (docs/memory.md): the routed experts come from an expert cache
// read from the file, and nothing a user sees changes: logits bit-identical with and without
// a budget, even one so small that every token reads its experts again; a budget below the
// minimum, and a file changed under a loaded model, are clear errors.
#include <gtest/gtest.h>
#include <httplib.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <functional>
#include <memory>
#include <stdexcept>
#include <thread>

#include "engine/sampler.h"
#include "exec/thread_pool.h"
#include "model/session.h"
#include "model/step35.h"
#include "serve_process.h"
#include "support.h"

using namespace step35;
using namespace step35::testing;

namespace {

std::unique_ptr<Model> load(const std::string& path, uint64_t budget) {
  Model::LoadOptions o;
  o.verbose = false;
  o.repack_experts = Model::LoadOptions::ExpertRepack::Never;
  o.mem_budget = budget;
  o.mem_kv_positions = 256;
  return Model::load(path, o);
}

// The smallest budget the model loads with (its expert cache then holds one MoE block's
// experts, so a pass through the blocks evicts every expert before the next token needs it).
uint64_t smallest_budget(const std::string& path) {
  uint64_t lo = 1, hi = uint64_t(1) << 40;  // lo fails, hi loads
  while (hi - lo > 1) {
    const uint64_t mid = lo + (hi - lo) / 2;
    try {
      load(path, mid);
      hi = mid;
    } catch (const std::invalid_argument&) {
      lo = mid;
    }
  }
  return hi;
}

std::vector<int32_t> prompt(int n, int seed) { return lcg_tokens(n, uint32_t(seed) * 2654435761u + 7, 500); }

// Greedy continuation: the logits of the prefill and of each decode step; `misses` (if
// given) gets the experts the cache has read after each step.
std::vector<std::vector<float>> greedy(const Model& m, const std::vector<int32_t>& p, int n_gen, int threads,
                                       std::vector<uint64_t>* misses = nullptr) {
  ThreadPool pool(threads);
  Session s(m, 256, 64, Precision::Native);
  std::vector<std::vector<float>> rows;
  std::vector<float> logits;
  s.forward(p.data(), int32_t(p.size()), false, logits, pool);
  rows.push_back(logits);
  for (int i = 0; i < n_gen; ++i) {
    const int32_t next = Sampler::argmax(logits.data(), logits.size());
    s.forward(&next, 1, false, logits, pool);
    rows.push_back(logits);
    if (misses) {  // read by the pass itself or ahead of it by the prefetcher
      const offload::ExpertCacheStats st = m.expert_cache()->stats();
      misses->push_back(st.misses + st.prefetched);
    }
  }
  return rows;
}

class Budgeted : public ::testing::TestWithParam<const char*> {};

TEST_P(Budgeted, LogitsBitIdenticalWhileEveryTokenMisses) {
  const std::string path = fixture_model(GetParam());
  const auto plain = load(path, 0);
  EXPECT_EQ(plain->expert_cache(), nullptr);
  const auto p = prompt(37, 3);
  const auto want = greedy(*plain, p, 6, 2);

  const uint64_t smallest = smallest_budget(path);
  const auto tight = load(path, smallest);
  ASSERT_NE(tight->expert_cache(), nullptr);
  int64_t most_experts = 0, n_moe = 0;
  for (int il = 0; il < tight->hparams().n_layer; ++il) {
    most_experts = std::max(most_experts, tight->layer(il).ffn_gate_exps.n_mat);
    n_moe += tight->layer(il).ffn_gate_exps.present();
  }
  ASSERT_GT(n_moe, 1) << "the test needs two MoE blocks to force misses";
  EXPECT_EQ(tight->expert_cache()->slots(), most_experts);
  std::vector<uint64_t> misses;
  for (int threads : {1, 2}) {
    misses.clear();
    EXPECT_EQ(greedy(*tight, p, 6, threads, &misses), want) << threads << " threads";
    for (size_t i = 1; i < misses.size(); ++i)
      EXPECT_GE(misses[i] - misses[i - 1], uint64_t(n_moe)) << "decode step " << i << " read no expert";
  }
  const offload::ExpertCacheStats st = tight->expert_cache()->stats();
  EXPECT_GT(st.bytes_read, 0u);
  EXPECT_GT(st.evictions, 0u);

  // Room for every expert: after the first pass only hits, and still the same logits.
  const auto roomy = load(path, uint64_t(1) << 34);
  EXPECT_EQ(greedy(*roomy, p, 6, 2), want);
  const uint64_t misses_first = roomy->expert_cache()->stats().misses;
  EXPECT_EQ(greedy(*roomy, p, 6, 2), want);
  EXPECT_EQ(roomy->expert_cache()->stats().misses, misses_first) << "a cache with room for all read again";
  EXPECT_GT(roomy->expert_cache()->stats().hits, 0u);
  EXPECT_EQ(roomy->expert_cache()->stats().evictions, 0u);
}

// Four passes at once on the smallest cache (room for one pass's block at a time): each waits
// for room instead of failing or deadlocking, and each gets its own logits.
TEST_P(Budgeted, ConcurrentPassesShareTheSmallestCache) {
  const std::string path = fixture_model(GetParam());
  const auto plain = load(path, 0);
  const std::vector<std::vector<int32_t>> prompts = {prompt(20, 5), prompt(31, 6), prompt(3, 7), prompt(12, 8)};
  std::vector<std::vector<std::vector<float>>> want;
  for (const auto& p : prompts) want.push_back(greedy(*plain, p, 5, 1));
  const auto tight = load(path, smallest_budget(path));
  std::vector<std::vector<std::vector<float>>> got(prompts.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < prompts.size(); ++i)
    threads.emplace_back([&, i] { got[i] = greedy(*tight, prompts[i], 5, 1); });
  for (auto& t : threads) t.join();
  for (size_t i = 0; i < prompts.size(); ++i) EXPECT_EQ(got[i], want[i]) << "prompt " << i;
}

// A model patch that swaps experts (hot-swap) under a budget: the same logits as the same
// patch without one, and the swapped expert's slot is given back.
TEST_P(Budgeted, ReplacedExpertsGiveTheSameLogits) {
  const std::string path = fixture_model(GetParam());
  const auto plain = load(path, 0);
  const auto tight = load(path, smallest_budget(path));
  int moe = -1;
  for (int il = 0; il < plain->hparams().n_layer && moe < 0; ++il)
    if (plain->layer(il).ffn_up_exps.present()) moe = il;
  ASSERT_GE(moe, 0);
  // Expert 0 of every matrix of one block becomes a copy of expert 1 (file bytes, from the
  // mapping of the model without a budget, which outlives both).
  std::vector<MatrixReplacement> swap;
  for (const char* name : {"ffn_gate_exps.weight", "ffn_up_exps.weight", "ffn_down_exps.weight"}) {
    const LayerWeights& W = plain->layer(moe);
    const WeightMatrix& w = std::string(name) == "ffn_gate_exps.weight" ? W.ffn_gate_exps
                            : std::string(name) == "ffn_up_exps.weight" ? W.ffn_up_exps
                                                                        : W.ffn_down_exps;
    const WeightMatrix one = w.matrix(1);
    swap.push_back({block_tensor_name(moe, name), 0, one.type, one.data, one.mat_bytes(), nullptr});
  }
  const auto p = prompt(29, 11);
  greedy(*tight, p, 2, 2);  // experts in slots before the swap
  plain->set_replacements(swap);
  tight->set_replacements(swap);
  EXPECT_EQ(greedy(*tight, p, 6, 2), greedy(*plain, p, 6, 2));
  tight->set_replacements({});
  plain->set_replacements({});
  EXPECT_EQ(greedy(*tight, p, 6, 2), greedy(*plain, p, 6, 2)) << "after restoring the file's experts";
}

INSTANTIATE_TEST_SUITE_P(Fixtures, Budgeted, ::testing::Values("tiny-a-q4_k_m.gguf", "tiny-a-f32.gguf", "tiny-k-q4_k_m.gguf"),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (char& c : n)
                             if (c == '-' || c == '.') c = '_';
                           return n;
                         });

// A file rewritten under a loaded model: the next read refuses, naming the file, instead of
// computing with other weights; so does a file cut short.
TEST(ExpertCacheFaults, FileChangedOnDiskIsAnErrorNotOtherNumbers) {
  const std::string copy = tmp_dir() + "/expert_cache_changed.gguf";
  write_bytes(copy, read_bytes(fixture_model("tiny-a-q4_k_m.gguf")));
  const auto m = load(copy, smallest_budget(copy));
  const auto p = prompt(9, 1);
  greedy(*m, p, 2, 1);
  {
    std::ofstream grow(copy, std::ios::app | std::ios::binary);
    grow << "x";
  }
  try {
    greedy(*m, p, 2, 1);
    FAIL() << "a pass read experts from a changed file";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("changed on disk"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(copy), std::string::npos) << e.what();
  }
}

TEST(ExpertCacheFaults, BudgetBelowTheMinimumNamesIt) {
  try {
    load(fixture_model("tiny-a-q4_k_m.gguf"), 1024);
    FAIL() << "a 1 KiB budget loaded";
  } catch (const std::invalid_argument& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("--mem-budget"), std::string::npos) << what;
    EXPECT_NE(what.find("minimum of"), std::string::npos) << what;
    EXPECT_NE(what.find("dense weights"), std::string::npos) << what;
  }
}

// make-tiny --hot-experts: each MoE block's selection bias is -H * ln(1 + rank) over a seeded
// order of its experts (a different order per block), the same file every time, and a cache
// holding a quarter of the experts hits far more often than with the near-even router.
TEST(ExpertCacheCli, MakeTinyHotExpertsSkewsTheRouter) {
  const std::string hot = tmp_dir() + "/hot_experts.gguf", again = tmp_dir() + "/hot_experts_again.gguf";
  for (const std::string& out : {hot, again})
    ASSERT_EQ(run_command(step35_binary() + " make-tiny --hot-experts 0.2 --name hot --out " + out), 0);
  EXPECT_TRUE(read_bytes(hot) == read_bytes(again)) << "not deterministic";
  const auto m = load(hot, 0);
  std::vector<std::vector<float>> orders;
  for (int il = 0; il < m->hparams().n_layer; ++il) {
    std::vector<float> b = m->layer(il).exp_probs_b;
    if (b.empty()) continue;
    orders.push_back(b);
    std::sort(b.begin(), b.end(), std::greater<float>());
    for (size_t r = 0; r < b.size(); ++r) EXPECT_FLOAT_EQ(b[r], float(-0.2 * std::log1p(double(r)))) << il << " " << r;
  }
  ASSERT_GE(orders.size(), 2u);
  EXPECT_NE(orders[0], orders[1]) << "every block ranks its experts the same way";
  std::string err;
  EXPECT_EQ(run_command(step35_binary() + " make-tiny --hot-experts -1 --out " + again, nullptr, &err), 2);
}

// Through the CLI: the same greedy text with a budget that forces misses as without one; a
// budget that is too small or not a size is a usage error (exit 2) saying why.
TEST(ExpertCacheCli, RunAnswersTheSameUnderABudget) {
  const std::string model = fixture_model("tiny-a-q4_k_m.gguf");
  const std::string smallest = std::to_string(smallest_budget(model));
  const std::string run = step35_binary() + " run -m " + model + " -p 'one two three' -n 12 --temp 0 -t 2 -c 256";
  std::string plain, budgeted, err;
  ASSERT_EQ(run_command(run, &plain, &err), 0) << err;
  ASSERT_EQ(run_command(run + " --mem-budget " + smallest, &budgeted, &err), 0) << err;
  EXPECT_EQ(budgeted, plain);
  EXPECT_NE(err.find("expert cache:"), std::string::npos) << err;
  EXPECT_EQ(run_command(run + " --mem-budget 1K", nullptr, &err), 2);
  EXPECT_NE(err.find("minimum of"), std::string::npos) << err;
  EXPECT_EQ(run_command(run + " --mem-budget lots", nullptr, &err), 2);
  EXPECT_NE(err.find("200M"), std::string::npos) << err;
}

// bench --json reports the cache per test.
TEST(ExpertCacheCli, BenchJsonReportsTheCache) {
  const std::string model = fixture_model("tiny-a-q4_k_m.gguf");
  std::string out, err;
  ASSERT_EQ(run_command(step35_binary() + " bench -m " + model + " -p 16 -n 8 -r 1 -t 1 --json --mem-budget " +
                            std::to_string(smallest_budget(model)),
                        &out, &err),
            0)
      << err;
  const nlohmann::json j = nlohmann::json::parse(out);
  for (const char* test : {"pp16", "tg8"}) {
    const nlohmann::json& c = j["tests"][test]["expert_cache"];
    ASSERT_TRUE(c.is_object()) << j.dump();
    EXPECT_GT(c["bytes_read_per_token"].get<double>(), 0) << test;
    EXPECT_GT(c["read_bytes_per_s"].get<double>(), 0) << test;
    EXPECT_GE(c["hit_rate"].get<double>(), 0) << test;
    EXPECT_LT(c["hit_rate"].get<double>(), 1) << test;
  }
}

// The server under a budget: answers as without one, reports the cache on /metrics, and a
// model file changed under it fails the request that needed a read (500 naming the file)
// while the server stays up and answers /health.
TEST(ExpertCacheServe, ServesUnderABudgetAndFailsOnlyTheRequestOnAChangedFile) {
  const std::string copy = tmp_dir() + "/expert_cache_serve.gguf";
  write_bytes(copy, read_bytes(fixture_model("tiny-a-q4_k_m.gguf")));
  const nlohmann::json body = {{"prompt", "one two three"}, {"max_tokens", 8}, {"temperature", 0}};
  std::string want;
  {
    ServeProcess plain({"-m", copy, "-t", "1"}, "expert_cache_plain");
    httplib::Client c("127.0.0.1", plain.port());
    const auto r = c.Post("/v1/completions", body.dump(), "application/json");
    ASSERT_TRUE(r && r->status == 200) << (r ? r->body : "no answer");
    want = nlohmann::json::parse(r->body)["choices"][0]["text"];
  }
  // One sequence of 256 positions: the KV room load() keeps, so the smallest budget is the
  // same and the cache holds one block's experts (every pass reads).
  ServeProcess s({"-m", copy, "-t", "1", "--parallel", "1", "-c", "256", "--mem-budget",
                  std::to_string(smallest_budget(copy))},
                 "expert_cache_serve");
  httplib::Client c("127.0.0.1", s.port());
  c.set_read_timeout(60, 0);
  auto r = c.Post("/v1/completions", body.dump(), "application/json");
  ASSERT_TRUE(r && r->status == 200) << (r ? r->body : "no answer");
  EXPECT_EQ(nlohmann::json::parse(r->body)["choices"][0]["text"], want);
  const auto m = c.Get("/metrics");
  ASSERT_TRUE(m);
  for (const char* name : {"step35_expert_cache_slots ", "step35_expert_cache_misses_total ",
                           "step35_expert_cache_read_bytes_total ", "step35_expert_cache_hit_rate "})
    EXPECT_NE(m->body.find(name), std::string::npos) << name;
  EXPECT_EQ(m->body.find("step35_expert_cache_misses_total 0\n"), std::string::npos) << "no expert was read";
  {
    std::ofstream grow(copy, std::ios::app | std::ios::binary);
    grow << "x";
  }
  // A prompt the prefix cache cannot answer, so the pass routes to experts again.
  const nlohmann::json other = {{"prompt", "seven eight nine ten eleven"}, {"max_tokens", 8}, {"temperature", 0}};
  bool failed = false;
  for (int i = 0; i < 4 && !failed; ++i) {  // a pass whose experts were all in memory reads nothing
    r = c.Post("/v1/completions", other.dump(), "application/json");
    ASSERT_TRUE(r) << "no answer";
    if (r->status != 200) {
      failed = true;
      EXPECT_EQ(r->status, 500) << r->body;
      EXPECT_NE(r->body.find("changed on disk"), std::string::npos) << r->body;
    }
  }
  EXPECT_TRUE(failed) << "requests kept computing from a changed file";
  const auto h = c.Get("/health");
  ASSERT_TRUE(h);
  EXPECT_TRUE(s.alive());
  EXPECT_EQ(s.terminate(), 0);
}

}  // namespace
