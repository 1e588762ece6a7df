// MTP heads (§3) against llama.cpp's goldens: each head run over the 64 ids64 positions
// in one batch with a fresh KV cache, fed the trunk hidden states of the golden
// (hnextn.f32) shifted by one position (zeros at position 0).
#include <gtest/gtest.h>

#include <cmath>

#include "model/session.h"
#include "model/step35.h"
#include "model/workspace.h"
#include "engine/sampler.h"
#include "exec/thread_pool.h"
#include "mtp_head.h"
#include "support.h"

using namespace step35;
using namespace step35::testing;

namespace {

struct Case {
  std::string model;  // file in fixtures/models (or regenerated)
  int head;
  bool exact;  // F32 model: exact tolerance; else the quantized-golden criteria
};

class MtpGolden : public ::testing::TestWithParam<Case> {};

TEST_P(MtpGolden, HeadLogitsMatchLlamaCpp) {
  const Case& c = GetParam();
  std::string path = fixture_model(c.model + ".gguf"), why;
  if (!file_exists(path)) path = regenerated_fixture(c.model + ".gguf", &why);
  if (path.empty()) GTEST_SKIP() << why;
  Model::LoadOptions o;
  o.verbose = false;
  auto model = Model::load(path, o);
  ASSERT_GT(model->n_mtp_loaded(), c.head);
  const auto g = read_json(golden_path(c.model + ".ids64.json"));
  const auto tokens = g["prompt_tokens"].get<std::vector<int32_t>>();
  const auto hnextn = read_f32(golden_path(c.model + ".ids64.hnextn.f32"));
  const auto ref = read_f32(golden_path(c.model + ".ids64.mtp" + std::to_string(c.head) + ".logits.f32"));
  const size_t T = tokens.size(), E = size_t(model->hparams().n_embd), V = size_t(model->hparams().n_vocab);
  ASSERT_EQ(hnextn.size(), T * E);
  ASSERT_EQ(ref.size(), T * V);
  const BatchOutput out = run_mtp_head(*model, c.head, tokens, hnextn, c.exact ? Precision::Exact : Precision::Native);
  ASSERT_EQ(out.logits.size(), T * V);
  EXPECT_EQ(out.hidden.size(), T * E);

  double max_abs = 0, ss = 0;
  size_t agree = 0;
  for (size_t t = 0; t < T; ++t) {
    for (size_t v = 0; v < V; ++v) {
      const double d = std::fabs(double(out.logits[t * V + v]) - ref[t * V + v]);
      max_abs = std::max(max_abs, d);
      ss += d * d;
    }
    agree += Sampler::argmax(out.logits.data() + t * V, V) == Sampler::argmax(ref.data() + t * V, V);
  }
  const double rms = std::sqrt(ss / double(T * V));
  std::printf("[mtp] %s head %d: max|d| %.3g rms %.3g argmax %zu/%zu\n", c.model.c_str(), c.head, max_abs, rms, agree, T);
  if (c.exact) {
    EXPECT_LE(max_abs, 1e-3);
    EXPECT_EQ(agree, T);
  } else {
    EXPECT_LE(rms, 0.15);
    EXPECT_GE(double(agree), 0.85 * double(T));
  }
}

// The trunk's hidden output (the MTP input) equals llama.cpp's h_nextn.
TEST(MtpGolden, TrunkHiddenMatchesHNextn) {
  for (const char* m : {"tiny-a-f32", "tiny-b-f32"}) {
    Model::LoadOptions o;
    o.verbose = false;
    auto model = Model::load(fixture_model(std::string(m) + ".gguf"), o);
    const auto g = read_json(golden_path(std::string(m) + ".ids64.json"));
    const auto tokens = g["prompt_tokens"].get<std::vector<int32_t>>();
    const auto hnextn = read_f32(golden_path(std::string(m) + ".ids64.hnextn.f32"));
    ThreadPool pool(2);
    Session s(*model, 64, 64, Precision::Exact, false, 0, KvTypes::f32());
    std::vector<float> logits, hidden;
    s.forward(tokens.data(), int32_t(tokens.size()), false, logits, pool, &hidden);
    ASSERT_EQ(hidden.size(), hnextn.size());
    double max_abs = 0;
    for (size_t i = 0; i < hidden.size(); ++i) max_abs = std::max(max_abs, std::fabs(double(hidden[i]) - hnextn[i]));
    EXPECT_LE(max_abs, 1e-3) << m;
  }
}

TEST(MtpGolden, ModelsWithoutMtpSaySo) {
  Model::LoadOptions o;
  o.verbose = false;
  auto model = Model::load(fixture_model("tiny-k-q4_k_m.gguf"), o);
  EXPECT_FALSE(model->has_mtp());
  KvPool kv({{false, 2, 64, 64}}, 32, 32, 2, 2);
  KvSeq seq;
  Workspace ws;
  BatchOutput out;
  ThreadPool pool(1);
  const int32_t tok = 5;
  SeqChunk ch;
  ch.seq = &seq;
  ch.tokens = &tok;
  ch.n_tokens = 1;
  std::vector<float> h(256, 0.0f);
  EXPECT_THROW(model->forward_mtp(0, kv, {ch}, h.data(), out, ws, pool), std::invalid_argument);
}

std::vector<Case> cases() {
  std::vector<Case> c;
  c.push_back({"tiny-a-f32", 0, true});
  for (const char* m : {"tiny-a-f16", "tiny-a-q8_0", "tiny-a-q4_k_m"}) c.push_back({m, 0, false});
  for (int k = 0; k < 3; ++k) {
    c.push_back({"tiny-b-f32", k, true});
    c.push_back({"tiny-b-q8_0", k, false});
  }
  return c;
}

INSTANTIATE_TEST_SUITE_P(Fixtures, MtpGolden, ::testing::ValuesIn(cases()), [](const auto& info) {
  std::string s = info.param.model + "_head" + std::to_string(info.param.head);
  for (char& ch : s)
    if (!isalnum(static_cast<unsigned char>(ch))) ch = '_';
  return s;
});

}  // namespace
