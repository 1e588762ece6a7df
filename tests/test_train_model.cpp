// The training forward and backward over whole fixture models (src/train/training_model.h):
// the forward reproduces the engine's forward bit for bit (Exact and Native, at whatever ISA
// level STEP35_ISA picks; the first intermediate that differs is named), and the
// gradients of experts, routers and shared experts equal central finite differences of
// the loss (directional derivatives, F32 with a step sweep, within 1e-3 relative error),
// on F32 models and a quantized one (frozen weights dequantized on the fly).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "model/session.h"
#include "model/step35.h"
#include "exec/thread_pool.h"
#include "support.h"
#include "train/training_model.h"

using namespace step35;
using namespace step35::testing;
using namespace step35::train;

namespace {

std::unique_ptr<Model> load_fixture(const std::string& file) {
  Model::LoadOptions o;
  o.verbose = false;
  o.repack = false;
  return Model::load(fixture_model(file), o);
}

std::vector<int32_t> ids64() {
  return read_json(golden_path("tiny-a-f32.ids64.json"))["prompt_tokens"].get<std::vector<int32_t>>();
}

// Two sequences of n tokens from the ids64 prompt, ids folded into the vocabulary.
TrainBatch make_batch(const Model& m, int32_t n) {
  const auto ids = ids64();
  TrainBatch b;
  b.n_seq = 2;
  b.n_ctx = n;
  for (int32_t s = 0; s < 2; ++s)
    for (int32_t i = 0; i < n; ++i) {
      b.tokens.push_back(ids[size_t(s * 20 + i)] % m.hparams().n_vocab);
      b.targets.push_back(ids[size_t(s * 20 + i + 1)] % m.hparams().n_vocab);
    }
  b.targets[3] = -1;  // a position without a target
  return b;
}

// The named intermediates of one forward pass, in the order they came.
struct Dumps {
  std::vector<std::pair<std::string, std::vector<float>>> tensors;
  DumpFn fn() {
    return [this](const std::string& name, int layer, const float* data, int64_t n) {
      tensors.push_back({name + "." + std::to_string(layer), std::vector<float>(data, data + n)});
    };
  }
  const std::vector<float>* find(const std::string& key) const {
    for (const auto& [k, v] : tensors)
      if (k == key) return &v;
    return nullptr;
  }
};

void check_forward_matches_engine(const std::string& file, double tol, Precision precision = Precision::Exact) {
  auto m = load_fixture(file);
  auto prompt = ids64();
  for (int32_t& t : prompt) t %= m->hparams().n_vocab;
  ThreadPool pool(2);
  TrainingOptions opts;
  opts.precision = precision;
  Dumps train_dumps, engine_dumps;
  opts.dump = train_dumps.fn();
  TrainingModel tm(*m, nullptr, pool, opts);
  const std::vector<float> ours = tm.logits(prompt);
  // The training forward keeps F32 activations throughout: compare with an F32 KV cache.
  Session session(*m, int32_t(prompt.size()), 512, precision, false, 0, KvTypes::f32());
  std::vector<float> ref;
  session.forward(prompt.data(), int32_t(prompt.size()), true, ref, pool, nullptr, engine_dumps.fn());
  // The first intermediate where the two part, named (the training forward dumps a subset
  // of the engine's tensors).
  std::string first_difference;
  for (const auto& [key, mine] : train_dumps.tensors) {
    const std::vector<float>* theirs = engine_dumps.find(key);
    if (!theirs || theirs->size() != mine.size() || first_difference.size()) continue;
    for (size_t i = 0; i < mine.size(); ++i)
      if (mine[i] != (*theirs)[i]) {
        first_difference = key + " [" + std::to_string(i) + "]: " + std::to_string(mine[i]) + " against " +
                           std::to_string((*theirs)[i]);
        break;
      }
  }
  EXPECT_GT(train_dumps.tensors.size(), 10u);
  ASSERT_EQ(ours.size(), ref.size());
  double max_diff = 0, max_abs = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    max_diff = std::max(max_diff, double(std::fabs(ours[i] - ref[i])));
    max_abs = std::max(max_abs, double(std::fabs(ref[i])));
  }
  EXPECT_LE(max_diff, tol) << file << ": largest logit " << max_abs << "; first difference " << first_difference;
  EXPECT_EQ(first_difference, "") << file;
}

// Directional derivative of the batch loss along `dir` (over all trained values) against
// central differences with a step sweep; returns the best relative error.
double directional_error(TrainingModel& tm, TrainedParams& p, const TrainBatch& b, const std::vector<float>& dir,
                         double analytic, float balance_weight) {
  std::vector<std::vector<float>> saved;
  for (auto& t : p.tensors()) saved.push_back(t.value);
  auto loss_at = [&](double h) {
    size_t off = 0;
    for (size_t i = 0; i < p.tensors().size(); ++i) {
      auto& v = p.tensors()[i].value;
      for (size_t j = 0; j < v.size(); ++j) v[j] = float(saved[i][j] + h * dir[off + j]);
      off += v.size();
    }
    const LossStats s = tm.run(b);
    return s.loss() + balance_weight * s.balance_loss;
  };
  double best = INFINITY;
  for (double h : {1e-1, 3e-2, 1e-2, 3e-3, 1e-3}) {
    const double fd = (loss_at(h) - loss_at(-h)) / (2 * h);
    best = std::min(best, std::fabs(fd - analytic) / std::max(std::fabs(analytic), 1e-8));
  }
  for (size_t i = 0; i < p.tensors().size(); ++i) p.tensors()[i].value = saved[i];
  return best;
}

void check_model_gradient(const std::string& file, const std::string& groups, float balance_weight) {
  auto m = load_fixture(file);
  TrainGroups g = TrainGroups::parse(groups);
  TrainedParams p = TrainedParams::from_model(*m, g);
  ThreadPool pool(2);
  TrainingOptions opts;
  opts.balance_weight = balance_weight;
  TrainingModel tm(*m, &p, pool, opts);
  const TrainBatch b = make_batch(*m, 20);
  p.zero_grad();
  const LossStats s0 = tm.run(b, &p);
  ASSERT_GT(s0.n_targets, 0);
  // The gradient reaches every trained tensor that some token uses.
  std::vector<float> grad;
  for (const auto& t : p.tensors()) {
    double n = 0;
    for (float x : t.grad) n += double(x) * x;
    EXPECT_GT(n, 0.0) << t.tensor << " expert " << t.expert << " got no gradient";
    grad.insert(grad.end(), t.grad.begin(), t.grad.end());
  }
  // Directions: the whole gradient (steepest ascent), each tensor's own gradient (so an
  // error in one tensor cannot hide behind the others), and random weights on the 64
  // coordinates with the largest gradient. (Random directions over all values give
  // derivatives near |g|/sqrt(n), where F32 rounding of the loss decides the difference.)
  std::vector<std::pair<std::string, std::vector<float>>> dirs;
  dirs.push_back({"gradient", grad});
  size_t off = 0;
  for (const auto& t : p.tensors()) {
    std::vector<float> d(grad.size(), 0.0f);
    std::copy(t.grad.begin(), t.grad.end(), d.begin() + long(off));
    dirs.push_back({t.tensor + " expert " + std::to_string(t.expert), d});
    off += t.size();
  }
  {
    std::vector<size_t> order(grad.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::partial_sort(order.begin(), order.begin() + 64, order.end(),
                      [&](size_t a, size_t b2) { return std::fabs(grad[a]) > std::fabs(grad[b2]); });
    std::mt19937 rng(7);
    std::normal_distribution<float> nd;
    std::vector<float> d(grad.size(), 0.0f);
    for (size_t i = 0; i < 64; ++i) d[order[i]] = nd(rng);
    dirs.push_back({"random on the largest 64", d});
  }
  for (auto& [name, dir] : dirs) {
    double n = 0;
    for (float x : dir) n += double(x) * x;
    if (n == 0) continue;
    for (float& x : dir) x = float(x / std::sqrt(n));
    double analytic = 0;
    for (size_t i = 0; i < dir.size(); ++i) analytic += double(grad[i]) * dir[i];
    const double err = directional_error(tm, p, b, dir, analytic, balance_weight);
    EXPECT_LE(err, 1e-3) << file << " " << groups << ": direction " << name << ", derivative " << analytic;
  }
}

}  // namespace

TEST(TrainModel, ForwardMatchesEngineExactF32) { check_forward_matches_engine("tiny-a-f32.gguf", 0.0); }
TEST(TrainModel, ForwardMatchesEngineExactOtherShape) { check_forward_matches_engine("tiny-b-f32.gguf", 0.0); }
TEST(TrainModel, ForwardMatchesEngineExactQuantized) { check_forward_matches_engine("tiny-a-q4_k_m.gguf", 0.0); }
// finetune's default: the products of quantized weights on the engine's integer kernels, as
// `eval` and `serve` compute them (Q4_K/Q6_K/Q5_0/Q8_0 weights here, Q8_0 and Q8_K rows).
TEST(TrainModel, ForwardMatchesEngineNativeQuantized) {
  check_forward_matches_engine("tiny-a-q4_k_m.gguf", 0.0, Precision::Native);
  check_forward_matches_engine("tiny-a-q8_0.gguf", 0.0, Precision::Native);
}

TEST(TrainModel, GradientExpertsF32) { check_model_gradient("tiny-a-f32.gguf", "experts=3:2,3:5,6:1", 0.0f); }
TEST(TrainModel, GradientRouterAndSharedF32) { check_model_gradient("tiny-a-f32.gguf", "router=4;shared=5", 0.0f); }
TEST(TrainModel, GradientRouterWithBalanceLoss) { check_model_gradient("tiny-a-f32.gguf", "router=3,5", 0.5f); }
TEST(TrainModel, GradientOtherShape) { check_model_gradient("tiny-b-f32.gguf", "experts=2:3,5:0;router=3;shared=5", 0.0f); }
TEST(TrainModel, GradientQuantized) { check_model_gradient("tiny-a-q4_k_m.gguf", "experts=2:4,7:3;router=6;shared=7", 0.0f); }
