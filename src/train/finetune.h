// The fine-tuning loop behind `step35 finetune`: token windows of a text, evaluation
// (cross-entropy, the loss of the tokens routed to trained experts, expert activation
// skew), and AdamW steps over shuffled batches, deterministic for a seed.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <vector>

#include "model/step35.h"
#include "train/params.h"
#include "train/training_model.h"

namespace step35::train {

// A token stream cut into windows of n_ctx inputs and their n_ctx next tokens (windows
// start every n_ctx tokens, so each token is predicted once).
class TokenWindows {
 public:
  // Throws std::invalid_argument when there are fewer than n_ctx + 1 tokens.
  TokenWindows(std::vector<int32_t> tokens, int32_t n_ctx);
  int64_t size() const { return n_windows_; }
  int32_t n_ctx() const { return n_ctx_; }
  int64_t n_tokens() const { return int64_t(tokens_.size()); }
  void fill(int64_t window, int32_t* inputs, int32_t* targets) const;

 private:
  std::vector<int32_t> tokens_;
  int32_t n_ctx_ = 0;
  int64_t n_windows_ = 0;
};

struct FinetuneSettings {
  TrainGroups groups;
  AdamWConfig adamw;
  int64_t steps = 100;
  int32_t batch = 4;          // windows per step
  uint64_t seed = 1;
  float balance_weight = 0;   // group balance loss at trained routers
  int32_t balance_groups = 0; // 0: one group per expert
  int64_t eval_windows = 0;   // windows an evaluation covers at most (0: all)
  // Products of frozen weights in the forward pass: Native (as `eval`/`serve` compute
  // them) or Exact (as `eval --exact`); see TrainingOptions::precision.
  Precision precision = Precision::Native;
};

struct Evaluation {
  LossStats stats;
  // Expert activation skew (max / mean selections per expert) of each layer with
  // trained experts or a trained router.
  std::map<int32_t, double> skew;
};

struct StepInfo {
  int64_t step = 0, steps = 0;   // step just done (1-based) of steps
  double loss = 0;               // mean cross-entropy of its batch
  double lr = 0, grad_norm = 0;
  double tokens_per_s = 0;       // training tokens per second so far
  double elapsed_s = 0;
};

struct TrainSummary {
  int64_t steps = 0;
  int64_t tokens = 0;
  double seconds = 0;
  double tokens_per_s = 0;
  std::vector<double> losses;  // per step
};

class Finetuner {
 public:
  Finetuner(const Model& m, FinetuneSettings s, ThreadPool& pool);
  ~Finetuner();

  // Resolves "experts=L:topN" with the routing of the base model over `train` and makes
  // the trained tensors (F32 copies of the base slices).
  void prepare(const TokenWindows& train);
  const TrainGroups& groups() const;
  TrainedParams& params();

  // Losses and skew over the windows (at most settings.eval_windows) with the current
  // trained tensors.
  Evaluation evaluate(const TokenWindows& data);
  // settings.steps AdamW steps; on_step after each.
  TrainSummary train(const TokenWindows& data, const std::function<void(const StepInfo&)>& on_step);
  // Bytes of the training buffers (activations and checkpoints) at their largest so far.
  uint64_t activation_bytes() const;

 private:
  const Model& m_;
  FinetuneSettings s_;
  ThreadPool& pool_;
  std::unique_ptr<TrainedParams> params_;
  std::unique_ptr<TrainingModel> model_;
};

// max / mean of per-expert counts (mean over all experts); 0 when there are none.
double activation_skew(const std::vector<int64_t>& counts);

}  // namespace step35::train
