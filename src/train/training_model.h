// The step35 forward pass as a function of the trained tensors, with its backward pass.
//
// Frozen weights stay where the model keeps them (the mapped GGUF, any stored type) and
// are dequantized a block of rows at a time inside each product; the trained tensors are
// F32 (TrainedParams). Memory: the forward pass keeps only each layer's input from the
// lowest trained layer up (a checkpoint, tokens × n_embd floats per layer); the backward
// pass recomputes one layer at a time from its checkpoint, so the intermediates of only
// one layer exist at once. Layers below the lowest trained layer run forward only, and
// that layer's backward stops at its trained tensors (nothing below needs a gradient).
// docs/finetune.md has the memory plan and the backward pass per op.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "model/step35.h"
#include "train/params.h"

namespace step35::train {

// n_seq sequences of n_ctx tokens, each from position 0 (no KV cache, no history).
struct TrainBatch {
  int32_t n_seq = 0, n_ctx = 0;
  std::vector<int32_t> tokens;   // n_seq * n_ctx
  std::vector<int32_t> targets;  // the token each position should predict; -1: none
};

struct LossStats {
  double loss_sum = 0;          // cross-entropy summed over the targets
  int64_t n_targets = 0;
  // Over the targets whose top-k, at a layer with trained experts, includes one of them.
  double routed_loss_sum = 0;
  int64_t n_routed = 0;
  double balance_loss = 0;      // group balance loss summed over the trained routers' layers (unweighted)
  // Per MoE layer: how many (token, slot) selections each expert got (empty for dense layers).
  std::vector<std::vector<int64_t>> expert_counts;
  // With TrainingOptions::record_topk: each MoE layer's chosen experts, tokens × k.
  std::vector<std::vector<int32_t>> topk;

  double loss() const { return n_targets ? loss_sum / double(n_targets) : 0.0; }
  double routed_loss() const { return n_routed ? routed_loss_sum / double(n_routed) : 0.0; }
  void add(const LossStats& o);
};

struct TrainingOptions {
  float balance_weight = 0.0f;  // weight of the group balance loss at trained routers
  int32_t balance_groups = 0;   // G (must divide n_expert); 0: one group per expert
  bool record_topk = false;
  // How products of frozen quantized weights are computed: Exact (F32 activations on the
  // dequantized rows, what `eval --exact` computes; the gradient checks need it) or Native
  // (activations rounded to the weight type's format and the engine's integer kernels, as
  // `eval` and `serve` run the model: several times faster). The backward pass is F32
  // either way (the gradient of the rounding is taken as the identity).
  Precision precision = Precision::Exact;
  // Output-head rows per chunk (bounds the tokens × vocab buffers); 0: as many as fit in
  // 16 M floats (64 MiB) per buffer, so the head's weights are dequantized as few times as
  // memory allows.
  int32_t logits_chunk = 0;
  // Named intermediates of the forward pass, with the engine's names (model/step35.h
  // DumpFn): the two forwards can be diffed tensor by tensor (tests/test_train_model.cpp).
  DumpFn dump;
};

class TrainingModel {
 public:
  // `params` may be null (the frozen model: tests, evaluation of the base).
  TrainingModel(const Model& m, const TrainedParams* params, ThreadPool& pool, TrainingOptions opts = {});
  ~TrainingModel();
  TrainingModel(const TrainingModel&) = delete;
  TrainingModel& operator=(const TrainingModel&) = delete;

  // Loss of the batch. With `grads` (the same tensors as the constructor's params), adds
  // the gradient of mean cross-entropy + balance_weight · Σ balance losses to their grad.
  LossStats run(const TrainBatch& batch, TrainedParams* grads = nullptr);

  // Logits of every position of one sequence (n × n_vocab): what `step35 eval --exact
  // --all-logits` computes, here through the training forward.
  std::vector<float> logits(const std::vector<int32_t>& tokens);

  // Peak bytes of the buffers this object allocated so far (activations, checkpoints).
  uint64_t activation_bytes() const;

 private:
  struct State;
  std::unique_ptr<State> s_;
};

}  // namespace step35::train
