// Fidelity against llama.cpp: every fixture model and golden in ../shared/fixtures, with
// 1 and 2 threads (tolerances: the fixtures README, "Tolerances").
//  * exact goldens (F32 models, and *.deqf32.* goldens: quantized weights dequantized,
//    F32 activations — what this engine computes): max |Δlogit| <= 1e-3 at every
//    position, identical argmax everywhere, identical 32-token greedy continuation;
//  * quantized goldens (llama.cpp rounds activations): per prompt rms <= 0.15 and
//    argmax agreement >= 85 %.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <tuple>
#include <memory>
#include <mutex>

#include "model/session.h"
#include "model/step35.h"
#include "engine/sampler.h"
#include "exec/thread_pool.h"
#include "support.h"

using namespace step35;
using namespace step35::testing;

namespace {

struct Case {
  std::string model;   // file name of the model
  std::string golden;  // golden prefix, e.g. "tiny-a-f32.ids64" or "tiny-a-q8_0.deqf32.text"
  bool exact;          // exact tolerance (else the quantized-golden criteria)
  int threads;
  KvTypes kv = KvTypes::f32();  // the goldens' cache (F32 unless a <kv> golden)
  bool kv_golden = false;       // a <set>-f32.<kv>.<prompt> golden (its own criteria)
};

// Without this gtest prints the parameter as raw bytes (string pointers included), which
// ctest then shows in every test name.
void PrintTo(const Case& c, std::ostream* os) { *os << c.golden << " t" << c.threads; }

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  std::string s = info.param.golden + "_t" + std::to_string(info.param.threads);
  for (char& c : s)
    if (!isalnum(static_cast<unsigned char>(c))) c = '_';
  return s;
}

// Models are loaded once per process (they are mapped, so this is cheap anyway).
const Model* get_model(const std::string& file, std::string* why) {
  static std::mutex mu;
  static std::map<std::string, std::unique_ptr<Model>> models;
  std::lock_guard<std::mutex> lock(mu);
  auto it = models.find(file);
  if (it != models.end()) return it->second.get();
  std::string path = fixture_model(file);
  // The tiny-q set lives in models-iq/; its unshipped files are made by
  // tests/scripts/regen_tiny_q.sh (they need llama-quantize) into tiny_q_regen_dir().
  if (!file_exists(path)) path = fixtures_dir() + "/models-iq/" + file;
  if (!file_exists(path)) path = tiny_q_regen_dir() + "/" + file;
  if (!file_exists(path) && file.rfind("tiny-q-", 0) == 0 && file != "tiny-q-f32.gguf") {
    if (why) *why = "not in " + tiny_q_regen_dir() + ": tests/scripts/regen_tiny_q.sh makes it (needs llama-quantize)";
    return nullptr;
  }
  if (!file_exists(path)) path = regenerated_fixture(file, why);
  if (path.empty()) return nullptr;
  Model::LoadOptions opts;
  opts.verbose = false;
  auto m = Model::load(path, opts);
  return (models[file] = std::move(m)).get();
}

struct ModelRun {
  std::vector<float> logits;  // every position
  std::vector<int32_t> greedy;
};

ModelRun run_model(const Model& model, const std::vector<int32_t>& prompt, int n_greedy, int threads,
                   Precision precision, KvTypes kv) {
  ThreadPool pool(threads);
  const int n_vocab = model.hparams().n_vocab;
  Session session(model, int32_t(prompt.size()) + n_greedy, 512, precision, false, 0, kv);
  ModelRun r;
  session.forward(prompt.data(), int32_t(prompt.size()), true, r.logits, pool);
  int32_t next = Sampler::argmax(r.logits.data() + (prompt.size() - 1) * size_t(n_vocab), size_t(n_vocab));
  std::vector<float> step;
  for (int i = 0; i < n_greedy; ++i) {
    r.greedy.push_back(next);
    if (i + 1 == n_greedy) break;
    session.forward(&next, 1, false, step, pool);
    next = Sampler::argmax(step.data(), size_t(n_vocab));
  }
  return r;
}

class Golden : public ::testing::TestWithParam<Case> {};

TEST_P(Golden, MatchesLlamaCpp) {
  const Case& c = GetParam();
  std::string why;
  const Model* model = get_model(c.model, &why);
  if (!model) GTEST_SKIP() << "cannot make " << c.model << ": " << why;
  const auto g = read_json(golden_path(c.golden + ".json"));
  const auto prompt = g["prompt_tokens"].get<std::vector<int32_t>>();
  const auto golden_greedy = g["greedy"].get<std::vector<int32_t>>();
  const auto golden_argmax = g["argmax"].get<std::vector<int32_t>>();
  const size_t V = g["n_vocab"].get<size_t>(), T = prompt.size();
  ASSERT_EQ(V, size_t(model->hparams().n_vocab));

  // Exact goldens (F32 models, deqf32) are what Precision::Exact computes; the quantized
  // goldens are llama.cpp's own rounding, which Precision::Native reproduces.
  ModelRun r = run_model(*model, prompt, int(golden_greedy.size()), c.threads,
                         c.exact ? Precision::Exact : Precision::Native, c.kv);
  ASSERT_EQ(r.logits.size(), T * V);

  // Reference logits: every row where the golden has them, else the last row.
  std::vector<float> ref;
  const std::string all_path = golden_path(c.golden + ".logits.f32");
  const bool have_all = file_exists(all_path);
  if (have_all) {
    ref = read_f32(all_path);
    ASSERT_EQ(ref.size(), T * V);
  } else {
    ref = g["last_logits"].get<std::vector<float>>();
    ASSERT_EQ(ref.size(), V);
  }
  const size_t first_row = have_all ? 0 : T - 1;

  double max_abs = 0, sum_sq = 0;
  size_t n = 0;
  for (size_t t = first_row; t < T; ++t)
    for (size_t v = 0; v < V; ++v) {
      const double d = std::fabs(double(r.logits[t * V + v]) - ref[(t - first_row) * V + v]);
      max_abs = std::max(max_abs, d);
      sum_sq += d * d;
      ++n;
    }
  // top5 covers every position even where only the last row of logits is stored.
  double max_abs_top5 = 0;
  for (size_t t = 0; t < T; ++t)
    for (const auto& e : g["top5"][t]) {
      const size_t id = e[0].get<size_t>();
      max_abs_top5 = std::max(max_abs_top5, std::fabs(double(r.logits[t * V + id]) - e[1].get<double>()));
    }
  size_t argmax_agree = 0;
  for (size_t t = 0; t < T; ++t)
    argmax_agree += Sampler::argmax(r.logits.data() + t * V, V) == golden_argmax[t];
  const double rms = std::sqrt(sum_sq / double(n));
  RecordProperty("max_abs", std::to_string(max_abs));
  RecordProperty("rms", std::to_string(rms));
  std::printf("[golden] %s t%d: max|d| %.3g rms %.3g top5 max|d| %.3g argmax %zu/%zu greedy %s\n",
              c.golden.c_str(), c.threads, max_abs, rms, max_abs_top5, argmax_agree, T,
              r.greedy == golden_greedy ? "identical" : "differs");

  if (c.kv_golden) {
    // This engine's attention is always the flash-style one (llama.cpp's default, -fa on):
    //  * kvf16fa (made with -fa on): like an F32 golden, max |d| 1e-3 and rms 1e-4.
    //  * kvq8_0: the query is rounded to Q8_0 blocks, which turns last-bit differences of
    //    the products before it into whole rounding steps (the oracle's own batch and
    //    token-by-token runs differ by up to 3.1e-3): max 1e-2, rms 1e-3.
    //  * kvq4_0: 4-bit keys amplify such differences further: scaling the keys by 1 +- 1e-6
    //    before the cache (less than the two engines' float differences) moved tiny-a
    //    long200's logits by up to 0.26 (a routing flip), rms 0.006: max 0.3, rms 1e-2.
    //  Argmax may differ only where the golden's own top two are within 0.01 (a near-tie).
    //  * kvf16 (made with -fa off, which rounds queries and softmax weights to F16): within
    //    the README's "FA on vs off" difference for that golden (table "KV cache types",
    //    column "vs F32 KV + FA") plus 1e-3 / 1e-4, argmax as agreeing as there.
    // Every KV golden: identical 32-token greedy continuation.
    size_t greedy_common = 0;
    while (greedy_common < r.greedy.size() && r.greedy[greedy_common] == golden_greedy[greedy_common]) ++greedy_common;
    std::printf("[kv] %s t%d: max %.4g rms %.4g top5 %.4g argmax %zu/%zu greedy %zu/32\n", c.golden.c_str(), c.threads,
                max_abs, rms, max_abs_top5, argmax_agree, T, greedy_common);
    const bool fa_off = c.golden.find(".kvf16.") != std::string::npos;
    if (fa_off) {
      // golden -> {max, rms, argmax agreement} of FA off vs FA on (fixtures README).
      const std::map<std::string, std::tuple<double, double, size_t>> documented = {
          {"tiny-a-f32.kvf16.ids64", {0.00175, 0.000228, 64}},  {"tiny-a-f32.kvf16.long200", {0.257, 0.00551, 199}},
          {"tiny-k-f32.kvf16.ids64", {0.000838, 0.000126, 64}}, {"tiny-k-f32.kvf16.long200", {0.00122, 0.000109, 200}}};
      const auto& [dmax, drms, dargmax] = documented.at(c.golden);
      EXPECT_LE(max_abs, dmax + 1e-3);
      EXPECT_LE(rms, drms + 1e-4);
      EXPECT_GE(argmax_agree, dargmax);
    } else {
      const double max_bound = c.kv.k == DType::F16 ? 1e-3 : c.kv.k == DType::Q8_0 ? 1e-2 : 0.3;
      const double rms_bound = c.kv.k == DType::F16 ? 1e-4 : c.kv.k == DType::Q8_0 ? 1e-3 : 1e-2;
      EXPECT_LE(max_abs, max_bound);
      EXPECT_LE(max_abs_top5, max_bound);
      EXPECT_LE(rms, rms_bound);
      for (size_t t = 0; t < T; ++t) {
        if (Sampler::argmax(r.logits.data() + t * V, V) == golden_argmax[t]) continue;
        const double margin = g["top5"][t][0][1].get<double>() - g["top5"][t][1][1].get<double>();
        EXPECT_LT(margin, 0.01) << "argmax differs at position " << t << " where the golden's top two are "
                                << margin << " apart";
      }
    }
    EXPECT_EQ(r.greedy, golden_greedy);
  } else if (c.exact) {
    EXPECT_LE(max_abs, 1e-3);
    EXPECT_LE(max_abs_top5, 1e-3);
    EXPECT_EQ(argmax_agree, T);
    EXPECT_EQ(r.greedy, golden_greedy);
  } else {
    // Native precision rounds activations as ggml does: measured rms <= 0.053 and argmax
    // agreement >= 96 % on every quantized golden (was 0.15 / 85 % with F32 activations).
    EXPECT_LE(rms, 0.08);
    EXPECT_GE(double(argmax_agree), 0.93 * double(T));
    if (!have_all) {
      EXPECT_LE(max_abs_top5, 3.0);  // sanity: same scale as the golden
    }
  }
}

std::vector<Case> all_cases() {
  std::vector<Case> cases;
  const char* prompts[] = {"ids64", "long200", "text"};
  for (int threads : {1, 2}) {
    for (const char* m : {"tiny-a-f32", "tiny-b-f32", "tiny-k-f32"})
      for (const char* p : prompts) cases.push_back({std::string(m) + ".gguf", std::string(m) + "." + p, true, threads});
    for (const char* m : {"tiny-a-f16", "tiny-a-q8_0", "tiny-a-q4_k_m", "tiny-b-q8_0", "tiny-k-q4_k_m"})
      for (const char* p : prompts) {
        cases.push_back({std::string(m) + ".gguf", std::string(m) + ".deqf32." + p, true, threads});
        cases.push_back({std::string(m) + ".gguf", std::string(m) + "." + p, false, threads});
      }
    // The F32 models with another KV cache type (the fixtures README, "KV cache types").
    const std::pair<const char*, KvTypes> kvs[] = {{"kvf16", {DType::F16, DType::F16}},
                                                   {"kvf16fa", {DType::F16, DType::F16}},
                                                   {"kvq8_0", {DType::Q8_0, DType::Q8_0}},
                                                   {"kvq4_0", {DType::Q4_0, DType::Q4_0}}};
    for (const char* m : {"tiny-a-f32", "tiny-k-f32"})
      for (const auto& [kv, types] : kvs)
        for (const char* p : {"ids64", "long200"}) {
          Case c{std::string(m) + ".gguf", std::string(m) + "." + kv + "." + p, true, threads, types, true};
          cases.push_back(c);
        }
    // The tiny-q set (models-iq/): the F32 model (regenerated) and the five shipped
    // quantisations, IQ types mixed with K-quants and Q8_0 per tensor as llama-quantize made them.
    for (const char* p : prompts) cases.push_back({"tiny-q-f32.gguf", std::string("tiny-q-f32.") + p, true, threads});
    for (const char* m : {"tiny-q-iq4_xs", "tiny-q-iq3_s", "tiny-q-iq2_xxs", "tiny-q-q2_k", "tiny-q-iq1_m"})
      for (const char* p : prompts) {
        cases.push_back({std::string(m) + ".gguf", std::string(m) + ".deqf32." + p, true, threads});
        cases.push_back({std::string(m) + ".gguf", std::string(m) + "." + p, false, threads});
      }
  }
  return cases;
}

// The twelve tiny-q files the fixtures do not ship (tests/scripts/regen_tiny_q.sh makes
// them with llama-quantize; skipped while absent): their only golden is ids64 (argmax and
// top-5 at every position, last-position logits).
std::vector<Case> regenerated_cases() {
  std::vector<Case> cases;
  for (int threads : {1, 2})
    for (const char* m : {"tiny-q-iq1_s", "tiny-q-iq2_xs", "tiny-q-iq2_s", "tiny-q-iq2_m", "tiny-q-iq3_xxs",
                          "tiny-q-iq3_m", "tiny-q-iq4_nl", "tiny-q-q3_k_m", "tiny-q-q4_0", "tiny-q-q5_k_m",
                          "tiny-q-mxfp4_moe", "tiny-q-iq3_s_attnq8"})
      cases.push_back({std::string(m) + ".gguf", std::string(m) + ".ids64", false, threads});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Fixtures, Golden, ::testing::ValuesIn(all_cases()), case_name);
INSTANTIATE_TEST_SUITE_P(RegeneratedTinyQ, Golden, ::testing::ValuesIn(regenerated_cases()), case_name);

}  // namespace
