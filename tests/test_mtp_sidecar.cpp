// The MTP sidecar (Model::LoadOptions::mtp_model, --mtp-model): Step-3.7-Flash ships its MTP
// blocks in a second GGUF beside a main file without them. The fixtures' split pair
// (../shared/fixtures/vision: tiny-a without blk.8 + the sidecar llama.cpp's converter
// writes) must behave exactly as the combined tiny-a file: the same bits in the MTP head,
// the same tokens and acceptance through `run` and `serve`, and clear errors for sidecars
// that do not fit.
#include <gtest/gtest.h>
#include <httplib.h>
#include <sys/stat.h>

#include <nlohmann/json.hpp>
#include <regex>

#include "exec/thread_pool.h"
#include "model/session.h"
#include "model/step35.h"
#include "model/workspace.h"
#include "mtp_head.h"
#include "serve_process.h"
#include "support.h"

using namespace step35;
using namespace step35::testing;
using json = nlohmann::json;

namespace {

struct SplitPair {
  std::string main, sidecar, other_sidecar;  // other: tiny-v's sidecar (vocabulary 519)
};

// The split pair, regenerated (bit for bit, sha256-checked) into tmp_dir()/vision, with
// tiny-v's sidecar beside it: a folder with two mtp-*.gguf, one of which does not fit.
SplitPair split_pair(std::string* why) {
  SplitPair p;
  p.main = regenerated_fixture("tiny-a-nomtp-f32.gguf", why, "vision");
  if (!p.main.empty()) p.sidecar = regenerated_fixture("mtp-tiny-a-f32.gguf", why, "vision");
  if (!p.sidecar.empty()) p.other_sidecar = regenerated_fixture("mtp-tiny-v-f32.gguf", why, "vision");
  return p;
}

#define SPLIT_PAIR_OR_SKIP(p)             \
  std::string why_;                       \
  const SplitPair p = split_pair(&why_);  \
  if (p.other_sidecar.empty()) GTEST_SKIP() << why_

std::unique_ptr<Model> load(const std::string& path, const std::string& mtp_model = "") {
  Model::LoadOptions o;
  o.verbose = false;
  o.mtp_model = mtp_model;
  return Model::load(path, o);
}

// The loader's error for `path` with `mtp_model`, "" if it loads.
std::string load_error(const std::string& path, const std::string& mtp_model) {
  try {
    load(path, mtp_model);
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

TEST(MtpSidecar, SplitPairComputesTheCombinedFilesBits) {
  SPLIT_PAIR_OR_SKIP(pair);
  auto split = load(pair.main, pair.sidecar);
  auto combined = load(fixture_model("tiny-a-f32.gguf"));
  ASSERT_EQ(split->n_mtp_loaded(), 1);
  EXPECT_EQ(split->mtp_sidecar_path(), pair.sidecar);
  EXPECT_TRUE(combined->mtp_sidecar_path().empty());
  EXPECT_EQ(split->hparams().n_mtp, 1);
  EXPECT_EQ(split->hparams().layers.size(), combined->hparams().layers.size());

  const auto g = read_json(golden_path("tiny-a-f32.ids64.json"));
  const auto tokens = g["prompt_tokens"].get<std::vector<int32_t>>();
  // The trunk: its hidden output (the MTP input) is the combined file's, bit for bit.
  ThreadPool pool(2);
  std::vector<float> hidden_split, hidden_combined, logits;
  Session(*split, 64, 64, Precision::Exact, false, 0, KvTypes::f32())
      .forward(tokens.data(), int32_t(tokens.size()), false, logits, pool, &hidden_split);
  Session(*combined, 64, 64, Precision::Exact, false, 0, KvTypes::f32())
      .forward(tokens.data(), int32_t(tokens.size()), false, logits, pool, &hidden_combined);
  ASSERT_EQ(hidden_split, hidden_combined);

  // The MTP head, both precisions: the combined file's bits, and llama.cpp's golden.
  const auto hnextn = read_f32(golden_path("tiny-a-f32.ids64.hnextn.f32"));
  const auto ref = read_f32(golden_path("tiny-a-f32.ids64.mtp0.logits.f32"));
  for (Precision precision : {Precision::Exact, Precision::Native}) {
    const BatchOutput a = run_mtp_head(*split, 0, tokens, hnextn, precision);
    const BatchOutput b = run_mtp_head(*combined, 0, tokens, hnextn, precision);
    ASSERT_EQ(a.logits.size(), ref.size());
    EXPECT_EQ(a.logits, b.logits);
    EXPECT_EQ(a.hidden, b.hidden);
    double max_abs = 0;
    for (size_t i = 0; i < ref.size(); ++i) max_abs = std::max(max_abs, std::fabs(double(a.logits[i]) - ref[i]));
    EXPECT_LE(max_abs, 1e-3);
  }
}

TEST(MtpSidecar, AnMtpFileBesideTheModelIsFoundByItself) {
  SPLIT_PAIR_OR_SKIP(pair);
  // Two candidates in the folder: tiny-v's sidecar does not fit (vocabulary), tiny-a's does.
  auto found = load(pair.main);
  EXPECT_EQ(found->n_mtp_loaded(), 1);
  EXPECT_NE(found->mtp_sidecar_path().find("mtp-tiny-a-f32.gguf"), std::string::npos) << found->mtp_sidecar_path();
  auto without = load(pair.main, Model::kNoMtpSidecar);
  EXPECT_EQ(without->n_mtp_loaded(), 0);
  EXPECT_TRUE(without->mtp_sidecar_path().empty());
  // A model with MTP blocks of its own does not look.
  EXPECT_TRUE(load(fixture_model("tiny-a-f32.gguf"))->mtp_sidecar_path().empty());
}

TEST(MtpSidecar, SidecarsThatDoNotFitAreClearErrors) {
  SPLIT_PAIR_OR_SKIP(pair);
  std::string e = load_error(pair.main, pair.other_sidecar);
  EXPECT_NE(e.find("does not fit"), std::string::npos) << e;
  EXPECT_NE(e.find("vocabulary has 519 tokens"), std::string::npos) << e;
  // The model already has its MTP block.
  e = load_error(fixture_model("tiny-a-f32.gguf"), pair.sidecar);
  EXPECT_NE(e.find("holds MTP blocks of its own"), std::string::npos) << e;
  // Another model (other layer count / widths).
  e = load_error(fixture_model("tiny-k-q4_k_m.gguf"), pair.sidecar);
  EXPECT_NE(e.find("does not fit"), std::string::npos) << e;
  // The sidecar given as the model.
  e = load_error(pair.sidecar, "");
  EXPECT_NE(e.find("is an MTP sidecar"), std::string::npos) << e;
  EXPECT_NE(e.find("--mtp-model"), std::string::npos) << e;
  // A full model given as the sidecar.
  e = load_error(pair.main, fixture_model("tiny-a-f32.gguf"));
  EXPECT_NE(e.find("not an MTP sidecar"), std::string::npos) << e;
  // No such file.
  e = load_error(pair.main, tmp_dir() + "/no-such-mtp.gguf");
  EXPECT_NE(e.find("no-such-mtp.gguf"), std::string::npos) << e;
  // Only a misfit beside the model: an error naming it, with the way out.
  const std::string folder = tmp_dir() + "/mtp-misfit." + std::to_string(::getpid());
  ::mkdir(folder.c_str(), 0755);
  ASSERT_EQ(run_command("cp '" + pair.main + "' '" + pair.other_sidecar + "' '" + folder + "/'"), 0);
  e = load_error(folder + "/tiny-a-nomtp-f32.gguf", "");
  EXPECT_NE(e.find("mtp-tiny-v-f32.gguf"), std::string::npos) << e;
  EXPECT_NE(e.find("--mtp-model none"), std::string::npos) << e;
  EXPECT_EQ(load_error(folder + "/tiny-a-nomtp-f32.gguf", Model::kNoMtpSidecar), "");
  run_command("rm -rf '" + folder + "'");
}

// `step35 run` greedy with 3 drafts per step: the split pair (named, and found by itself)
// prints the combined file's text and the same acceptance line.
TEST(MtpSidecar, RunDraftsAsTheCombinedFile) {
  SPLIT_PAIR_OR_SKIP(pair);
  auto run = [](const std::string& model_args, std::string* stats, std::string* err) {
    std::string out;
    const int rc = run_command(step35_binary() + " run " + model_args +
                                   " -p 'The sidecar test' -n 40 --temp 0 --mtp 3 -t 2",
                               &out, err);
    EXPECT_EQ(rc, 0) << *err;
    std::smatch m;
    if (std::regex_search(*err, m, std::regex("mtp: fixed[^\n]*"))) *stats = m.str();
    return out;
  };
  std::string stats_c, stats_named, stats_found, err;
  const std::string text = run("-m " + fixture_model("tiny-a-f32.gguf"), &stats_c, &err);
  ASSERT_FALSE(stats_c.empty()) << err;
  EXPECT_EQ(run("-m " + pair.main + " --mtp-model " + pair.sidecar, &stats_named, &err), text);
  EXPECT_NE(err.find("+ 1 MTP (from " + pair.sidecar + ")"), std::string::npos) << err;
  EXPECT_EQ(stats_named, stats_c);
  EXPECT_EQ(run("-m " + pair.main, &stats_found, &err), text);
  EXPECT_NE(err.find("mtp: using the MTP sidecar"), std::string::npos) << err;
  EXPECT_EQ(stats_found, stats_c);
  // --mtp-model none: no MTP blocks, so --mtp 3 is refused.
  std::string out;
  EXPECT_NE(run_command(step35_binary() + " run -m " + pair.main + " --mtp-model none -p x -n 2 --mtp 3", &out, &err),
            0);
  EXPECT_NE(err.find("no MTP blocks"), std::string::npos) << err;
  EXPECT_NE(run_command(step35_binary() + " run -m " + pair.main + " --mtp-model " + pair.other_sidecar + " -p x -n 2",
                        &out, &err),
            0);
  EXPECT_NE(err.find("does not fit"), std::string::npos) << err;
}

// `step35 serve` with the sidecar found beside the model: the combined file's greedy text
// and MTP draft counts over HTTP, and the log says where the MTP blocks came from.
TEST(MtpSidecar, ServeDraftsAsTheCombinedFile) {
  SPLIT_PAIR_OR_SKIP(pair);
  struct Result {
    std::string text, drafts;
  };
  auto serve = [](const std::string& model, const std::string& log_prefix, std::string* log) {
    ServeProcess s({"-m", model, "-t", "1", "--mtp", "3"}, log_prefix);
    httplib::Client c("127.0.0.1", s.port());
    c.set_read_timeout(120, 0);
    Result r;
    const json body = {{"prompt", "The sidecar test"}, {"max_tokens", 32}, {"temperature", 0}};
    auto res = c.Post("/v1/completions", body.dump(), "application/json");
    EXPECT_TRUE(res && res->status == 200) << (res ? res->body : "no response");
    if (res) r.text = json::parse(res->body)["choices"][0]["text"];
    auto metrics = c.Get("/metrics");
    EXPECT_TRUE(metrics && metrics->status == 200);
    // Drafts proposed and accepted at every draft position.
    const std::regex counts("step35_mtp_(drafts|accepted)_total\\{[^}]*\\} [0-9]+");
    if (metrics)
      for (std::sregex_iterator i(metrics->body.begin(), metrics->body.end(), counts), end; i != end; ++i)
        r.drafts += i->str() + "\n";
    const std::vector<uint8_t> bytes = read_bytes(s.log_path());
    log->assign(bytes.begin(), bytes.end());
    return r;
  };
  std::string log;
  const Result combined = serve(fixture_model("tiny-a-f32.gguf"), "mtp_sidecar_combined", &log);
  ASSERT_FALSE(combined.drafts.empty());
  const Result split = serve(pair.main, "mtp_sidecar_split", &log);
  EXPECT_EQ(split.text, combined.text);
  EXPECT_EQ(split.drafts, combined.drafts);
  EXPECT_NE(log.find("(from the sidecar " + pair.sidecar.substr(0, pair.sidecar.rfind('/'))), std::string::npos)
      << log;
}

}  // namespace
