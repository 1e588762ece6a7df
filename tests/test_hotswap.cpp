// Expert hot-swap into a running `step35 serve` (POST /v1/step35/hotswap, .../revert):
// after a swap the server's logits equal `step35 eval --patch` of the same patch bit for
// bit, after a revert the base model's; mismatched patches are refused with 400 and nothing
// changes; admin access; /metrics; swaps during 8 concurrent streams never mix weights in
// one request (bench/hotswap_load, short run); and the same under expert parallelism.
#include <gtest/gtest.h>
#include <httplib.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "serve_process.h"
#include "support.h"

using namespace step35::testing;
using nlohmann::json;

namespace {

const std::string kModel = "tiny-a-q8_0.gguf";
const std::vector<int32_t> kPrompt = {0, 17, 250, 3, 99, 5, 60, 7, 300, 9, 10, 211};

std::string bin() { return step35_binary(); }

// A training text of this test's own and a patch that changes the model's choices.
std::string strong_patch(const std::string& name, const std::string& extra = "") {
  const std::string text = tmp_dir() + "/hs_text.txt";
  if (!file_exists(text)) {
    std::string t;
    for (int i = 0; i < 40; ++i) t += "Swapped experts answer differently from the ones they replace, line " + std::to_string(i) + ".\n";
    write_bytes(text, std::vector<uint8_t>(t.begin(), t.end()));
  }
  const std::string out = tmp_dir() + "/" + name + ".gguf";
  if (!file_exists(out)) {
    std::string err;
    EXPECT_EQ(run_command(bin() + " finetune -m " + fixture_model(kModel) + " -f " + text +
                              " --train 'experts=7:top2;shared=7' --out " + out + " --steps 20 -c 32 -b 2 --lr 1e-2 -t 1 --eval-windows 2 " + extra,
                          nullptr, &err),
              0)
        << err;
  }
  return out;
}

// A patch made for the F32 model of the same set, which the Q8_0 model refuses (the slices'
// types differ); "" when it could not be made. Its training text is strong_patch's.
std::string f32_patch() {
  strong_patch("hs_patch");
  const std::string text = tmp_dir() + "/hs_text.txt";
  const std::string out = tmp_dir() + "/hs_other.gguf";
  std::string err;
  const int rc = run_command(bin() + " finetune -m " + fixture_model("tiny-a-f32.gguf") + " -f " + text +
                                 " --train experts=7:1 --out " + out + " --steps 1 -c 16 -b 1 -t 1 --eval-windows 2",
                             nullptr, &err);
  EXPECT_EQ(rc, 0) << err;
  return rc == 0 ? out : "";
}

httplib::Client client(const ServeProcess& s) {
  httplib::Client c("127.0.0.1", s.port());
  c.set_read_timeout(120, 0);
  return c;
}

json post(const ServeProcess& s, const std::string& path, const json& body, int* status = nullptr,
          const httplib::Headers& headers = {}) {
  auto c = client(s);
  auto r = c.Post(path.c_str(), headers, body.dump(), "application/json");
  if (!r) {
    ADD_FAILURE() << "no response from " << path;
    return json();
  }
  if (status) *status = r->status;
  return json::parse(r->body, nullptr, false);
}

// Greedy completion of kPrompt: each generated token's log-probability as the server
// computed it (the tiny models rarely pick an end-of-generation token; the comparisons
// below would show it as a shorter list).
struct Completion {
  std::vector<float> logprobs;
  std::string text;
};

Completion complete(const ServeProcess& s, int n, const httplib::Headers& headers = {}) {
  int status = 0;
  // (Not ignore_eos: it masks the end-of-generation tokens out of the log-probs.)
  const json r = post(s, "/v1/completions", {{"prompt", kPrompt}, {"max_tokens", n}, {"temperature", 0}, {"logprobs", 1}},
                      &status, headers);
  Completion c;
  EXPECT_EQ(status, 200) << r.dump();
  if (status != 200) return c;
  c.text = r["choices"][0]["text"];
  for (const auto& x : r["choices"][0]["logprobs"]["token_logprobs"]) c.logprobs.push_back(float(x.get<double>()));
  return c;
}

// What the server reports for the same request, computed from `step35 eval` (with
// `extra`, e.g. --patch FILE): the greedy tokens, then the logits of prompt + tokens at
// every position, turned into log-probs exactly as the engine does (float max, double
// sum of exp, float log-sum-exp), so equal logits give equal numbers bit for bit.
Completion reference(const std::string& extra, int n) {
  auto ids = [](const std::vector<int32_t>& v) {
    std::string s;
    for (int32_t t : v) {
      if (!s.empty()) s += ',';
      s += std::to_string(t);
    }
    return s;
  };
  std::string out, err;
  EXPECT_EQ(run_command(bin() + " eval -m " + fixture_model(kModel) + " --tokens " + ids(kPrompt) + " --greedy " +
                            std::to_string(n) + " -t 1 " + extra,
                        &out, &err),
            0)
      << err;
  const auto greedy = json::parse(out)["greedy"].get<std::vector<int32_t>>();
  std::vector<int32_t> all = kPrompt;
  all.insert(all.end(), greedy.begin(), greedy.end() - 1);
  EXPECT_EQ(run_command(bin() + " eval -m " + fixture_model(kModel) + " --tokens " + ids(all) + " --all-logits -t 1 " +
                            extra,
                        &out, &err),
            0)
      << err;
  const json j = json::parse(out);
  Completion c;
  for (size_t i = 0; i < greedy.size(); ++i) {
    std::vector<float> lg;
    for (const auto& x : j["logits"][kPrompt.size() - 1 + i]) lg.push_back(float(x.get<double>()));
    float mx = -INFINITY;
    for (float v : lg) mx = std::max(mx, v);
    double sum = 0;
    for (float v : lg) sum += std::exp(double(v - mx));
    const float lse = mx + float(std::log(sum));
    c.logprobs.push_back(lg[size_t(greedy[i])] - lse);
  }
  return c;
}

}  // namespace

TEST(HotSwap, LogitsEqualEvalPatchAndRevertRestoresBase) {
  const std::string p = strong_patch("hs_patch");
  ServeProcess s({"-m", fixture_model(kModel), "-t", "1"}, "hotswap");
  const Completion base_ref = reference("", 6), patch_ref = reference("--patch " + p, 6);
  ASSERT_NE(base_ref.logprobs, patch_ref.logprobs);
  EXPECT_EQ(complete(s, 6).logprobs, base_ref.logprobs);
  int status = 0;
  json r = post(s, "/v1/step35/hotswap", {{"patch", p}}, &status);
  ASSERT_EQ(status, 200) << r.dump();
  EXPECT_EQ(r["slices"], 9);
  EXPECT_EQ(r["active"].size(), 1u);
  EXPECT_EQ(complete(s, 6).logprobs, patch_ref.logprobs);  // bit for bit
  r = post(s, "/v1/step35/hotswap/revert", json::object(), &status);
  ASSERT_EQ(status, 200) << r.dump();
  EXPECT_EQ(r["reverted"][0], p);
  EXPECT_EQ(complete(s, 6).logprobs, base_ref.logprobs);
  // Nothing left to revert.
  post(s, "/v1/step35/hotswap/revert", json::object(), &status);
  EXPECT_EQ(status, 400);
  // The deployment guides' field name works as well; two swaps stack, revert all undoes both.
  const std::string q = strong_patch("hs_patch_b", "--seed 3");
  post(s, "/v1/step35/hotswap", {{"weights_path", p}}, &status);
  EXPECT_EQ(status, 200);
  post(s, "/v1/step35/hotswap", {{"patch", q}}, &status);
  EXPECT_EQ(status, 200);
  EXPECT_EQ(complete(s, 6).logprobs, reference("--patch " + p + " --patch " + q, 6).logprobs);
  r = post(s, "/v1/step35/hotswap/revert", {{"all", true}}, &status);
  EXPECT_EQ(status, 200);
  EXPECT_EQ(r["reverted"].size(), 2u);
  EXPECT_EQ(complete(s, 6).logprobs, base_ref.logprobs);
  // /metrics counts swaps and shows the active patches.
  auto c = client(s);
  post(s, "/v1/step35/hotswap", {{"patch", p}}, &status);
  auto m = c.Get("/metrics");
  ASSERT_TRUE(m);
  EXPECT_NE(m->body.find("step35_hotswaps_total{result=\"ok\"} 4"), std::string::npos) << m->body;
  EXPECT_NE(m->body.find("step35_hotswap_reverts_total 2"), std::string::npos);
  EXPECT_NE(m->body.find("step35_active_patches 1"), std::string::npos);
  EXPECT_NE(m->body.find("step35_active_patch{position=\"1\",patch=\"" + p + "\""), std::string::npos);
  auto g = c.Get("/v1/step35/hotswap");
  ASSERT_TRUE(g);
  EXPECT_EQ(json::parse(g->body)["active"][0]["patch"], p);
}

TEST(HotSwap, StartupPatchesStayUnderSwapsAndReverts) {
  const std::string p = strong_patch("hs_patch"), q = strong_patch("hs_patch_b", "--seed 3");
  ServeProcess s({"-m", fixture_model(kModel), "-t", "1", "--patch", p}, "hotswap");
  EXPECT_EQ(complete(s, 4).logprobs, reference("--patch " + p, 4).logprobs);
  int status = 0;
  post(s, "/v1/step35/hotswap", {{"patch", q}}, &status);
  ASSERT_EQ(status, 200);
  EXPECT_EQ(complete(s, 4).logprobs, reference("--patch " + p + " --patch " + q, 4).logprobs);
  post(s, "/v1/step35/hotswap/revert", {{"all", true}}, &status);
  EXPECT_EQ(complete(s, 4).logprobs, reference("--patch " + p, 4).logprobs);
  // The server's log has the startup patch, the swap and the revert.
  const std::vector<uint8_t> log_bytes = read_bytes(s.log_path());
  const std::string log(log_bytes.begin(), log_bytes.end());
  EXPECT_NE(log.find("patches applied: " + p), std::string::npos) << log;
  EXPECT_NE(log.find("hot-swapped " + q), std::string::npos) << log;
  EXPECT_NE(log.find("reverted 1 hot-swap (weights version 3, 0 active)"), std::string::npos) << log;
}

// A --patch file that does not fit the model ends the server's load: exit 1, the reason
// naming the patch.
TEST(HotSwap, ServeRefusesAStartupPatchThatDoesNotFit) {
  const std::string other = f32_patch();
  ASSERT_FALSE(other.empty());
  std::string out, err;
  EXPECT_EQ(run_command(bin() + " serve -m " + fixture_model(kModel) + " --patch " + other + " --port 0 -t 1", &out, &err),
            1);
  EXPECT_NE(err.find("--patch: " + other), std::string::npos) << err;
}

TEST(HotSwap, RefusesWhatDoesNotFitAndChangesNothing) {
  ServeProcess s({"-m", fixture_model(kModel), "-t", "1"}, "hotswap");
  const Completion before = complete(s, 4);
  // A patch made for the F32 model of the same set (types differ).
  const std::string other = f32_patch();
  ASSERT_FALSE(other.empty());
  int status = 0;
  json r = post(s, "/v1/step35/hotswap", {{"patch", other}}, &status);
  EXPECT_EQ(status, 400);
  EXPECT_NE(r["error"]["message"].get<std::string>().find("made for a f32 tensor"), std::string::npos) << r.dump();
  for (const json& bad : {json{{"patch", tmp_dir() + "/no_such_patch.gguf"}}, json{{"patch", fixture_model(kModel)}},
                          json{{"patch", 3}}, json::object(), json::array()}) {
    post(s, "/v1/step35/hotswap", bad, &status);
    EXPECT_EQ(status, 400) << bad.dump();
  }
  // Fields the endpoint does not use are refused, not ignored (nothing is read or swapped).
  const std::string good = strong_patch("hs_patch");
  for (const json& bad : {json{{"weights_path", good}, {"expert_id", 12}}, json{{"patch", good}, {"layer", 7}},
                          json{{"patch", good}, {"weights_path", good}}}) {
    r = post(s, "/v1/step35/hotswap", bad, &status);
    EXPECT_EQ(status, 400) << bad.dump();
    EXPECT_FALSE(r["error"]["param"].is_null()) << r.dump();
  }
  post(s, "/v1/step35/hotswap/revert", {{"everything", true}}, &status);
  EXPECT_EQ(status, 400);
  auto c = client(s);
  auto raw = c.Post("/v1/step35/hotswap", "{not json", "application/json");
  ASSERT_TRUE(raw);
  EXPECT_EQ(raw->status, 400);
  EXPECT_EQ(complete(s, 4).logprobs, before.logprobs);
  auto m = c.Get("/metrics");
  EXPECT_NE(m->body.find("step35_hotswaps_total{result=\"ok\"} 0"), std::string::npos);
  EXPECT_NE(m->body.find("step35_hotswaps_total{result=\"rejected\"} 3"), std::string::npos) << m->body;
  EXPECT_NE(m->body.find("step35_weights_version 0"), std::string::npos);
}

TEST(HotSwap, NeedsTheApiKeyWhenThereIsOne) {
  const std::string p = strong_patch("hs_patch");
  ServeProcess s({"-m", fixture_model(kModel), "-t", "1", "--api-key", "sekret"}, "hotswap");
  int status = 0;
  post(s, "/v1/step35/hotswap", {{"patch", p}}, &status);
  EXPECT_EQ(status, 401);
  post(s, "/v1/step35/hotswap", {{"patch", p}}, &status, {{"Authorization", "Bearer wrong"}});
  EXPECT_EQ(status, 401);
  post(s, "/v1/step35/hotswap/revert", json::object(), &status);
  EXPECT_EQ(status, 401);
  post(s, "/v1/step35/hotswap", {{"patch", p}}, &status, {{"Authorization", "Bearer sekret"}});
  EXPECT_EQ(status, 200);
}

// Swaps every 400 ms during 8 concurrent streams for a few seconds, and on until 3 swaps
// went through (a swap under ASan on a busy machine can take seconds; the long run with
// swaps every second is in docs/finetune.md): every request completes, and each produced
// exactly what it produces alone with one of the two weight sets.
TEST(HotSwap, LoadTestNoRequestSeesMixedWeights) {
  const std::string p = strong_patch("hs_patch");
  ServeProcess s({"-m", fixture_model(kModel), "-t", "1", "--parallel", "8"}, "hotswap");
  std::string out, err;
  const int rc = run_command(std::string(STEP35_HOTSWAP_LOAD) + " --port " + std::to_string(s.port()) + " --patch " + p +
                                 " --streams 8 --seconds 5 --swap-ms 400 --min-swaps 3 --max-tokens 24 --json",
                             &out, &err);
  ASSERT_FALSE(out.empty()) << err;
  const json j = json::parse(out);
  EXPECT_EQ(rc, 0) << j.dump();
  EXPECT_EQ(j["failed"], 0) << j.dump();
  EXPECT_EQ(j["mixed"], 0) << j.dump();
  EXPECT_GE(j["swaps"].get<int>(), 3) << j.dump();
  EXPECT_GT(j["requests"].get<int>(), 16) << j.dump();
  EXPECT_EQ(j["prompts_same_both"], 0) << "the patch should change every prompt's text: " << j.dump();
}

#ifdef STEP35_HAVE_MPI
// Under --ep the rank holding an expert swaps it: a patch in the model's own type goes to
// the follower ranks; the server's logits equal eval --patch, and after a revert the base.
TEST(HotSwap, UnderExpertParallelism) {
  if (run_command("command -v mpirun > /dev/null") != 0) GTEST_SKIP() << "mpirun not found";
  const std::string p = strong_patch("hs_patch");
  const std::string f = strong_patch("hs_patch_f32", "--patch-type f32");
  ServeProcess s({"env", "ASAN_OPTIONS=detect_leaks=0", "OMPI_ALLOW_RUN_AS_ROOT=1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1",
                  "OMPI_MCA_rmaps_base_oversubscribe=1", "mpirun", "--oversubscribe", "-np", "2", "--mca",
                  "mpi_yield_when_idle", "1", "--mca", "btl_vader_single_copy_mechanism", "none"},
                 {"-m", fixture_model(kModel), "-t", "1", "--ep"}, "hotswap_ep");
  const Completion base_ref = reference("", 5);
  EXPECT_EQ(complete(s, 5).logprobs, base_ref.logprobs);
  int status = 0;
  for (const std::string& patch : {p, f}) {
    post(s, "/v1/step35/hotswap", {{"patch", patch}}, &status);
    ASSERT_EQ(status, 200);
    EXPECT_EQ(complete(s, 5).logprobs, reference("--patch " + patch, 5).logprobs) << patch;
    post(s, "/v1/step35/hotswap/revert", json::object(), &status);
    ASSERT_EQ(status, 200);
    EXPECT_EQ(complete(s, 5).logprobs, base_ref.logprobs);
  }
}
#endif
