// Layer-by-layer comparison with the fixtures' *.ids64.layers.f32 dumps (llama.cpp graph
// names). The first tensor that diverges names the step of the spec that is wrong.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <set>

#include "model/session.h"
#include "model/step35.h"
#include "exec/thread_pool.h"
#include "support.h"

using namespace step35;
using namespace step35::testing;

namespace {

struct Dumped {
  std::map<std::string, std::vector<float>> tensors;  // "name-L" -> data
};

void compare_layers(const std::string& model_file, const std::string& golden_prefix, double tol,
                    bool exact_topk) {
  std::string path = fixture_model(model_file), why;
  if (!file_exists(path)) path = regenerated_fixture(model_file, &why);
  if (path.empty()) GTEST_SKIP() << why;
  Model::LoadOptions opts;
  opts.verbose = false;
  auto model = Model::load(path, opts);
  const auto g = read_json(golden_path(golden_prefix + ".json"));
  const auto ref = read_f32(golden_path(golden_prefix + ".layers.f32"));
  const auto prompt = g["prompt_tokens"].get<std::vector<int32_t>>();

  Dumped d;
  DumpFn dump = [&](const std::string& name, int layer, const float* data, int64_t n) {
    d.tensors[layer >= 0 ? name + "-" + std::to_string(layer) : name].assign(data, data + n);
  };
  ThreadPool pool(2);
  // The dumps were made with an F32 cache (the goldens' default).
  Session session(*model, int32_t(prompt.size()), 512, Precision::Exact, false, 0, KvTypes::f32());
  std::vector<float> logits;
  session.forward(prompt.data(), int32_t(prompt.size()), true, logits, pool, nullptr, dump);

  size_t n_compared = 0;
  for (const auto& e : g["layer_dump"]) {
    const std::string name = e["name"].get<std::string>();
    const auto ne = e["ne"].get<std::vector<int64_t>>();
    const size_t off = e["offset_floats"].get<size_t>();
    size_t count = 1;
    for (int64_t x : ne) count *= size_t(x);
    auto it = d.tensors.find(name);
    ASSERT_NE(it, d.tensors.end()) << "engine does not produce " << name;
    const std::vector<float>& ours = it->second;
    ASSERT_EQ(ours.size(), count) << name;
    const float* theirs = ref.data() + off;
    if (name.rfind("ffn_moe_topk", 0) == 0) {
      // Expert ids per token, order as ggml produced them: compare as sets.
      const size_t k = size_t(ne[0]);
      size_t mismatched = 0;
      for (size_t t = 0; t < count / k; ++t) {
        std::set<int> a, b;
        for (size_t j = 0; j < k; ++j) a.insert(int(ours[t * k + j])), b.insert(int(theirs[t * k + j]));
        mismatched += a != b;
      }
      if (exact_topk) {
        EXPECT_EQ(mismatched, 0u) << name;
      }
      ++n_compared;
      continue;
    }
    if (name.rfind("ffn_moe_weights", 0) == 0) {
      // Weights follow the (unordered) expert selection: compare sorted per token.
      const size_t k = size_t(ne[1]);
      double max_abs = 0;
      for (size_t t = 0; t < count / k; ++t) {
        std::vector<float> a(ours.begin() + t * k, ours.begin() + (t + 1) * k), b(theirs + t * k, theirs + (t + 1) * k);
        std::sort(a.begin(), a.end());
        std::sort(b.begin(), b.end());
        for (size_t j = 0; j < k; ++j) max_abs = std::max(max_abs, double(std::fabs(a[j] - b[j])));
      }
      EXPECT_LE(max_abs, tol) << name;
      ++n_compared;
      continue;
    }
    double max_abs = 0, max_ref = 0;
    for (size_t i = 0; i < count; ++i) {
      max_abs = std::max(max_abs, double(std::fabs(ours[i] - theirs[i])));
      max_ref = std::max(max_ref, double(std::fabs(theirs[i])));
    }
    // Relative to the tensor's scale: residual streams grow layer by layer.
    EXPECT_LE(max_abs, tol * std::max(1.0, max_ref)) << name << " (max |ref| " << max_ref << ")";
    ++n_compared;
  }
  EXPECT_EQ(n_compared, g["layer_dump"].size());
}

TEST(Layers, TinyAF32FullDump) { compare_layers("tiny-a-f32.gguf", "tiny-a-f32.ids64", 1e-4, true); }
TEST(Layers, TinyBF32) { compare_layers("tiny-b-f32.gguf", "tiny-b-f32.ids64", 1e-4, true); }
TEST(Layers, TinyKF32) { compare_layers("tiny-k-f32.gguf", "tiny-k-f32.ids64", 1e-4, true); }

}  // namespace
