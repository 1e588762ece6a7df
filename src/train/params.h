// What `step35 finetune --train GROUPS` trains, the trained tensors themselves (F32
// copies of slices of the model's weights, with their gradients and AdamW moments), and
// the optimizer.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "tensor/tensor.h"

namespace step35 {
class Model;
}

namespace step35::train {

// The parameter groups of --train, e.g. "experts=12:37,12:101;router=12,13;shared=12".
// "experts=L:topN" names the N experts of layer L that the training data routes to most
// (resolved once the data is known).
struct TrainGroups {
  struct Expert {
    int32_t layer = 0, expert = 0;
    bool operator<(const Expert& o) const { return layer != o.layer ? layer < o.layer : expert < o.expert; }
    bool operator==(const Expert& o) const { return layer == o.layer && expert == o.expert; }
  };
  struct TopExperts {
    int32_t layer = 0, n = 0;
  };
  std::vector<Expert> experts;
  std::vector<TopExperts> top_experts;
  std::vector<int32_t> routers;  // layers whose router matrix is trained
  std::vector<int32_t> shared;   // layers whose shared expert is trained

  // Throws std::invalid_argument with a one-line message for malformed text.
  static TrainGroups parse(const std::string& text);
  // The canonical text (after resolution: experts listed one by one).
  std::string to_string() const;
  bool empty() const { return experts.empty() && top_experts.empty() && routers.empty() && shared.empty(); }
  // Checks layers, expert ids and the presence of what is named against the model
  // (std::invalid_argument naming the group).
  void check(const Model& m) const;
};

// One trained slice in F32: a whole 2-D tensor (router, shared-expert matrix) or one
// expert's matrix of a 3-D expert tensor.
struct TrainedTensor {
  std::string tensor;   // the base GGUF tensor, e.g. "blk.12.ffn_up_exps.weight"
  int32_t layer = 0;
  int32_t expert = -1;  // the matrix of a 3-D tensor, -1: the whole tensor
  int64_t n_in = 0, n_out = 0;
  std::vector<float> value, grad, m, v;  // n_in * n_out each (m, v: AdamW moments)

  WeightMatrix matrix() const;
  size_t size() const { return value.size(); }
};

// The trained tensors of a model, with per-layer lookups for the forward pass.
class TrainedParams {
 public:
  enum Matrix { Gate = 0, Up = 1, Down = 2 };

  // F32 copies of the slices `groups` names (top_experts must be resolved: empty).
  static TrainedParams from_model(const Model& m, const TrainGroups& groups);

  std::vector<TrainedTensor>& tensors() { return tensors_; }
  const std::vector<TrainedTensor>& tensors() const { return tensors_; }
  const TrainGroups& groups() const { return groups_; }

  // Null when not trained.
  const TrainedTensor* expert(int il, int32_t e, Matrix m) const;
  TrainedTensor* expert(int il, int32_t e, Matrix m);
  const TrainedTensor* router(int il) const;
  TrainedTensor* router(int il);
  const TrainedTensor* shared(int il, Matrix m) const;
  TrainedTensor* shared(int il, Matrix m);
  bool layer_has_experts(int il) const;
  bool is_trained_expert(int il, int32_t e) const { return expert(il, e, Gate) != nullptr; }
  // The lowest layer holding a trained tensor (backward passes stop there).
  int lowest_layer() const;
  int64_t n_values() const;
  void zero_grad();

 private:
  int find(int il, int32_t expert, const std::string& suffix) const;
  std::vector<TrainedTensor> tensors_;
  TrainGroups groups_;
  std::map<std::string, size_t> index_;  // "tensor#expert" -> position
};

// AdamW (decoupled weight decay) with a linear warm-up and global-norm gradient clipping.
struct AdamWConfig {
  float lr = 1e-3f;
  float beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f;
  float weight_decay = 0.0f;
  int64_t warmup_steps = 0;
  float clip_norm = 1.0f;  // 0: no clipping
};

class AdamW {
 public:
  explicit AdamW(AdamWConfig c) : c_(c) {}
  // The learning rate of step `step` (0-based): rising linearly over the warm-up.
  float lr_at(int64_t step) const;
  // One update from the tensors' gradients; returns the gradient norm before clipping.
  double step(TrainedParams& p);
  int64_t steps_done() const { return t_; }

 private:
  AdamWConfig c_;
  int64_t t_ = 0;
};

}  // namespace step35::train
