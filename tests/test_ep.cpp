// Expert parallelism (src/parallel, docs/distributed.md): placement files, the ep-plan
// balancer, and `mpirun -np R step35 ... --ep` against the single-process engine on every
// fixture model. The MPI tests skip (with the reason) where the build has no MPI or
// mpirun is missing; every mpirun runs under `timeout` so a hung job fails instead.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <stdexcept>

#include "parallel/expert_placement.h"
#include "support.h"

using namespace step35;
using namespace step35::testing;

namespace {

std::string bin() { return step35_binary(); }

ExpertCounts counts_8(std::vector<int64_t> c) {
  ExpertCounts ec;
  ec.n_expert = int32_t(c.size());
  ec.layers[2] = std::move(c);
  return ec;
}

}  // namespace

TEST(EpPlacement, ContiguousDefault) {
  ExpertPlacement p(4, 16);
  for (int32_t e = 0; e < 16; ++e) EXPECT_EQ(p.owner(3, e), e / 4) << e;
  ExpertPlacement q(3, 8);  // e*R/X: 0,0,0,1,1,1,2,2
  const int32_t want[8] = {0, 0, 0, 1, 1, 1, 2, 2};
  for (int32_t e = 0; e < 8; ++e) EXPECT_EQ(q.owner(0, e), want[e]);
}

TEST(EpPlacement, RoundTrip) {
  ExpertPlacement p(2, 4);
  p.set_layer(2, {1, 0, 0, 1});
  p.set_layer(7, {0, 1, 1, 0});
  const ExpertPlacement q = ExpertPlacement::from_json(p.to_json());
  EXPECT_EQ(q.n_ranks(), 2);
  EXPECT_EQ(q.n_expert(), 4);
  EXPECT_EQ(q.layers(), p.layers());
  EXPECT_EQ(q.owner(2, 0), 1);
  EXPECT_EQ(q.owner(5, 0), 0);  // unlisted block: contiguous
  EXPECT_EQ(q.owner(5, 3), 1);
  // Through a file, as --ep-placement reads it.
  const std::string path = tmp_dir() + "/ep_placement_roundtrip.json";
  write_text_file(path, p.to_json());
  EXPECT_EQ(ExpertPlacement::from_json(read_text_file(path)).layers(), p.layers());
}

TEST(EpPlacement, RejectsMalformed) {
  for (const char* bad : {"", "[]", "{\"n_ranks\":2}", "{\"n_ranks\":0,\"n_expert\":4,\"layers\":{}}",
                          "{\"n_ranks\":2,\"n_expert\":4,\"layers\":{\"x\":[0,0,1,1]}}",
                          "{\"n_ranks\":2,\"n_expert\":4,\"layers\":{\"2\":[0,0,1]}}",
                          "{\"n_ranks\":2,\"n_expert\":4,\"layers\":{\"2\":[0,0,1,2]}}",
                          "{\"n_ranks\":2,\"n_expert\":4,\"layers\":{\"2\":[0,0,1,-1]}}",
                          "{\"n_ranks\":2,\"n_expert\":4,\"layers\":{\"2\":[0,0,1,\"a\"]}}"})
    EXPECT_THROW(ExpertPlacement::from_json(bad), std::runtime_error) << bad;
  EXPECT_THROW(ExpertCounts::from_json("{\"n_expert\":2,\"layers\":{\"1\":[1,-3]}}"), std::runtime_error);
  EXPECT_THROW(ExpertCounts::from_json("{\"n_expert\":2,\"layers\":{\"1\":[1]}}"), std::runtime_error);
}

TEST(EpPlan, SpreadsTheMostUsedExperts) {
  const ExpertCounts c = counts_8({100, 90, 5, 4, 3, 2, 1, 1});
  const ExpertPlacement contiguous(2, 8), plan = plan_placement(c, 2);
  const auto before = rank_loads(contiguous, 2, c.layers.at(2));
  const auto after = rank_loads(plan, 2, c.layers.at(2));
  EXPECT_EQ(before, (std::vector<int64_t>{199, 7}));
  EXPECT_NE(plan.owner(2, 0), plan.owner(2, 1));  // the two hot experts apart
  EXPECT_LT(imbalance(after), imbalance(before));
  EXPECT_LT(imbalance(after), 1.06);
  // Every rank keeps an equal share of experts (memory).
  int held[2] = {0, 0};
  for (int32_t e = 0; e < 8; ++e) ++held[plan.owner(2, e)];
  EXPECT_EQ(held[0], 4);
  EXPECT_EQ(held[1], 4);
  EXPECT_DOUBLE_EQ(imbalance({5, 5}), 1.0);
  EXPECT_DOUBLE_EQ(imbalance({10, 0}), 2.0);
}

TEST(EpPlan, CountsRoundTripAndCli) {
  ExpertCounts c;
  const int32_t a[4] = {3, 0, 9, 1}, b[4] = {1, 1, 1, 1};
  c.add(2, a, 4);
  c.add(2, b, 4);
  c.add(3, b, 4);
  const ExpertCounts d = ExpertCounts::from_json(c.to_json());
  EXPECT_EQ(d.layers.at(2), (std::vector<int64_t>{4, 1, 10, 2}));
  EXPECT_EQ(d.layers.at(3), (std::vector<int64_t>{1, 1, 1, 1}));
  const std::string counts = tmp_dir() + "/ep_counts.json", out = tmp_dir() + "/ep_plan.json";
  write_text_file(counts, c.to_json());
  std::string so, se;
  ASSERT_EQ(run_command(bin() + " ep-plan --counts " + counts + " -n 2 -o " + out, &so, &se), 0) << se;
  EXPECT_NE(so.find("mean"), std::string::npos) << so;
  const ExpertPlacement p = ExpertPlacement::from_json(read_text_file(out));
  EXPECT_EQ(p.n_ranks(), 2);
  EXPECT_NE(p.owner(2, 2), p.owner(2, 0));  // 10 and 4 apart
  EXPECT_EQ(run_command(bin() + " ep-plan --counts " + counts + " -n 9 -o " + out, nullptr, &se), 2);
  EXPECT_EQ(run_command(bin() + " ep-plan --counts /nonexistent -n 2 -o " + out, nullptr, &se), 1);
}

TEST(EpCli, OptionErrors) {
  std::string se;
  const std::string m = " -m " + fixture_model("tiny-a-f32.gguf") + " --tokens 1,2";
  EXPECT_EQ(run_command(bin() + " eval" + m + " --ep-placement /nonexistent", nullptr, &se), 2);
  EXPECT_NE(se.find("--ep-placement needs --ep"), std::string::npos) << se;
  // --record-experts works without --ep too.
  const std::string counts = tmp_dir() + "/ep_cli_counts.json";
  ASSERT_EQ(run_command(bin() + " eval" + m + " --record-experts " + counts, nullptr, &se), 0) << se;
  EXPECT_EQ(ExpertCounts::from_json(read_text_file(counts)).n_expert, 16);
}

#ifndef STEP35_HAVE_MPI

TEST(EpMpi, BuiltWithout) {
  std::string se;
  EXPECT_EQ(run_command(bin() + " eval -m " + fixture_model("tiny-a-f32.gguf") + " --tokens 1,2 --ep", nullptr, &se), 2);
  EXPECT_NE(se.find("built without MPI"), std::string::npos) << se;
  GTEST_SKIP() << "built without MPI: the mpirun tests are skipped (install libopenmpi-dev, reconfigure)";
}

#else

namespace {

bool have_mpirun(std::string* why) {
  if (run_command("command -v mpirun > /dev/null") != 0) {
    *why = "mpirun not found (apt-get install openmpi-bin)";
    return false;
  }
  return true;
}

// mpirun for R ranks on this machine: root allowed, more ranks than cores allowed, ranks
// yielding while they wait (2-core machines), shared memory without kernel single-copy.
// In sanitizer builds the leak check is off for these runs: OpenMPI keeps allocations
// past MPI_Finalize by design (the other tests keep checking the engine for leaks).
std::string mpirun(int n_ranks) {
  return "ASAN_OPTIONS=detect_leaks=0 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 "
         "OMPI_MCA_rmaps_base_oversubscribe=1 "
         "timeout 300 mpirun --oversubscribe -np " + std::to_string(n_ranks) +
         " --mca mpi_yield_when_idle 1 --mca btl_vader_single_copy_mechanism none " + bin();
}

std::vector<std::string> fixture_models() {
  std::vector<std::string> out;
  for (const auto& f : std::filesystem::directory_iterator(fixtures_dir() + "/models"))
    if (f.path().extension() == ".gguf") out.push_back(f.path().string());
  std::sort(out.begin(), out.end());
  return out;
}

const char* kTokens = "0,17,250,3,99,5,60,7,300,9,10,211,12,133,14,15,16,101,18,19";

}  // namespace

// eval --ep prints the same JSON (every position's logits, greedy continuation through the
// KV cache) as the single-process eval, bit for bit, on every fixture with 2 and 4 ranks.
TEST(EpMpi, EvalMatchesSingleProcess) {
  std::string why;
  if (!have_mpirun(&why)) GTEST_SKIP() << why;
  for (const std::string& model : fixture_models()) {
    const std::string args = " eval -m " + model + " --tokens " + kTokens + " --all-logits --greedy 6 -t 1";
    std::string ref, err;
    ASSERT_EQ(run_command(bin() + args, &ref, &err), 0) << err;
    ASSERT_NE(ref.find("\"greedy\""), std::string::npos);
    for (int R : {2, 4}) {
      std::string got;
      ASSERT_EQ(run_command(mpirun(R) + args + " --ep", &got, &err), 0) << model << " R=" << R << "\n" << err;
      EXPECT_EQ(got, ref) << model << " with " << R << " ranks";
      EXPECT_NE(err.find("expert parallelism: " + std::to_string(R) + " ranks"), std::string::npos) << err;
    }
  }
}

// Every rank under --mem-budget (each its own expert cache, at the smallest budget rank 0
// accepts, so experts are read on every token): the same JSON as one process without one.
TEST(EpMpi, BudgetedRanksMatchSingleProcess) {
  std::string why;
  if (!have_mpirun(&why)) GTEST_SKIP() << why;
  const std::string model = fixture_models().front();
  const std::string args = " eval -m " + model + " --tokens " + kTokens + " --all-logits --greedy 6 -t 1";
  std::string ref, got, err;
  ASSERT_EQ(run_command(bin() + args, &ref, &err), 0) << err;
  EXPECT_EQ(run_command(bin() + args + " --mem-budget 1", nullptr, &err), 2);
  const size_t at = err.find("minimum of ");
  ASSERT_NE(at, std::string::npos) << err;
  const double mib = std::stod(err.substr(at + 11));
  const std::string budget = std::to_string(uint64_t((mib + 0.1) * 1048576));
  ASSERT_EQ(run_command(mpirun(2) + args + " --ep --mem-budget " + budget, &got, &err), 0) << err;
  EXPECT_EQ(got, ref);
}

// Greedy text from `run` (with MTP speculative decoding where the model has MTP blocks,
// whose MoE goes through the ranks too) is identical.
TEST(EpMpi, GreedyRunMatchesSingleProcess) {
  std::string why;
  if (!have_mpirun(&why)) GTEST_SKIP() << why;
  for (const std::string& model : fixture_models()) {
    const bool mtp = model.find("tiny-k") == std::string::npos;
    const std::string args = " run -m " + model + " -p 'The quick brown fox' -n 12 --temp 0 --ignore-eos -t 1" +
                             (mtp ? " --mtp 2" : " --mtp 0");
    std::string ref, got, err;
    ASSERT_EQ(run_command(bin() + args, &ref, &err), 0) << err;
    ASSERT_GT(ref.size(), 12u) << model;  // 12 tokens of text
    ASSERT_EQ(run_command(mpirun(2) + args + " --ep", &got, &err), 0) << model << "\n" << err;
    EXPECT_EQ(got, ref) << model;
  }
}

// Recorded counts -> ep-plan -> --ep-placement: a non-contiguous placement gives the same
// results; a placement for the wrong rank count is refused.
TEST(EpMpi, PlannedPlacement) {
  std::string why;
  if (!have_mpirun(&why)) GTEST_SKIP() << why;
  const std::string model = fixture_model("tiny-a-q4_k_m.gguf");
  const std::string counts = tmp_dir() + "/ep_mpi_counts.json", plan = tmp_dir() + "/ep_mpi_plan.json";
  const std::string args = " eval -m " + model + " --tokens " + kTokens + " --all-logits --greedy 4 -t 1";
  std::string ref, got, err;
  ASSERT_EQ(run_command(bin() + args + " --record-experts " + counts, &ref, &err), 0) << err;
  const ExpertCounts c = ExpertCounts::from_json(read_text_file(counts));
  EXPECT_EQ(c.n_expert, 16);
  EXPECT_EQ(c.layers.size(), 6u);  // MoE blocks 2..7 (eval runs no MTP block)
  for (const auto& [il, v] : c.layers) {
    int64_t sum = 0;
    for (int64_t x : v) sum += x;
    EXPECT_EQ(sum, (20 + 3) * 4) << il;  // 20 prompt + 3 greedy steps, top-4
  }
  ASSERT_EQ(run_command(bin() + " ep-plan --counts " + counts + " -n 4 -o " + plan, nullptr, &err), 0) << err;
  ASSERT_EQ(run_command(mpirun(4) + args + " --ep --ep-placement " + plan, &got, &err), 0) << err;
  EXPECT_EQ(got, ref);
  EXPECT_EQ(run_command(mpirun(2) + args + " --ep --ep-placement " + plan, &got, &err) != 0, true);
  EXPECT_NE(err.find("ranks"), std::string::npos) << err;
}

#endif

#ifdef STEP35_HAVE_MPI
// Two "hosts": one rank in each of two network namespaces joined by a veth pair, OpenMPI
// over TCP on that link only (tests/scripts/ep_two_hosts.sh). Same JSON as one process.
TEST(EpMpi, TwoHostsOverTcp) {
  std::string why;
  if (!have_mpirun(&why)) GTEST_SKIP() << why;
  const std::string script = std::string(PROJECT_SOURCE_DIR) + "/tests/scripts/ep_two_hosts.sh";
  for (const char* name : {"tiny-a-q4_k_m.gguf", "tiny-b-f32.gguf"}) {
    const std::string args = " eval -m " + fixture_model(name) + " --tokens " + kTokens + " --all-logits --greedy 4 -t 1";
    std::string ref, got, err;
    ASSERT_EQ(run_command(bin() + args, &ref, &err), 0) << err;
    const int rc = run_command(script + " " + bin() + args, &got, &err);
    if (rc == 77) GTEST_SKIP() << "two-host test skipped: " << err;
    ASSERT_EQ(rc, 0) << err;
    EXPECT_EQ(got, ref) << name;
  }
}
#endif
