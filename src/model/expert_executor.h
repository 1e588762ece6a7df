// Where a MoE layer's routed experts are computed. The forward pass routes every token
// itself (router, top-k, weights) and asks an ExpertExecutor which experts it should
// compute locally; the executor computes the others elsewhere (another process: expert
// parallelism, src/parallel/) and returns their down-projection rows, which the forward
// pass then combines in the same top-k order as always, so results do not depend on
// where an expert ran.
#pragma once

#include <cstdint>
#include <vector>

#include "tensor/kernels.h"

namespace step35 {

struct WeightSet;

class ExpertExecutor {
 public:
  virtual ~ExpertExecutor() = default;
  // Called at the start of every forward pass with the weights it reads, before any
  // begin(): an executor whose experts live elsewhere hands on replaced experts (model
  // patches) so the other side computes with the same weights from this pass on.
  virtual void sync_weights(const WeightSet& weights) { (void)weights; }
  // True when this process computes expert e of block il itself.
  virtual bool is_local(int il, int32_t e) const = 0;
  // Starts the remote experts of block il. `acts`: all of the batch's normed FFN input
  // rows in the gate/up activation format; expert_tokens[e]: the batch rows routed to
  // expert e, in order. Returns once the work is handed over (the remote side computes
  // while the caller computes its local experts and the shared expert).
  virtual void begin(int il, const kernels::ActRows& acts, const std::vector<std::vector<int32_t>>& expert_tokens,
                     Precision precision) = 0;
  // Waits for the remote experts' down-projection rows: row i of expert e goes to
  // down + (first_row[e] + i) * n_embd.
  virtual void finish(int il, const std::vector<std::vector<int32_t>>& expert_tokens, const int64_t* first_row,
                      float* down) = 0;
};

// Receives each MoE block's per-expert (token, slot) counts of every forward pass
// (`step35 ... --record-experts`).
class ExpertCountObserver {
 public:
  virtual ~ExpertCountObserver() = default;
  virtual void observe(int il, const int32_t* counts, int64_t n_expert) = 0;
};

}  // namespace step35
